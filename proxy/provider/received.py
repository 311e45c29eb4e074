"""What a strict stand-in provider received: one request as a test reads it back."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request


@dataclass(frozen=True)
class Received:
    """One request as it reached a stand-in: its path, its headers (names lower-cased) and its JSON body.

    ``body`` is ``{}`` when the bytes were not a JSON object; ``raw`` keeps them as sent either way.
    """

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    raw: bytes

    def header(self, name: str) -> str | None:
        """The value of header ``name`` (any case), or None when it was not sent."""
        return self.headers.get(name.lower())


async def receive(request: Request) -> tuple[Received, str | None]:
    """The request as a ``Received``, and why its body is not a JSON object (None when it is)."""
    raw = await request.body()
    headers = {key.lower(): value for key, value in request.headers.items()}
    try:
        body = json.loads(raw)
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError both
        return Received(request.url.path, headers, {}, raw), str(exc)
    if not isinstance(body, dict):
        return Received(request.url.path, headers, {}, raw), "the body is not a JSON object"
    return Received(request.url.path, headers, body, raw), None
