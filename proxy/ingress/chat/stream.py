"""A chat answer as server-sent events: chunks, ``data: [DONE]``, and an ``error`` event before it when
the stream could not be completed.

The stream owns its chunk iterator and closes it on every way out, so the provider call ends and the
session's lock is released even when the response never started or its task was cancelled (the client
went away, the server stopped).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy.edge.answering import internal_error_body
from proxy.kernel.errors import ProxyError
from proxy.kernel.jsonio import dumps
from proxy.process.drain import Drain

log = logging.getLogger("context_proxy")


class EventStream(StreamingResponse):
    """A server-sent-events answer that owns its chunk stream: closed on every way out; ``after`` runs
    once the lock is released (the next turn of the session may already wait)."""

    def __init__(
        self,
        chunks: AsyncIterator[dict[str, Any]],
        drain: Drain,
        headers: dict[str, str],
        after: Callable[[], Awaitable[None]],
    ) -> None:
        self._chunks = chunks
        self._after = after
        super().__init__(_sse(chunks, drain), media_type="text/event-stream", headers=headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):  # even inside a cancelled task: the lock must go
                await _close(self.body_iterator)
                await _close(self._chunks)
        await self._after()


async def _close(iterator: Any) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()


async def _sse(chunks: AsyncIterator[dict[str, Any]], drain: Drain) -> AsyncIterator[bytes]:
    """Server-sent events ending in ``[DONE]``; a failure mid-stream, whatever it is, sends an ``error``
    event first (OpenAI's error shape, which the SDKs raise as an error) instead of cutting the stream."""
    try:
        while True:
            try:
                async with drain.bounded():
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                break
            yield _event(chunk)
    except ProxyError as exc:
        yield b"event: error\n" + _event(exc.body())
    except Exception:
        log.exception("unexpected error while streaming an answer")
        yield b"event: error\n" + _event(internal_error_body())
    yield b"data: [DONE]\n\n"


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + dumps(data) + b"\n\n"  # a lone surrogate from upstream is escaped: the JSON stays valid
