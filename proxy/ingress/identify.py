"""Which session (context id) and agent scope a request belongs to.

Clients never have to change their code, so the id comes from whatever they already send: an explicit
session header, a vendor's session header or body field, else a fingerprint of how the conversation
starts (its first system and first user message), which stays the same while the history grows. The
fingerprint reads those messages' canonical content (``proxy/kernel/canonical.py``), so a client that
marks them for prompt caching on one turn and not the next (the mark follows the newest message) or wraps
their text in a content part to mark it stays in one session.
Runs that start identically share a fingerprint; they are separate branches of that session, each
with its own lock, state and trace chain (see ``proxy/runtime/branch.py``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from proxy.kernel.canonical import canonical_message, stable_json
from proxy.kernel.errors import InvalidRequest
from proxy.kernel.tenancy import ADMIN, Principal
from proxy.runtime.session_identity import SCOPES, Scope, SessionIdentity

_SAFE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_VENDOR_SESSION_HEADER = re.compile(r"x-[a-z0-9]+(?:-[a-z0-9]+)*-session-id")


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
