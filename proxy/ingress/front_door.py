"""What every ingress shares on its way to the turn service: authentication, the mode, the route, the
session, and errors that name the session.

An ingress translates its wire format; everything else a request meets before and around its turn is
here, once, so the three APIs agree on it: the same 404 for an unknown model, the same session rules,
the same ``x-context-id`` / ``x-context-mode`` headers on an error once the session is known, the same
drain on shutdown, and the same 503 while the service is still starting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from starlette.requests import Request

from proxy.edge.request_reader import RequestReader
from proxy.ingress.identify import identify
from proxy.ingress.tenants import Tenants
from proxy.kernel.config import Mode, ModelRoute, Settings
from proxy.kernel.errors import InvalidRequest, ModelNotFound, ProxyError
from proxy.kernel.tenancy import Principal
from proxy.process.drain import Drain, ShuttingDown
from proxy.runtime.answers import TurnResult
from proxy.runtime.native import NativeRequest
from proxy.runtime.service import TurnService
from proxy.runtime.session_identity import SessionIdentity

_MODES = ("dynamic", "shadow", "legacy")


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
        """The session and scope of a request (``proxy/ingress/identify.py``), within the principal's team."""
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
