"""In-process turn locks: one asyncio lock per branch of a session, with a bounded wait.

A branch is named by the chain hash of a request's last message (see ``SessionStore.turn_lock``):
two requests with the same history wait for each other, runs that merely open alike do not.

Every branch's lock is taken inside the session's gate, which any number of turns share and a
session-wide hold (``hold_session``, for deleting the session) has alone. The session-wide hold waits
for the turns inside to leave but does not stop new ones from entering meanwhile: a turn that holds
its branch may take the branchless lock too (a streamed Responses answer records itself), and a gate
closed against it while a deletion waited would deadlock the two until the wait ran out.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from proxy.session.store import SessionBusy

RUNNING_TURN = "a running turn"  # what ``SessionBusy`` says kept a session-wide hold waiting


@dataclass
class _Entry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # holders + waiters; the entry is dropped at zero so the map stays small


@dataclass
class _Gate:
    """Who is inside one session: any number of turns, or one session-wide hold."""

    turns: int = 0
    closed: bool = False  # a session-wide hold is inside
    users: int = 0  # inside + waiting; the gate is dropped at zero
    wakeups: list[asyncio.Future[None]] = field(default_factory=list)

    async def wait_until(self, ready: Callable[[], bool]) -> None:
        """Return once ``ready()`` holds; it is checked again whenever someone leaves the gate."""
        while not ready():
            wakeup = asyncio.get_running_loop().create_future()
            self.wakeups.append(wakeup)
            await wakeup

    def left(self) -> None:
        """Wake every waiter to check again (synchronous: safe in a ``finally`` of a cancelled task)."""
        wakeups, self.wakeups = self.wakeups, []
        for wakeup in wakeups:
            if not wakeup.done():
                wakeup.set_result(None)


class SessionLocks:
    """Mutual exclusion per (context id, branch) within one event loop, and per session for deletion."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._gates: dict[str, _Gate] = {}

    @asynccontextmanager
    async def hold(self, context_id: str, timeout_seconds: float, branch: str = "") -> AsyncIterator[None]:
        """Hold the branch's lock; raise ``SessionBusy`` if it is not free within ``timeout_seconds``."""
        key = (context_id, branch)
        gate = self._gate(context_id)
        entry = self._entries.setdefault(key, _Entry())
        entry.users += 1
        inside = False
        try:
            try:
                # asyncio.Lock.acquire marks the lock taken only after a successful wait, so a
                # timeout (a cancellation) can never leave it held.
                async with asyncio.timeout(max(timeout_seconds, 0.0)):
                    await gate.wait_until(lambda: not gate.closed)
                    gate.turns += 1
                    inside = True
                    await entry.lock.acquire()
            except TimeoutError:
                raise SessionBusy(context_id, timeout_seconds) from None
            try:
                yield
            finally:
                entry.lock.release()
        finally:
            if inside:
                gate.turns -= 1
                gate.left()
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]
            self._leave(context_id, gate)

    @asynccontextmanager
    async def hold_session(self, context_id: str, timeout_seconds: float) -> AsyncIterator[None]:
        """Hold the whole session once no turn of any branch is inside; ``SessionBusy`` after the wait."""
        gate = self._gate(context_id)
        try:
            try:
                async with asyncio.timeout(max(timeout_seconds, 0.0)):
                    await gate.wait_until(lambda: not gate.closed and gate.turns == 0)
            except TimeoutError:
                raise SessionBusy(context_id, timeout_seconds, RUNNING_TURN) from None
            gate.closed = True
            try:
                yield
            finally:
                gate.closed = False
                gate.left()
        finally:
            self._leave(context_id, gate)

    def _gate(self, context_id: str) -> _Gate:
        gate = self._gates.setdefault(context_id, _Gate())
        gate.users += 1
        return gate

    def _leave(self, context_id: str, gate: _Gate) -> None:
        gate.users -= 1
        if gate.users == 0:
            del self._gates[context_id]

    def __len__(self) -> int:
        return len(self._entries) + len(self._gates)
