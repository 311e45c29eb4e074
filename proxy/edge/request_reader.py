"""Reading a request's body: the size limit, then the decode, off the event loop when the body is large.

Every route that takes a JSON body (chat completions, responses, messages, count_tokens) reads it here,
so each gets the same limit and the same offload: decoding (and, for the chat route, validating) a body
of many thousands of messages is tens of milliseconds to seconds of CPU, which on the event loop would
stall every other session's request.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from starlette.requests import Request

from proxy.edge.request_body import decode_body
from proxy.kernel.errors import RequestTooLarge

# Bodies above this size are decoded on a worker thread. Below it the decode is well under a
# millisecond with orjson, less than the hop to a thread costs.
OFFLOAD_BYTES = 256 * 1024
_WORKERS = 2  # bounds how many large bodies are decoded at once (and the memory they take)

T = TypeVar("T")


class RequestReader:
    """Reads bodies up to ``limit`` bytes; owns the worker threads that decode the large ones."""

    def __init__(self, limit: int, on_body: Callable[[int], None] | None = None) -> None:
        self.limit = limit
        self._on_body = on_body  # told each body's size (``proxy/process/heap_trim.py``: large ones leave freed memory)
        self._pool = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="request-parse")

    async def json(self, request: Request) -> dict[str, Any]:
        """The body as a JSON object (``InvalidRequest`` otherwise)."""
        return await self.parsed(request, _as_is)

    async def parsed(self, request: Request, then: Callable[[dict[str, Any]], T]) -> T:
        """``then`` of the decoded body, both on a worker thread for a large body (``then`` must be pure CPU)."""
        return await self.decoded(request, functools.partial(_decode_then, then=then))

    async def decoded(self, request: Request, decode: Callable[[bytes], T]) -> T:
        """``decode`` of the raw body, on a worker thread for a large body (``decode`` must be pure CPU and
        decode with :func:`~proxy.edge.request_body.decode_body`)."""
        raw = await self.raw(request)
        if len(raw) > OFFLOAD_BYTES:
            return await asyncio.get_running_loop().run_in_executor(self._pool, decode, raw)
        return decode(raw)

    async def raw(self, request: Request) -> bytes:
        """The raw body, refusing an oversized one before reading it whole."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            raise RequestTooLarge(f"The request body ({declared} bytes) exceeds the limit of {self.limit} bytes.")
        pieces: list[bytes] = []
        size = 0
        async for piece in request.stream():
            pieces.append(piece)
            size += len(piece)
            if size > self.limit:
                raise RequestTooLarge(f"The request body exceeds the limit of {self.limit} bytes.")
        if self._on_body is not None:
            self._on_body(size)
        return b"".join(pieces)  # one copy of a megabyte body, not a growing buffer and a copy of it

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _decode_then(raw: bytes, then: Callable[[dict[str, Any]], T]) -> T:
    return then(decode_body(raw))


def _as_is(body: dict[str, Any]) -> dict[str, Any]:
    return body
