"""In-process turn locks: one asyncio lock per branch of a session, with a bounded wait.

A branch is named by the chain hash of a request's last message (see ``SessionStore.turn_lock``):
two requests with the same history wait for each other, runs that merely open alike do not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from proxy.session.store import SessionBusy


@dataclass
class _Entry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # holders + waiters; the entry is dropped at zero so the map stays small


class SessionLocks:
    """Mutual exclusion per (context id, branch) within one event loop."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], _Entry] = {}

    @asynccontextmanager
    async def hold(self, context_id: str, timeout_seconds: float, branch: str = "") -> AsyncIterator[None]:
        """Hold the branch's lock; raise ``SessionBusy`` if it is not free within ``timeout_seconds``."""
        key = (context_id, branch)
        entry = self._entries.setdefault(key, _Entry())
        entry.users += 1
        try:
            try:
                # asyncio.Lock.acquire marks the lock taken only after a successful wait, so a
                # timeout (a cancellation) can never leave it held.
                async with asyncio.timeout(max(timeout_seconds, 0.0)):
                    await entry.lock.acquire()
            except TimeoutError:
                raise SessionBusy(context_id, timeout_seconds) from None
            try:
                yield
            finally:
                entry.lock.release()
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)
