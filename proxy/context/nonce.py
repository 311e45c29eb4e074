"""The per-session framing nonce: what tells the proxy's own wrappers from text that imitates them.

Hidden ``<context ...>`` messages and checkpoint messages are user messages, and a tool output or a
user message can hold the same characters. Every wrapper the proxy writes therefore carries
``nonce="<16 hex>"``: HMAC-SHA256 of the session's context id under a deployment secret, cut to 64
bits. Text written before it was shown the nonce cannot carry it, and the nonce is a pure function of
(secret, context id), so it is the same on every turn, after a restart and on every replica: prompt
caches, cassettes and replays stay byte-stable. The secret is the store's (``SessionStore.secret``),
or ``Settings.framing_secret`` when a test or an example pins it.
"""

from __future__ import annotations

import hashlib
import hmac

NONCE_CHARS = 16
NONCE_PATTERN = rf"[0-9a-f]{{{NONCE_CHARS}}}"
SECRET_NAME = "framing"  # the store's name for the secret the nonces are derived from


def session_nonce(secret: bytes, context_id: str) -> str:
    """The framing nonce of the session ``context_id`` under ``secret``."""
    if not secret:
        raise ValueError("the framing secret is empty")
    digest = hmac.new(secret, context_id.encode("utf-8"), hashlib.sha256).hexdigest()
    return digest[:NONCE_CHARS]
