"""Turn locks shared by every replica: a PostgreSQL advisory lock per branch of a session, held for the turn.

The key hashes the context id and the branch (the chain hash of the request's last message), so two
replicas serving the same history take turns while runs that only open alike do not; a request
without a branch keeps the per-session key of earlier releases.

The lock is session-level (not transaction-level) because a turn spans many short transactions and a
provider call. It lives on a connection from its own pool: were it taken from the query pool, N
concurrent turns could hold every connection and then wait forever for one to run their queries.
Inside one process an asyncio lock queues turns of the same session first, so they wait in memory
rather than each occupying a lock connection.

Every turn also holds the session's gate key shared, and deleting the session takes it exclusively,
so a deletion never runs beside a turn of any branch on any replica (``locks.py`` says why it polls
rather than queues). Replicas of releases before the gate do not take it: stop them before deleting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import asyncpg

from proxy.session.locks import RUNNING_TURN, SessionLocks
from proxy.session.postgres_schema import lock_key
from proxy.session.store import SessionBusy, StoreError

_DRIVER_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError)
_GATE_POLL_SECONDS = 0.05  # how often a session-wide hold asks again whether the session's turns are done


class AdvisoryTurnLocks:
    """Per-branch mutual exclusion across processes, with a bounded wait."""

    def __init__(self, schema: str, timeout_seconds: float, connections: int) -> None:
        self.schema = schema
        self.timeout_seconds = timeout_seconds
        self.connections = connections  # turns this process can hold at once
        self._local = SessionLocks()
        self._pool: Any = None

    async def open(self, dsn: str, server_settings: dict[str, str]) -> None:
        """Create the lock connections' pool (connections are made on demand)."""
        self._pool = await asyncpg.create_pool(
            dsn, min_size=0, max_size=self.connections, server_settings=server_settings
        )

    async def close(self) -> None:
        """Close the pool; it waits for turns still holding a lock to release it."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    def hold(self, context_id: str, branch: str = "") -> AbstractAsyncContextManager[None]:
        """Hold the branch's lock for a turn; ``SessionBusy`` when it is not had within the wait."""
        return self._hold(context_id, branch)

    def hold_session(self, context_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the whole session on every replica once no turn of it runs; ``SessionBusy`` after the wait."""
        return self._hold_session(context_id)

    @asynccontextmanager
    async def _hold(self, context_id: str, branch: str) -> AsyncIterator[None]:
        deadline = asyncio.get_running_loop().time() + self.timeout_seconds
        async with self._local.hold(context_id, self.timeout_seconds, branch):
            gate = self._gate_key(context_id)
            key = lock_key("context-proxy-session", self.schema, context_id, *((branch,) if branch else ()))
            async with self._on_server(context_id, deadline, lambda conn, left: _turn_lock(conn, gate, key, left)):
                yield

    @asynccontextmanager
    async def _hold_session(self, context_id: str) -> AsyncIterator[None]:
        deadline = asyncio.get_running_loop().time() + self.timeout_seconds
        async with self._local.hold_session(context_id, self.timeout_seconds):
            gate = self._gate_key(context_id)
            async with self._on_server(
                context_id, deadline, lambda conn, left: _gate_lock(conn, gate, left), RUNNING_TURN
            ):
                yield

    def _busy(self, context_id: str, holder: str | None) -> SessionBusy:
        return SessionBusy(context_id, self.timeout_seconds, *((holder,) if holder else ()))

    def _gate_key(self, context_id: str) -> int:
        return lock_key("context-proxy-session-gate", self.schema, context_id)

    @asynccontextmanager
    async def _on_server(
        self,
        context_id: str,
        deadline: float,
        take: Callable[[Any, float], Awaitable[bool]],
        holder: str | None = None,
    ) -> AsyncIterator[None]:
        """Hold what ``take`` locks on a lock connection until the block ends; ``SessionBusy`` at the deadline."""
        loop = asyncio.get_running_loop()
        # Kept locally: close() may drop the attribute while a turn still holds a connection.
        pool = self._pool
        if pool is None:
            raise StoreError("the session store is not open")
        try:
            conn = await pool.acquire(timeout=max(deadline - loop.time(), 0.001))
        except TimeoutError:
            # Every lock connection of this process is in use by other turns.
            raise self._busy(context_id, holder) from None
        except _DRIVER_ERRORS as exc:
            raise StoreError(f"postgres session store: {exc}") from exc
        try:
            acquired = await take(conn, deadline - loop.time())
        except BaseException as exc:
            # A failure or cancellation mid-query leaves the lock's state in doubt; dropping the
            # connection makes the server release every lock it held.
            _terminate(conn)
            await pool.release(conn)
            if isinstance(exc, _DRIVER_ERRORS):
                raise StoreError(f"postgres session store: {exc}") from exc
            raise
        if not acquired:
            await _unlock(pool, conn)  # a turn may hold the gate's share without its branch
            raise self._busy(context_id, holder)
        try:
            yield
        finally:
            await _unlock(pool, conn)


async def _turn_lock(conn: Any, gate: int, key: int, remaining: float) -> bool:
    """The session gate shared, then the branch's lock, in one round trip."""
    if remaining <= 0.001:
        row = await conn.fetchrow(
            "SELECT pg_try_advisory_lock_shared($1) AS gate, pg_try_advisory_lock($2) AS branch", gate, key
        )
        return bool(row["gate"] and row["branch"])
    # lock_timeout bounds the wait on the server, which also queues waiters fairly (polling would not).
    await conn.execute("SELECT set_config('lock_timeout', $1, false)", f"{int(remaining * 1000)}ms")
    try:
        await conn.execute("SELECT pg_advisory_lock_shared($1), pg_advisory_lock($2)", gate, key)
    except asyncpg.LockNotAvailableError:
        return False
    return True


async def _gate_lock(conn: Any, gate: int, remaining: float) -> bool:
    """The session gate alone, polled: a waiting exclusive request would queue the shares of new turns
    behind it on the server, and a turn that takes a second lock of its session would wait for it."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + remaining
    while not await conn.fetchval("SELECT pg_try_advisory_lock($1)", gate):
        if loop.time() >= give_up:
            return False
        await asyncio.sleep(min(_GATE_POLL_SECONDS, max(give_up - loop.time(), 0.0)))
    return True


async def _unlock(pool: Any, conn: Any) -> None:
    # The connection holds this hold's locks only, so releasing all of them releases exactly those.
    try:
        await conn.execute("SELECT pg_advisory_unlock_all()")
    except _DRIVER_ERRORS:
        # The turn succeeded or raised its own error; a broken lock connection must not replace
        # that. Terminating it ends the server session, which releases the lock.
        _terminate(conn)
    except BaseException:
        _terminate(conn)
        raise
    finally:
        await pool.release(conn)


def _terminate(conn: Any) -> None:
    # When the connection was lost, asyncpg has already detached it from the pool (and the server has
    # already dropped its locks); the proxy then refuses every call, terminate() included.
    with contextlib.suppress(asyncpg.InterfaceError):
        conn.terminate()
