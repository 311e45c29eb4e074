"""Authentication at the edge: the key a request carries, as ``Authorization: Bearer <key>`` or ``x-api-key: <key>``.

Whose key it is (the master key, a team's virtual key) is decided by ``proxy/ingress/tenants.py``.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping


def presented_key(headers: Mapping[str, str]) -> str:
    """The key a request carries ("" if none); Anthropic clients send theirs as ``x-api-key``."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("x-api-key", "").strip()


def is_key(given: str, key: str | None) -> bool:
    """Is ``given`` the key ``key`` (compared in constant time; never when ``key`` is unset)?"""
    return key is not None and bool(given) and hmac.compare_digest(given.encode(), key.encode())
