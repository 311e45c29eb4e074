"""What only the shared PostgreSQL store promises: replicas, crashes and a bounded lock pool."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from proxy.session.postgres_schema import lock_key
from proxy.session.store import CalibrationUpdate, SessionBusy

pytestmark = pytest.mark.postgres


async def _lock_holders(dsn: str, key: int) -> list[int]:
    """Backend pids holding the advisory lock ``key`` (pg_locks splits the bigint in two halves)."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 1",
            unsigned >> 32,
            unsigned & 0xFFFFFFFF,
        )
    finally:
        await conn.close()
    return [row["pid"] for row in rows]


async def test_a_replica_that_dies_mid_turn_does_not_lock_the_session_forever(pg_backend: Any) -> None:
    crashed = await pg_backend.open(lock_timeout_seconds=2.0)
    survivor = await pg_backend.open(lock_timeout_seconds=2.0)
    dsn = crashed.dsn
    key = lock_key("context-proxy-session", crashed.schema, "s")

    async with crashed.turn_lock("s"):
        holders = await _lock_holders(dsn, key)
        assert len(holders) == 1
        # The replica's connection dies (process killed, network cut): the server drops its locks.
        admin = await asyncpg.connect(dsn)
        try:
            await admin.execute("SELECT pg_terminate_backend($1)", holders[0])
        finally:
            await admin.close()
        async with asyncio.timeout(2.0), survivor.turn_lock("s"):
            assert len(await _lock_holders(dsn, key)) == 1
    # Leaving the crashed turn (its unlock fails on a dead connection) raised nothing and left no lock.
    assert await _lock_holders(dsn, key) == []
    async with crashed.turn_lock("s"):
        pass


async def test_turns_beyond_the_lock_connections_wait_then_report_busy(pg_backend: Any) -> None:
    store = await pg_backend.open(lock_timeout_seconds=0.3, lock_connections=1)

    async with store.turn_lock("a"):
        with pytest.raises(SessionBusy):
            async with store.turn_lock("b"):
                pytest.fail("two turns held the only lock connection")
    async with store.turn_lock("b"):
        assert await _lock_holders(store.dsn, lock_key("context-proxy-session", store.schema, "b"))


async def test_the_lock_is_released_when_the_turn_ends(pg_backend: Any) -> None:
    store = await pg_backend.open(lock_timeout_seconds=1.0)
    key = lock_key("context-proxy-session", store.schema, "s")

    with pytest.raises(RuntimeError):
        async with store.turn_lock("s"):
            assert len(await _lock_holders(store.dsn, key)) == 1
            raise RuntimeError("turn failed")

    assert await _lock_holders(store.dsn, key) == []


async def test_a_turn_locks_the_routes_it_writes_samples_of_in_the_order_of_their_keys(
    pg_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each sample locks its route's row until the commit: two turns that locked two routes in opposite
    orders could deadlock, so every turn takes them in the order of their keys, a key's samples in theirs."""
    from proxy.session import postgres_calibration

    written: list[tuple[str, int]] = []
    real = postgres_calibration.update

    async def noted(conn: Any, pending: CalibrationUpdate) -> Any:
        written.append((pending.route_key, pending.update(None)["n"]))
        return await real(conn, pending)

    monkeypatch.setattr(postgres_calibration, "update", noted)
    keys = ["route:z", "route:a", "route:z", "route:m", "route:a"]
    updates = [CalibrationUpdate(key, "route", lambda _, n=n: {"n": n}) for n, key in enumerate(keys)]
    store = await pg_backend.open()
    start = await store.begin_turn(
        "ctx-order", "main", [{"role": "user", "content": "go"}], calibration="route:z", calibration_updates=updates
    )
    assert written == [("route:a", 1), ("route:a", 4), ("route:m", 3), ("route:z", 0), ("route:z", 2)]
    assert start.calibration == {"n": 2}  # the route read is as the turn's last sample of it left it
