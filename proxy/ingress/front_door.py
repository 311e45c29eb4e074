"""What every ingress shares on its way to the turn service: authentication, the mode, the route, the
session, and errors that name the session.

An ingress translates its wire format; everything else a request meets before and around its turn is
here, once, so the three APIs agree on it: the same 404 for an unknown model, the same session rules,
the same ``x-context-id`` / ``x-context-mode`` headers on an error once the session is known, the same
drain on shutdown, and the same 503 while the service is still starting.

Which session (context id) and agent scope a request belongs to (``identify``): clients never have to
change their code, so the id comes from whatever they already send: an explicit session header, a
vendor's session header or body field, else a fingerprint of how the conversation starts (its first
system and first user message), which stays the same while the history grows. The fingerprint reads
those messages' canonical content (``proxy/kernel/canonical.py``), so a client that marks them for
prompt caching on one turn and not the next (the mark follows the newest message) or wraps their text in
a content part to mark it stays in one session. Runs that start identically share a fingerprint; they
are separate branches of that session, each with its own lock, state and trace chain (see
``proxy/runtime/branch.py``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from starlette.requests import Request

from proxy.edge.request_reader import RequestReader
from proxy.ingress.tenants import Tenants
from proxy.kernel.canonical import canonical_message, stable_json
from proxy.kernel.config import Mode, ModelRoute, Settings
from proxy.kernel.errors import InvalidRequest, ModelNotFound, ProxyError
from proxy.kernel.tenancy import ADMIN, Principal
from proxy.process.drain import Drain, ShuttingDown
from proxy.runtime.answers import TurnResult
from proxy.runtime.native import NativeRequest
from proxy.runtime.service import TurnService
from proxy.runtime.session_identity import SCOPES, Scope, SessionIdentity

_MODES = ("dynamic", "shadow", "legacy")
_SAFE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_VENDOR_SESSION_HEADER = re.compile(r"x-[a-z0-9]+(?:-[a-z0-9]+)*-session-id")


class FrontDoor:
    """The shared steps of the three ingresses; ``service`` returns the turn service once the app has
    started (before that it raises the 503 ``starting``)."""

    def __init__(
        self,
        settings: Settings,
        service: Callable[[], TurnService],
        reader: RequestReader,
        drain: Drain,
        tenants: Tenants,
    ):
        self.settings = settings
        self.reader = reader
        self.drain = drain
        self.tenants = tenants
        self._service = service

    @property
    def service(self) -> TurnService:
        """The turn service, asked for where a request needs it (after its own checks, so a bad request
        still gets its 4xx while the app starts)."""
        return self._service()

    async def authorize(self, request: Request) -> Principal:
        """The first step of every request: refused with 503 ``server_shutting_down`` once the drain has
        begun (the client retries on another replica); then who sent it (the master key's administrator or a
        team's key), 401 for anyone else."""
        if self.drain.draining:
            raise ShuttingDown("The proxy is shutting down and takes no new requests; retry on another replica.")
        return await self.tenants.principal(request.headers, request.client.host if request.client else None)

    def mode(self, request: Request) -> Mode:
        """The operator's mode, or shadow/legacy chosen per request when the operator allows it (debugging)."""
        asked = request.headers.get("x-context-mode", "").strip().lower()
        if not asked or not self.settings.allow_mode_header:
            return self.settings.mode
        if asked not in _MODES:
            raise InvalidRequest(
                f"x-context-mode {asked!r} is not one of dynamic, shadow, legacy.", param="x-context-mode"
            )
        return asked  # type: ignore[return-value]  # one of the three, checked above

    def route(self, model: str, principal: Principal) -> ModelRoute:
        """The route a client's model name names; 404 ``model_not_found`` for one that is not configured,
        403 for one the key may not use."""
        route = self.settings.route(model)
        if route is None:
            raise ModelNotFound(f"The model {model!r} does not exist or you do not have access to it.", param="model")
        self.tenants.allow_model(principal, route)
        return route

    def admit(self, principal: Principal) -> None:
        """Count a request that will run a turn against its key's rate limits: 429 with ``retry-after`` when
        they are used up, before the turn stores anything or calls the provider."""
        self.tenants.admit(principal)

    def identify(self, headers: Mapping[str, str], body: Mapping[str, Any], principal: Principal) -> SessionIdentity:
        """The session and scope of a request (``identify``), within the principal's team."""
        return identify(headers, body, principal)

    async def run(
        self,
        body: dict[str, Any],
        identity: SessionIdentity,
        route: ModelRoute,
        headers: Mapping[str, str],
        mode: Mode,
        *,
        ingress: Mapping[str, Any] | None = None,
        digests: Sequence[bytes] | None = None,
        native: NativeRequest | None = None,
        provider_fields: Mapping[str, Any] | None = None,
    ) -> TurnResult:
        """One turn of the canonical chat ``body``, bounded by the shutdown drain; its errors name the session.
        ``native``: the provider is sent the client's own API (``proxy/runtime/native.py``);
        ``provider_fields``: arguments the ingress itself sets for litellm (not judged as the client's)."""
        with naming_session(identity, mode):
            async with self.drain.bounded():
                return await self.service.run(
                    body,
                    identity,
                    route,
                    headers,
                    mode,
                    ingress=ingress,
                    digests=digests,
                    native=native,
                    provider_fields=provider_fields,
                )


@contextmanager
def naming_session(identity: SessionIdentity, mode: str) -> Iterator[None]:
    """Within the block, a ``ProxyError`` carries the session's headers: a client can find its trace."""
    try:
        yield
    except ProxyError as exc:
        exc.headers.update(context_headers(identity, mode))
        raise


def context_headers(identity: SessionIdentity, mode: str) -> dict[str, str]:
    """``x-context-id`` and ``x-context-mode``, sent with every answer once the session is known."""
    return {"x-context-id": identity.context_id, "x-context-mode": mode}


def identify(headers: Mapping[str, str], body: Mapping[str, Any], principal: Principal = ADMIN) -> SessionIdentity:
    """Resolve the session of a validated request within the principal's team (a team's key names its
    sessions ``team.<team>.<id>``, ``proxy/kernel/tenancy.py``); raises ``InvalidRequest`` for a bad scope."""
    scope = _scope(headers)
    given, source = _given_session_id(headers, body)
    if given is not None:
        return SessionIdentity(context_id=principal.context_id(_folder_safe(given)), source=source, scope=scope)
    fingerprint = _fingerprint(body.get("messages") or [])
    return SessionIdentity(context_id=principal.context_id(fingerprint), source="fingerprint", scope=scope)


def _scope(headers: Mapping[str, str]) -> Scope:
    raw = (headers.get("x-agent-scope") or "main").strip().lower()
    for scope in SCOPES:
        if raw == scope:
            return scope
    raise InvalidRequest(
        f"x-agent-scope {raw!r} is not one of {', '.join(SCOPES)}.", param="x-agent-scope", code="invalid_scope"
    )


def _given_session_id(headers: Mapping[str, str], body: Mapping[str, Any]) -> tuple[str | None, str]:
    lowered = {name.lower(): value for name, value in headers.items()}
    for name in ("x-session-id", "x-litellm-session-id"):
        if lowered.get(name, "").strip():
            return lowered[name].strip(), f"header:{name}"
    for name in sorted(lowered):
        if _VENDOR_SESSION_HEADER.fullmatch(name) and lowered[name].strip():
            return lowered[name].strip(), f"header:{name}"
    # Codex CLI sends its session UUID as `session-id` and `thread-id` (and as `prompt_cache_key`).
    for name in ("session-id", "thread-id"):
        if lowered.get(name, "").strip():
            return lowered[name].strip(), f"header:{name}"
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping):
        for key in ("session_id", "litellm_session_id"):
            value = metadata.get(key)
            if isinstance(value, str | int) and str(value).strip():
                return str(value).strip(), f"body:metadata.{key}"
    for key in ("litellm_session_id", "prompt_cache_key"):
        value = body.get(key)
        if isinstance(value, str | int) and str(value).strip():
            return str(value).strip(), f"body:{key}"
    return None, ""


def _folder_safe(session_id: str) -> str:
    """The id itself when it is safe as a folder name, else a stable hash of it."""
    if _SAFE_ID.fullmatch(session_id) and session_id not in (".", ".."):
        return session_id
    return "sid-" + hashlib.sha256(session_id.encode()).hexdigest()[:32]


def _fingerprint(messages: list[Any]) -> str:
    first_system = next(
        (m for m in messages if isinstance(m, Mapping) and m.get("role") in ("system", "developer")), None
    )
    first_user = next((m for m in messages if isinstance(m, Mapping) and m.get("role") == "user"), None)
    material = stable_json([_content(first_system), _content(first_user)])
    return "fp-" + hashlib.sha256(material.encode()).hexdigest()[:32]


def _content(message: Mapping[str, Any] | None) -> Any:
    """What the model reads of ``message``: its canonical content, without cache marks."""
    return None if message is None else canonical_message(message).get("content")
