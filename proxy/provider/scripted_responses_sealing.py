"""The ``encrypted_content`` the Responses stand-in issues for its reasoning items, and its check.

A reasoning item's ``encrypted_content`` is ``gAAAAA`` (the look of the real, Fernet-style tokens)
followed by ``base64url(payload || HMAC-SHA256(secret, ["reasoning", id, summary texts, following]))``.
The payload is the JSON of ``following``: the id and call_id of the output item that came right after
the reasoning item in the answer that issued it (null for a reasoning item that came last). The MAC
binds the item's id and its summary texts as issued, so a token the stand-in never issued, one moved to
another item, or one whose item's summary was edited does not open; ``following`` comes back out of a
token that opens, authenticated, for the "required following item" rule.

Tokens are deterministic (no clock, no random IV), so an answer streamed or not seals the same.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Sequence
from typing import Any

PREFIX = "gAAAAA"
MAC_BYTES = 32

Following = tuple[str | None, str | None] | None  # (id, call_id) of the item that must follow, or None


def summary_texts(item: dict[str, Any]) -> list[str]:
    """The texts of a reasoning item's summary parts, in order."""
    return [str(part.get("text", "")) for part in item.get("summary") or [] if isinstance(part, dict)]


class ReasoningSealer:
    """Issues and opens reasoning items' ``encrypted_content`` under one secret."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _mac(self, item_id: str, summary: Sequence[str], following: Following) -> bytes:
        parts = ["reasoning", item_id, list(summary), list(following) if following else None]
        canonical = json.dumps(parts, ensure_ascii=False, separators=(",", ":")).encode()
        return hmac.new(self._secret, canonical, hashlib.sha256).digest()

    def seal(self, item_id: str, summary: Sequence[str], following: Following) -> str:
        """The ``encrypted_content`` of reasoning item ``item_id`` with this summary, followed by ``following``."""
        payload = json.dumps(list(following) if following else None, separators=(",", ":")).encode()
        token = base64.urlsafe_b64encode(payload + self._mac(item_id, summary, following)).decode()
        return PREFIX + token

    def open(self, token: Any, item_id: str, summary: Sequence[str]) -> tuple[bool, Following]:
        """Whether ``token`` is one this sealer issued for this item and summary, and what must follow it."""
        if not isinstance(token, str) or not token.startswith(PREFIX):
            return False, None
        try:
            raw = base64.urlsafe_b64decode(token[len(PREFIX) :].encode())
            found = json.loads(raw[:-MAC_BYTES]) if len(raw) > MAC_BYTES else "not a token"
        except (binascii.Error, ValueError):
            return False, None
        valid_shape = found is None or (
            isinstance(found, list) and len(found) == 2 and all(part is None or isinstance(part, str) for part in found)
        )
        if not valid_shape:
            return False, None
        following: Following = (found[0], found[1]) if found else None
        return hmac.compare_digest(raw[-MAC_BYTES:], self._mac(item_id, summary, following)), following
