"""Shutdown with a bounded grace: requests in flight may finish, then whatever is still open ends cleanly.

uvicorn, told to stop (SIGTERM), stops accepting connections and waits for the open ones, without
a bound unless ``timeout_graceful_shutdown`` is set, and then cancels them: a stream is cut without
its end. Here the server starts a ``Drain`` first; the app bounds every wait on the provider by it,
so when the grace is over a stream still open ends with an error event and ``[DONE]``, a pending
answer becomes a 503, and each session's lock is released on the way out. uvicorn's own timeout is
only the backstop for anything the app does not bound.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from proxy.kernel.errors import ProxyError

BACKSTOP_SECONDS = 5.0  # after the grace: for the error events to go out before uvicorn cancels tasks


class ShuttingDown(ProxyError):
    """The proxy stopped before the answer was complete (503); the client may retry elsewhere."""

    status = 503
    type = "api_error"
    code = "server_shutting_down"


class Drain:
    """The grace period of a shutdown, shared by the server (which starts it) and the app (which obeys it)."""

    def __init__(self, grace_seconds: float) -> None:
        self.grace_seconds = grace_seconds
        self._deadline: float | None = None  # loop time at which the grace is over; None while serving
        self._scopes: set[asyncio.Timeout] = set()

    @property
    def draining(self) -> bool:
        """True once shutdown has begun."""
        return self._deadline is not None

    def begin(self) -> None:
        """Start the grace period; every wait bounded by ``bounded`` ends when it is over."""
        if self._deadline is not None:
            return
        self._deadline = asyncio.get_running_loop().time() + self.grace_seconds
        for scope in self._scopes:
            scope.reschedule(self._deadline)

    @asynccontextmanager
    async def bounded(self) -> AsyncIterator[None]:
        """Run the block until it is done or the grace is over; ``ShuttingDown`` in the second case."""
        scope = asyncio.timeout_at(self._deadline)
        try:
            async with scope:
                self._scopes.add(scope)
                try:
                    yield
                finally:
                    self._scopes.discard(scope)
        except TimeoutError:
            if not scope.expired():
                raise  # someone else's timeout
            raise ShuttingDown("The proxy is shutting down; the answer could not be completed.") from None


class DrainingServer(uvicorn.Server):
    """uvicorn's server, starting the app's drain before it waits for open connections."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Begin the grace period, then shut down as uvicorn does (bounded by its backstop timeout)."""
        self.drain.begin()
        await super().shutdown(sockets)


# Idle client connections are kept longer than HTTP clients keep them pooled (httpx and the OpenAI and
# Anthropic SDKs: 5 s; aiohttp: 15 s). With uvicorn's default of 5 s, a client that sends just as the
# server closes an idle connection sees it reset; an agent idle for a few seconds between calls is the
# common case, not the edge.
KEEP_ALIVE_SECONDS = 75


def server_for(app: Any, drain: Drain, host: str, port: int, **options: Any) -> DrainingServer:
    """A uvicorn server for ``app`` whose shutdown drains for ``drain.grace_seconds`` plus the backstop."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        timeout_graceful_shutdown=int(drain.grace_seconds + BACKSTOP_SECONDS),
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        **options,
    )
    return DrainingServer(config, drain)
