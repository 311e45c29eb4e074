"""In-process turn locks: branches of a session run at once, a session-wide hold runs alone."""

from __future__ import annotations

import asyncio

import pytest

from proxy.session.locks import SessionLocks
from proxy.session.store import SessionBusy


async def test_a_session_wide_hold_keeps_every_branch_out_and_waits_for_them() -> None:
    locks = SessionLocks()
    async with locks.hold_session("s", 1.0):
        with pytest.raises(SessionBusy, match="another turn"):
            async with locks.hold("s", 0.1, "head-a"):
                pytest.fail("a turn ran beside a session-wide hold")
        async with asyncio.timeout(1.0), locks.hold("other", 0.1, "head-a"):
            pass  # another session is not held
    async with locks.hold("s", 0.1, "head-a"):
        with pytest.raises(SessionBusy, match="a running turn"):
            async with locks.hold_session("s", 0.1):
                pytest.fail("a session-wide hold ran beside a turn")
        with pytest.raises(SessionBusy):
            async with locks.hold_session("s", 0):
                pytest.fail("a session-wide hold ran beside a turn")


async def test_a_session_wide_hold_gets_the_session_once_its_turns_end() -> None:
    locks = SessionLocks()
    log: list[str] = []

    async def turn(branch: str) -> None:
        async with locks.hold("s", 1.0, branch):
            await asyncio.sleep(0.1)
            log.append(f"end {branch}")

    async def whole() -> None:
        async with locks.hold_session("s", 1.0):
            log.append("whole")

    turns = [asyncio.create_task(turn(branch)) for branch in ("a", "b")]
    await asyncio.sleep(0.01)
    await asyncio.gather(whole(), *turns)
    assert log[-1] == "whole" and sorted(log[:2]) == ["end a", "end b"]


async def test_locks_and_gates_are_dropped_after_timeouts_cancellations_and_errors() -> None:
    locks = SessionLocks()
    async with locks.hold("s", 1.0, "a"):
        waiter = asyncio.create_task(locks.hold_session("s", 5.0).__aenter__())
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        with pytest.raises(SessionBusy):
            async with locks.hold_session("s", 0.05):
                pass
    with pytest.raises(RuntimeError):
        async with locks.hold_session("s", 1.0):
            raise RuntimeError("the delete failed")
    async with locks.hold_session("s", 1.0):
        with pytest.raises(SessionBusy):
            async with locks.hold("s", 0.05, "a"):
                pass
    assert len(locks) == 0
    async with asyncio.timeout(1.0), locks.hold("s", 1.0, "a"), locks.hold("s", 1.0):
        pass
