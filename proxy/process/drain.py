"""Shutdown with a bounded grace: requests in flight may finish, then whatever is still open ends cleanly.

uvicorn, told to stop (SIGTERM), closes its listening socket at once (a client arriving during the
drain is refused, and a load balancer learns nothing from the readiness check), waits for the open
connections, without a bound unless ``timeout_graceful_shutdown`` is set, then cancels them (a stream
is cut without its end), and finally kills its own process with the signal again (exit -15). Here a
SIGTERM starts a ``Drain`` instead, while the server goes on listening: the readiness check answers
503 ``draining`` so load balancers fail over, what still arrives gets 503 ``server_shutting_down`` in
its API's shape, and the requests in flight go on. The app bounds every wait on the provider by the
drain, so when the grace is over a stream still open ends with an error event and ``[DONE]``, a
pending answer becomes a 503, and each session's lock is released on the way out. Once nothing is in
flight (or the grace is over) uvicorn shuts down as usual and the process exits 0. uvicorn's own
timeout is only the backstop for anything the app does not bound.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import FrameType
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

    @property
    def over(self) -> bool:
        """True once the grace period has run out (call on the event loop)."""
        return self._deadline is not None and asyncio.get_running_loop().time() >= self._deadline

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
        self._drain_asked = False  # set by the signal handler, acted on by the next tick (on the loop)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """SIGTERM starts the drain, the server still listening (``on_tick`` stops it when the drain is
        done); and it is not raised again on the way out, so a drained process exits 0. A second signal,
        or SIGINT (Ctrl-C), is uvicorn's own."""
        if sig == signal.SIGTERM and not self._drain_asked:
            self._drain_asked = True
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's tick; while draining, stop once no request is in flight or the grace is over."""
        if self._drain_asked and not self.drain.draining:
            self.drain.begin()
        if self.drain.draining and not self.should_exit:
            await super().on_tick(counter)  # the date header, the notify callback
            return self.drain.over or not self.server_state.tasks
        return await super().on_tick(counter)

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
