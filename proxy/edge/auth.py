"""Authentication at the edge: the master key, as ``Authorization: Bearer <key>`` or ``x-api-key: <key>``."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from proxy.kernel.errors import AuthenticationFailed


def authorize(headers: Mapping[str, str], master_key: str | None) -> None:
    """Pass a request carrying the master key (any request when none is set); ``AuthenticationFailed`` else."""
    if master_key is None:
        return
    key = master_key.encode()
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key):
        return
    # Anthropic clients send their key as x-api-key (DESIGN.md's interface accepts both).
    if hmac.compare_digest(headers.get("x-api-key", "").strip().encode(), key):
        return
    raise AuthenticationFailed("Missing or invalid API key: send Authorization: Bearer <key> or x-api-key: <key>.")
