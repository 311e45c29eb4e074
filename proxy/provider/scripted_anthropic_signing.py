"""Signatures the Anthropic stand-in puts on its thinking blocks, and their check when a block comes back.

A ``thinking`` block's ``signature`` and a ``redacted_thinking`` block's ``data`` are HMAC-SHA256 tokens
under a secret only the stand-in holds, so a client can neither forge nor edit one:

- ``signature = base64(0x01 || k || HMAC(secret, ["thinking", text, bound]))``
- ``data = base64(0x02 || k || nonce || HMAC(secret, ["redacted_thinking", nonce, bound]))``, where the
  16-byte nonce is derived from the scripted hidden text, so two redacted blocks can differ.

``bound`` is the list of the ``tool_use``/``server_tool_use`` ids that followed the block in the answer
that issued it, and ``k`` (one byte, inside the token and so authenticated) is its length. When the
block comes back, ``bound`` is read off the request: the first ``k`` tool ids after the block in its
message. So tampered text, an emptied or made-up signature, a block from another stand-in (another
secret), a block moved to a message with other tool calls, and a block moved after its own tool calls
all fail; a block issued with no tool calls after it only verifies where none follow. Omitting other
thinking blocks of the same message (as clients may) changes nothing. What it cannot see: a block moved,
alone, between two assistant messages that hold no tool calls.

Tokens are deterministic (no clock, no random nonce): the same answer signs the same, streamed or not,
which keeps recorded cassettes byte-identical between runs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Sequence
from typing import Any

THINKING_TAG = 0x01
REDACTED_TAG = 0x02
TOOL_CALL_TYPES = frozenset({"tool_use", "server_tool_use"})
MAC_BYTES = 32
NONCE_BYTES = 16


def tool_ids_after(blocks: Sequence[Any], index: int) -> list[str]:
    """The ids of the tool calls (client or server) that come after ``blocks[index]``, in order."""
    return [
        str(block.get("id"))
        for block in blocks[index + 1 :]
        if isinstance(block, dict) and block.get("type") in TOOL_CALL_TYPES
    ]


class ThinkingSigner:
    """Issues and checks the stand-in's thinking signatures and redacted-thinking data under one secret."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _mac(self, parts: list[Any]) -> bytes:
        canonical = json.dumps(parts, ensure_ascii=False, separators=(",", ":")).encode()
        return hmac.new(self._secret, canonical, hashlib.sha256).digest()

    def sign_thinking(self, text: str, bound: Sequence[str]) -> str:
        """The signature of a thinking block with this text, followed by tool calls with these ids."""
        mac = self._mac(["thinking", text, list(bound)])
        return base64.b64encode(bytes([THINKING_TAG, len(bound)]) + mac).decode()

    def redacted_data(self, hidden: str, bound: Sequence[str]) -> str:
        """The ``data`` of a redacted_thinking block standing for ``hidden``, followed by these tool calls."""
        nonce = hashlib.sha256(hidden.encode()).digest()[:NONCE_BYTES]
        mac = self._mac(["redacted_thinking", nonce.hex(), list(bound)])
        return base64.b64encode(bytes([REDACTED_TAG, len(bound)]) + nonce + mac).decode()

    def verify(self, block: dict[str, Any], following: Sequence[str]) -> bool:
        """Whether a thinking or redacted_thinking block is one this signer issued for where it now stands.

        ``following`` is the ids of the tool calls after the block in the message that holds it now.
        """
        if block.get("type") == "thinking":
            token, tag, nonce_bytes = block.get("signature"), THINKING_TAG, 0
        else:
            token, tag, nonce_bytes = block.get("data"), REDACTED_TAG, NONCE_BYTES
        if not isinstance(token, str):
            return False
        try:
            raw = base64.b64decode(token, validate=True)
        except (binascii.Error, ValueError):
            return False
        if len(raw) != 2 + nonce_bytes + MAC_BYTES or raw[0] != tag:
            return False
        count = raw[1]
        if count > len(following) or (count == 0 and following):
            return False  # issued before other tool calls than the ones that follow it here
        bound = list(following[:count])
        if tag == THINKING_TAG:
            expected = self._mac(["thinking", block.get("thinking"), bound])
        else:
            expected = self._mac(["redacted_thinking", raw[2 : 2 + nonce_bytes].hex(), bound])
        return hmac.compare_digest(raw[2 + nonce_bytes :], expected)
