"""What follows a sent answer, on every ingress that remembers resent requests: the turn's objects freed
after the client has its answer rather than before, a young collection of what outlived the turn
(``proxy/process/startup_gc.py``), then the copies of the messages the session's next turn will take
(``ResentRequests.make_spares``)."""

from __future__ import annotations

import anyio
from starlette.background import BackgroundTask

from proxy.edge.resent_requests import ResentRequests
from proxy.process.startup_gc import collect_after_turn


class FreedAfter(BackgroundTask):
    """Runs once a whole answer is sent, holding ``held`` until then: a 1,000-message turn's objects (the
    decoded body, the turn's memos) take a millisecond or two to free, after the client has its answer
    rather than before; then what outlived the turn may be collected, and the next turn's copies made."""

    def __init__(self, held: tuple[object, ...], resent: ResentRequests) -> None:
        super().__init__(collect_after_turn)
        self._held: tuple[object, ...] = held
        self._resent = resent

    async def __call__(self) -> None:
        self._held = ()  # the turn's objects go now, before the collection walks what is left
        collect_after_turn()
        await make_spares(self._resent)


async def after_stream(resent: ResentRequests) -> None:
    """What follows a streamed answer, as ``FreedAfter`` follows a whole one: what outlived the turn may be
    collected, then the next turn's copies are made."""
    collect_after_turn()
    await make_spares(resent)


async def make_spares(resent: ResentRequests) -> None:
    """The copies of the messages the session's next turn will take (``make_spares``), once an answer is
    sent: on a worker thread, so other requests' turns go on meanwhile."""
    if resent.wants_spares:
        await anyio.to_thread.run_sync(resent.make_spares)
