"""Stored responses (``previous_response_id``, ``GET /v1/responses/{id}``).

They live in the session store's state channels (session-wide), so there is no extra table and no
extra database. A response id embeds its session's context id (``resp_<24 hex nonce><context id>``),
which is how a retrieval without any session header finds the right session; the record names the
chain head of the stored transcript *including* the assistant answer, so the chain a
``previous_response_id`` continues is exactly the one that response ended. A response created with
``store: false`` gets no record: it is not retrievable and cannot be continued by id, although the
transcript the assembly needs is stored as for any request.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

from proxy.session.store import SessionStore

SESSION_WIDE = ""
_RESPONSE_ID = re.compile(r"resp_([0-9a-f]{24})([A-Za-z0-9._-]{1,128})")


@dataclass(frozen=True)
class ResponseRecord:
    """A stored response: the chain head it ended, whether its first message is ``instructions``, the object."""

    context_id: str
    head_hash: str
    has_instructions: bool
    response: dict[str, Any]


def new_response_id(context_id: str) -> str:
    """A fresh response id for a response of ``context_id``."""
    return f"resp_{secrets.token_hex(12)}{context_id}"


class ResponseRecords:
    """Reads and writes response records in the session store (through its port; no lock is needed)."""

    def __init__(self, store: SessionStore) -> None:
        self._store = store

    async def put(self, response_id: str, record: ResponseRecord) -> None:
        """Remember a response (its session must exist: the turn reconciled it)."""
        value = {"head": record.head_hash, "instructions": record.has_instructions, "response": record.response}
        await self._store.put_state(record.context_id, SESSION_WIDE, _channel(response_id), value)

    async def get(self, response_id: str) -> ResponseRecord | None:
        """The stored response, or ``None`` (unknown, malformed, or created with ``store: false``)."""
        match = _RESPONSE_ID.fullmatch(response_id)
        if match is None:
            return None
        context_id = match.group(2)
        value = await self._store.state(context_id, SESSION_WIDE, _channel(response_id))
        if not isinstance(value, dict):
            return None
        return ResponseRecord(context_id, str(value["head"]), bool(value["instructions"]), dict(value["response"]))


def _channel(response_id: str) -> str:
    return f"responses.response.{response_id}"
