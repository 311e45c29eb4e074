"""Sessions as a whole (``SessionStore.sessions``, ``delete_session``), on SQLite and PostgreSQL (conftest.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import pytest

from proxy.session import postgres_schema, postgres_sessions, sqlite_schema, sqlite_sessions
from proxy.session.postgres import PostgresSessionStore
from proxy.session.sqlite import SqliteSessionStore
from proxy.session.store import SessionBusy, SessionStore, SkillRef, StoreError, UnknownSession
from tests.session.conftest import Backend
from tests.session.store_rows import rows_of, session_info, tables_with_context_id
from tests.session.test_store import assistant, call, conversation, result, system, user

BRANCH_TURNS = "branch.turns"  # a branch counter, as the turn service keeps one


@dataclass(frozen=True)
class Seeded:
    """What ``seed`` wrote for one session, to read it back by."""

    head: str
    tool_ref: str


async def seed(store: SessionStore, context_id: str) -> Seeded:
    """A session with a row in every table a session has: a turn, a tool body, proxy steps, a checkpoint,
    branch and session-wide state (stored responses and issued compaction tokens live there), a skill ref."""
    messages = [system(), user(f"{context_id}: measure"), call("c1"), result("c1", f"{context_id} body"), user("ok")]
    start = await store.begin_turn(context_id, "main", messages, branch_counter=BRANCH_TURNS)
    head = start.reconciliation.head_hash
    tool_ref = start.reconciliation.new_messages[3].tool_output_ref
    assert tool_ref is not None
    await store.put_internal_steps(context_id, head, [call("p1"), result("p1", "lines 1-10")])
    await store.put_checkpoint(context_id, head, {"summary": f"{context_id} so far"})
    await store.put_state(context_id, head, "plan", {"steps": [context_id]})
    await store.put_state(context_id, "", "responses.response.resp_1", {"head": head})
    await store.put_skill_ref(context_id, SkillRef("pipetting", "r1", head))
    return Seeded(head, tool_ref)


async def kept(store: SessionStore, context_id: str, seeded: Seeded) -> dict[str, Any]:
    """Everything the product can read back of a seeded session."""
    return {
        "transcript": [entry.message for entry in await store.transcript(context_id, seeded.head)],
        "tool_output": await store.tool_output(context_id, seeded.tool_ref),
        "state": await store.state(context_id, seeded.head, "plan"),
        "branch_turns": await store.state(context_id, seeded.head, BRANCH_TURNS),
        "stored_response": await store.state(context_id, "", "responses.response.resp_1"),
        "internal_steps": await store.internal_steps(context_id, seeded.head),
        "checkpoints": dict((await store.branch_view(context_id, [seeded.head], [])).checkpoints),
        "skill_refs": await store.skill_refs(context_id),
    }


NOTHING = {
    "transcript": [],
    "tool_output": None,
    "state": None,
    "branch_turns": None,
    "stored_response": None,
    "internal_steps": [],
    "checkpoints": {},
    "skill_refs": [],
}


async def test_deleting_a_session_removes_all_it_kept_and_nothing_of_another(store: SessionStore) -> None:
    a = await seed(store, "a")
    b = await seed(store, "b")
    secret = await store.secret("framing")
    await store.update_calibration("route:m", "route", lambda _: {"samples": [1]})
    b_kept = await kept(store, "b", b)
    # The seed reaches every table of a session, so each one's deletion is checked below.
    assert all(count > 0 for count in (await rows_of(store, "a")).values()), await rows_of(store, "a")

    assert await store.delete_session("a") is True

    assert await kept(store, "a", a) == NOTHING
    assert set((await rows_of(store, "a")).values()) == {0}
    assert await session_info(store, "a") is None
    with pytest.raises(UnknownSession):
        await store.next_turn("a")
    assert await kept(store, "b", b) == b_kept
    assert b_kept["transcript"] and b_kept["tool_output"] == "b body"
    # The deployment's shared rows are no session's.
    assert await store.secret("framing") == secret
    assert await store.calibration("route:m") == {"samples": [1]}
    assert [summary.context_id for summary in await store.sessions()] == ["b"]


async def test_the_tables_a_delete_empties_are_every_table_of_a_session(store: SessionStore) -> None:
    listed = sqlite_schema.SESSION_TABLES if isinstance(store, SqliteSessionStore) else postgres_schema.SESSION_TABLES
    assert await tables_with_context_id(store) == set(listed)
    assert listed[-1] == "sessions"  # the row every other one refers to goes last


async def test_deleting_twice_or_an_unknown_session_finds_nothing_the_second_time(store: SessionStore) -> None:
    await seed(store, "a")
    assert await store.delete_session("a") is True
    assert await store.delete_session("a") is False
    assert await store.delete_session("never-seen") is False


async def test_a_deleted_session_starts_afresh(store: SessionStore) -> None:
    messages = conversation(2)
    await seed(store, "a")
    await store.reconcile("a", "main", messages)
    await store.delete_session("a")

    again = await store.reconcile("a", "subagent", messages)

    assert (again.created, again.known_count, len(again.new_messages)) == (True, 0, len(messages))
    assert await store.next_turn("a") == 1
    info = await session_info(store, "a")
    assert info is not None and info.scope == "subagent"


async def test_a_failed_delete_leaves_the_session_whole(store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    seeded = await seed(store, "a")
    before = (await rows_of(store, "a"), await kept(store, "a", seeded))
    # A table that fails after the others were emptied: one transaction, so nothing is gone.
    for module in (sqlite_sessions, postgres_sessions):
        tables = module.SESSION_TABLES
        monkeypatch.setattr(module, "SESSION_TABLES", (*tables[:-1], "no_such_table", tables[-1]))

    with pytest.raises(StoreError, match="no_such_table"):
        await store.delete_session("a")

    assert (await rows_of(store, "a"), await kept(store, "a", seeded)) == before


async def test_sessions_lists_each_with_its_scope_and_messages_of_every_branch(store: SessionStore) -> None:
    assert await store.sessions() == []
    await store.reconcile("a", "main", conversation(2))
    await store.reconcile("b", "subagent", conversation(1))
    await store.reconcile("b", "subagent", [system(), user("question 0"), assistant("another answer")])  # a fork

    listed = await store.sessions()

    assert [(s.context_id, s.scope, s.messages) for s in listed] == [("b", "subagent", 4), ("a", "main", 5)]
    times = [datetime.fromisoformat(s.updated_at) for s in listed]
    assert times == sorted(times, reverse=True)  # the most recently updated first


# --- deleting beside turns ------------------------------------------------------------------------
# Each test notes what it saw while tasks run and asserts once they are done (in a TaskGroup, which
# cancels them when the test fails), so a failure never leaves a lock held through the teardown.


async def _deleter(backend: Backend, store: SessionStore, timeout: float) -> SessionStore:
    """Who deletes: on PostgreSQL another replica (an operator's command beside serving replicas), on
    SQLite the store itself (one process serves a SQLite file)."""
    return await backend.open(lock_timeout_seconds=timeout) if backend.name == "postgres" else store


async def test_a_delete_waits_for_a_running_turn_of_any_branch_and_takes_its_writes(backend: Backend) -> None:
    store = await backend.open(lock_timeout_seconds=5.0)
    deleter = await _deleter(backend, store, 5.0)
    seeded = await seed(store, "s")
    log: list[str] = []
    may_end = asyncio.Event()

    async def turn() -> None:
        async with store.turn_lock("s", seeded.head):
            log.append("turn started")
            await may_end.wait()
            await store.put_checkpoint("s", seeded.head, {"summary": "written at the end of the turn"})
            log.append("turn ended")

    async def delete() -> bool:
        deleted = await deleter.delete_session("s")
        log.append("deleted")
        return deleted

    async with asyncio.timeout(10), asyncio.TaskGroup() as tasks:
        tasks.create_task(turn())
        while not log:
            await asyncio.sleep(0.01)
        deleting = tasks.create_task(delete())
        await asyncio.sleep(0.3)
        may_end.set()

    assert log == ["turn started", "turn ended", "deleted"], "the delete ran beside a turn"
    assert deleting.result() is True
    assert set((await rows_of(store, "s")).values()) == {0}  # the turn's last write went with the session


async def test_a_delete_gives_up_with_session_busy_while_a_turn_runs(backend: Backend) -> None:
    store = await backend.open(lock_timeout_seconds=0.3)
    deleter = await _deleter(backend, store, 0.3)
    seeded = await seed(store, "s")
    before = await rows_of(store, "s")

    async with store.turn_lock("s", "another-branch"):
        started = time.perf_counter()
        with pytest.raises(SessionBusy, match="busy with a running turn") as busy:
            await deleter.delete_session("s")
        waited = time.perf_counter() - started
        during = await rows_of(store, "s")
        # Another session is not held up by this one's turn.
        other = await deleter.delete_session("other")

    assert waited >= 0.25 and busy.value.context_id == "s"
    assert during == before and other is False
    assert await deleter.delete_session("s") is True
    assert await kept(store, "s", seeded) == NOTHING


@asynccontextmanager
async def _writes_blocked(store: SessionStore, context_id: str) -> AsyncIterator[None]:
    """Hold up the store's next write of the session (a slow disk, a busy database) until the block ends."""
    if isinstance(store, SqliteSessionStore):
        release = threading.Event()
        blocking = asyncio.ensure_future(store._w().run(lambda conn: release.wait()))  # the one writer thread
        try:
            yield
        finally:
            release.set()
            await blocking
        return
    assert isinstance(store, PostgresSessionStore)
    conn = await asyncpg.connect(store.dsn, server_settings={"search_path": store.schema})
    try:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM messages WHERE context_id = $1 FOR UPDATE", context_id)
            yield
    finally:
        await conn.close()


async def test_a_turn_that_starts_during_a_delete_waits_for_it(backend: Backend) -> None:
    store = await backend.open(lock_timeout_seconds=5.0)
    deleter = await _deleter(backend, store, 5.0)
    await seed(store, "s")
    seen: list[dict[str, int]] = []

    async def turn() -> None:
        async with store.turn_lock("s", "some-branch"):
            seen.append(await rows_of(store, "s"))

    async with asyncio.timeout(10), asyncio.TaskGroup() as tasks, _writes_blocked(store, "s"):
        deleting = tasks.create_task(deleter.delete_session("s"))
        await asyncio.sleep(0.2)  # the delete holds the session and waits for its write
        tasks.create_task(turn())
        await asyncio.sleep(0.3)
        started_beside_the_delete = bool(seen)

    assert not started_beside_the_delete
    assert deleting.result() is True
    assert len(seen) == 1 and set(seen[0].values()) == {0}  # the turn saw the session deleted, not half of it


async def test_a_waiting_delete_does_not_keep_a_turn_from_its_sessions_other_lock(backend: Backend) -> None:
    # A streamed Responses answer records itself under the branchless lock while its branch's is held.
    store = await backend.open(lock_timeout_seconds=3.0)
    deleter = await _deleter(backend, store, 3.0)
    await seed(store, "s")

    async with asyncio.timeout(10), asyncio.TaskGroup() as tasks, store.turn_lock("s", "head-a"):
        deleting = tasks.create_task(deleter.delete_session("s"))
        await asyncio.sleep(0.2)
        started = time.perf_counter()
        async with store.turn_lock("s"):
            waited = time.perf_counter() - started
        deleted_beside_the_turn = deleting.done()

    assert waited < 1.0
    assert not deleted_beside_the_turn
    assert deleting.result() is True


async def test_a_cancelled_delete_leaves_no_lock_behind(backend: Backend) -> None:
    store = await backend.open(lock_timeout_seconds=3.0)
    deleter = await _deleter(backend, store, 3.0)
    await seed(store, "s")

    async with store.turn_lock("s", "head-a"):
        deleting = asyncio.create_task(deleter.delete_session("s"))
        await asyncio.sleep(0.2)
        deleting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await deleting

    async with asyncio.timeout(1.0):
        async with store.turn_lock("s", "head-a"):
            pass
        assert await deleter.delete_session("s") is True
