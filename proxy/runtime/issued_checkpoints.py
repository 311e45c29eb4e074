"""The checkpoints a remote compaction issued, named by opaque tokens the client sends back.

A compaction token (``cpx1.<32 hex nonce>.<context id>``) names a checkpoint the proxy wrote when a
client asked it to compact (``TurnService.compact``). It lives in the session store's state channels
(session-wide, no table of its own). The nonce is random (128 bits) and the record is looked up only in
the session the token names, so a token cannot be guessed and means nothing to another deployment.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

from proxy.context.checkpoint import Checkpoint
from proxy.session.store import SessionStore

SESSION_WIDE = ""
_TOKEN = re.compile(r"cpx1\.([0-9a-f]{32})\.([A-Za-z0-9._-]{1,128})")


@dataclass(frozen=True)
class IssuedCheckpoint:
    """A checkpoint this proxy issued, and the message that stands in its place in a client's history."""

    checkpoint: Checkpoint
    message: dict[str, Any]


async def issue(store: SessionStore, context_id: str, checkpoint: Checkpoint) -> str:
    """Store a checkpoint written for a remote compaction; returns the opaque token that names it."""
    nonce = secrets.token_hex(16)
    await store.put_state(context_id, SESSION_WIDE, _channel(nonce), checkpoint.to_record())
    return f"cpx1.{nonce}.{context_id}"


async def issued(store: SessionStore, token: str) -> Checkpoint | None:
    """The checkpoint a token names, or ``None`` for a token this proxy did not issue."""
    match = _TOKEN.fullmatch(token)
    if match is None:
        return None
    record = await store.state(match.group(2), SESSION_WIDE, _channel(match.group(1)))
    if not isinstance(record, dict):
        return None
    try:
        return Checkpoint.from_record(record)
    except (KeyError, TypeError, ValueError):
        return None


def token_context(token: str) -> str:
    """The context id a compaction token names (the token was issued by :func:`issue`)."""
    match = _TOKEN.fullmatch(token)
    if match is None:
        raise ValueError(f"not a compaction token: {token!r}")
    return match.group(2)


def _channel(nonce: str) -> str:
    return f"responses.compaction.{nonce}"
