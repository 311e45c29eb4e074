"""The SessionStore contract, run identically on SQLite and PostgreSQL (see conftest.py)."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from proxy.kernel.canonical import chain_hashes
from proxy.session import postgres_schema, sqlite_schema
from proxy.session.postgres import PostgresSessionStore
from proxy.session.sqlite import SqliteSessionStore
from proxy.session.store import (
    SECRET_BYTES,
    BranchCount,
    BranchState,
    CalibrationUpdate,
    SessionStore,
    SkillRef,
    UnknownSession,
    tool_output_ref,
)
from tests.session.store_rows import copies_of, session_info, stored_checkpoint

Message = dict[str, Any]


def system(text: str = "You are a careful lab assistant.") -> Message:
    return {"role": "system", "content": text}


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def assistant(text: str) -> Message:
    return {"role": "assistant", "content": text}


def call(*ids: str) -> Message:
    calls = [{"id": i, "type": "function", "function": {"name": "run", "arguments": f'{{"n": "{i}"}}'}} for i in ids]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def result(call_id: str, content: Any) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def conversation(turns: int, tag: str = "") -> list[Message]:
    messages = [system()]
    for i in range(turns):
        messages += [user(f"{tag}question {i}"), assistant(f"{tag}answer {i}")]
    return messages


async def stored_messages(store: SessionStore, context_id: str, head: str) -> list[Message]:
    return [m.message for m in await store.transcript(context_id, head)]


# --- reconciliation -------------------------------------------------------------------------------


async def test_first_request_creates_the_session_and_stores_every_message(store: SessionStore) -> None:
    messages = [system(), user("hello")]
    hashes = chain_hashes(messages)

    r = await store.reconcile("s1", "subagent", messages)

    assert (r.created, r.forked, r.known_count, r.head_hash) == (True, False, 0, hashes[-1])
    assert [(m.position, m.chain_hash, m.message) for m in r.new_messages] == list(
        zip([0, 1], hashes, messages, strict=True)
    )
    info = await session_info(store, "s1")
    assert info is not None
    assert (info.context_id, info.scope, info.turns, info.head_hash) == ("s1", "subagent", 0, hashes[-1])
    assert "created_at" in info.metadata
    assert await session_info(store, "other") is None


async def test_continuation_stores_only_the_new_suffix(store: SessionStore) -> None:
    first = [*conversation(1), user("next")]
    await store.reconcile("s", "main", first)
    second = [*first, assistant("reply"), user("and then?")]

    r = await store.reconcile("s", "main", second)

    assert (r.created, r.forked, r.known_count) == (False, False, len(first))
    assert [m.position for m in r.new_messages] == [len(first), len(first) + 1]
    assert [m.message for m in r.new_messages] == second[len(first) :]
    assert await stored_messages(store, "s", r.head_hash) == second
    info = await session_info(store, "s")
    assert info is not None and info.head_hash == r.head_hash


async def test_resending_the_same_history_stores_nothing(store: SessionStore) -> None:
    messages = conversation(3)
    await store.reconcile("s", "main", messages)
    # Cosmetic differences real clients produce do not make a message new.
    resent = [dict(m) for m in messages]
    resent[2] = {**resent[2], "refusal": None, "annotations": []}

    r = await store.reconcile("s", "main", resent)

    assert (r.known_count, r.new_messages, r.forked, r.created) == (len(messages), [], False, False)
    # The copy first stored is kept as it was sent.
    assert await stored_messages(store, "s", r.head_hash) == messages


async def test_messages_are_stored_exactly_as_sent(store: SessionStore) -> None:
    odd = {
        "content": [{"type": "text", "text": "名前 ✓ \U0001f9ea"}, {"type": "image_url", "image_url": {"url": "x"}}],
        "role": "user",
        "name": "alice",
        "vendor_extra": {"b": 1, "a": [None, 1.5, True]},
    }
    messages = [system("nul \x00 survives"), odd]

    r = await store.reconcile("s", "main", messages)

    got = await stored_messages(store, "s", r.head_hash)
    assert got == messages
    assert list(got[1]) == list(odd)  # key order kept
    assert [m.message for m in r.new_messages] == messages


async def test_divergent_message_forks_and_both_branches_stay_whole(store: SessionStore) -> None:
    base = conversation(2)  # system, q0, a0, q1, a1
    branch_a = [*base, user("continue A")]
    a = await store.reconcile("s", "main", branch_a)
    branch_b = [*base[:3], assistant("regenerated answer"), user("continue B")]

    b = await store.reconcile("s", "main", branch_b)

    assert (b.forked, b.known_count) == (True, 3)
    assert [m.position for m in b.new_messages] == [3, 4]
    assert await stored_messages(store, "s", a.head_hash) == branch_a
    assert await stored_messages(store, "s", b.head_hash) == branch_b
    info = await session_info(store, "s")
    assert info is not None and info.head_hash == b.head_hash

    # Continuing the new branch is not a fork.
    b2 = await store.reconcile("s", "main", [*branch_b, assistant("ok")])
    assert (b2.forked, b2.known_count) == (False, len(branch_b))

    # Switching back to the stored branch A (all known) leaves the branch last continued.
    back = await store.reconcile("s", "main", branch_a)
    assert (back.forked, back.known_count, back.new_messages) == (True, len(branch_a), [])


async def test_rewinding_to_an_earlier_point_of_the_branch_is_not_a_fork(store: SessionStore) -> None:
    messages = conversation(3)
    await store.reconcile("s", "main", messages)

    r = await store.reconcile("s", "main", messages[:3])

    assert (r.forked, r.known_count, r.new_messages) == (False, 3, [])
    info = await session_info(store, "s")
    assert info is not None and info.head_hash == chain_hashes(messages[:3])[-1]


async def test_tool_bodies_are_stored_under_their_references(store: SessionStore) -> None:
    parts = [
        {"type": "text", "text": "part a"},
        {"type": "image_url", "image_url": {"url": "u"}},
        {"type": "text", "text": "b"},
    ]
    messages = [
        system(),
        user("measure twice"),
        call("c1", "c2"),
        result("c1", "line 1\nline 2 \x00 end"),
        result("c2", parts),
        user("thanks"),
    ]
    hashes = chain_hashes(messages)

    r = await store.reconcile("s", "main", messages)

    refs = [m.tool_output_ref for m in r.new_messages]
    assert refs == [None, None, None, tool_output_ref(hashes[3]), tool_output_ref(hashes[4]), None]
    assert [m.tool_output_ref for m in await store.transcript("s", r.head_hash)] == refs
    # NUL cannot live in a PostgreSQL text column; both backends replace it the same way.
    assert await store.tool_output("s", tool_output_ref(hashes[3])) == "line 1\nline 2 \ufffd end"
    assert await store.tool_output("s", tool_output_ref(hashes[4])) == "part a\nb"
    # The message itself keeps the exact content.
    assert (await store.transcript("s", r.head_hash))[3].message == messages[3]
    # Resending stores nothing and keeps the bodies.
    again = await store.reconcile("s", "main", messages)
    assert again.new_messages == []
    assert await store.tool_output("s", tool_output_ref(hashes[4])) == "part a\nb"


async def test_a_tool_reference_of_another_session_is_unknown(store: SessionStore) -> None:
    messages = [system(), user("run it"), call("c1"), result("c1", "secret body")]
    a = await store.reconcile("a", "main", messages)
    await store.reconcile("b", "main", [system(), user("something else")])
    ref = a.new_messages[3].tool_output_ref
    assert ref is not None

    assert await store.tool_output("a", ref) == "secret body"
    assert await store.tool_output("b", ref) is None
    assert await store.tool_output("never-seen", ref) is None
    assert await store.tool_output("a", "to_0000000000000000") is None
    assert await store.transcript("b", a.head_hash) == []


async def test_empty_requests_are_a_caller_error_and_store_nothing(store: SessionStore) -> None:
    with pytest.raises(ValueError, match="at least one message"):
        await store.reconcile("s", "main", [])
    assert await session_info(store, "s") is None


async def test_unknown_head_has_an_empty_transcript(store: SessionStore) -> None:
    await store.reconcile("s", "main", conversation(1))
    assert await store.transcript("s", "f" * 64) == []


async def test_a_failed_reconcile_of_a_new_session_leaves_nothing(store: SessionStore) -> None:
    # The extra field is not hashed, so the failure happens while rows are being written.
    bad = {"role": "user", "content": "x", "extra": object()}
    messages = [system(), user("fine"), call("c1"), result("c1", "body"), bad]

    with pytest.raises(ValueError, match="message 4"):
        await store.reconcile("s", "main", messages)

    assert await session_info(store, "s") is None
    hashes = chain_hashes(messages)
    assert await store.transcript("s", hashes[3]) == []
    assert await store.tool_output("s", tool_output_ref(hashes[3])) is None
    retry = await store.reconcile("s", "main", messages[:4])
    assert (retry.created, retry.known_count) == (True, 0)


async def test_a_failed_continuation_leaves_the_session_as_it_was(store: SessionStore) -> None:
    first = conversation(1)
    before = await store.reconcile("s", "main", first)
    messages = [*first, user("go"), call("c1"), result("c1", "body"), {"role": "user", "content": float("nan")}]

    with pytest.raises(ValueError):
        await store.reconcile("s", "main", messages)

    info = await session_info(store, "s")
    assert info is not None and info.head_hash == before.head_hash
    hashes = chain_hashes(messages)
    assert await store.transcript("s", hashes[-2]) == []
    assert await store.tool_output("s", tool_output_ref(hashes[-2])) is None
    r = await store.reconcile("s", "main", messages[:-1])
    assert (r.known_count, len(r.new_messages), r.forked) == (len(first), 3, False)


async def test_random_walk_of_continuations_forks_and_resends_keeps_every_branch(store: SessionStore) -> None:
    """Property: whatever the clients send, each request's transcript is exactly that request."""
    rng = random.Random(20240607)
    sent: list[list[Message]] = [[system()]]
    await store.reconcile("s", "main", sent[0])
    for step in range(40):
        previous = rng.choice(sent)
        action = rng.choice(["continue", "fork", "resend"])
        if action == "continue":
            request = [*previous, user(f"u{step}"), assistant(f"a{step}")]
        elif action == "fork":
            cut = rng.randrange(1, len(previous) + 1)
            request = [*previous[:cut], user(f"fork {step}")]
        else:
            request = list(previous)
        longest_known = max(_common_prefix(request, other) for other in sent)

        r = await store.reconcile("s", "main", request)

        assert r.known_count == longest_known, (step, action)
        assert [m.message for m in r.new_messages] == request[longest_known:]
        assert await stored_messages(store, "s", r.head_hash) == request
        sent.append(request)
    for request in sent:
        assert await stored_messages(store, "s", chain_hashes(request)[-1]) == request


def _common_prefix(a: list[Message], b: list[Message]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


async def test_a_5000_message_history_is_read_back_in_one_query(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages = [system()] + [user(f"message {i}") if i % 2 else assistant(f"reply {i}") for i in range(1, 5000)]
    r = await store.reconcile("long", "main", messages)
    assert len(r.new_messages) == 5000

    statements = _count_reads(store, monkeypatch)
    transcript = await store.transcript("long", r.head_hash)

    assert [m.message for m in transcript] == messages
    assert [m.position for m in transcript] == list(range(5000))
    # One recursive query for the whole branch, not one per message (how fast it is belongs in the bench).
    assert len(statements) == 1, statements
    more = await store.reconcile("long", "main", [*messages, user("one more")])
    assert (more.known_count, len(more.new_messages)) == (5000, 1)


class _CountedConnection:
    """A sqlite3 or asyncpg connection that records every statement sent through it."""

    _SENDS = frozenset({"execute", "executemany", "executescript", "fetch", "fetchrow", "fetchval"})

    def __init__(self, conn: Any, statements: list[str]) -> None:
        self._conn = conn
        self._statements = statements

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._conn, name)
        if name not in self._SENDS:
            return attribute

        def send(query: str, *args: Any, **kwargs: Any) -> Any:
            self._statements.append(query)
            return attribute(query, *args, **kwargs)

        return send


def _count_reads(store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements the store's reads send from now on: each backend hands its reads a connection at one
    place (SQLite's reader thread, PostgreSQL's query pool), where a counting one is put instead."""
    statements: list[str] = []
    if isinstance(store, SqliteSessionStore):
        reader = store._r()
        call = reader._call
        monkeypatch.setattr(reader, "_call", lambda fn: call(lambda conn: fn(_CountedConnection(conn, statements))))
    else:
        assert isinstance(store, PostgresSessionStore)
        read = store._read
        monkeypatch.setattr(store, "_read", lambda fn: read(lambda conn: fn(_CountedConnection(conn, statements))))
    return statements


# --- concurrency ----------------------------------------------------------------------------------


async def test_different_sessions_reconcile_concurrently_without_mixing(store: SessionStore) -> None:
    async def drive(n: int) -> list[Message]:
        messages = [system(f"session {n}")]
        for turn in range(4):
            messages = [*messages, user(f"s{n} q{turn}")]
            r = await store.reconcile(f"s{n}", "main", messages)
            # Each turn adds the previous answer and a new question; the first adds system + question.
            assert (r.created, r.known_count, len(r.new_messages)) == (turn == 0, len(messages) - 2, 2)
            messages = [*messages, assistant(f"s{n} a{turn}")]
        return messages[:-1]

    sent = await asyncio.gather(*(drive(n) for n in range(20)))

    for n, messages in enumerate(sent):
        info = await session_info(store, f"s{n}")
        assert info is not None
        assert await stored_messages(store, f"s{n}", info.head_hash) == messages


async def test_store_work_does_not_block_the_event_loop(store: SessionStore) -> None:
    messages = [system()] + [user(f"message {i} " + "x" * 200) for i in range(1, 5000)]
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            await asyncio.sleep(0)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    await store.reconcile("big", "main", messages)
    done.set()
    await ticking

    # Blocking I/O on the loop would let the ticker run at most once or twice while 5,000 rows go in.
    assert ticks > 20


async def test_concurrent_reconciles_of_one_new_session_store_each_message_once(store: SessionStore) -> None:
    messages = conversation(3)
    results = await asyncio.gather(*(store.reconcile("s", "main", messages) for _ in range(6)))

    assert sum(r.created for r in results) == 1
    assert sum(len(r.new_messages) for r in results) == len(messages)
    assert await stored_messages(store, "s", results[0].head_hash) == messages


async def test_next_turn_counts_atomically(store: SessionStore) -> None:
    await store.reconcile("s", "main", conversation(1))
    turns = await asyncio.gather(*(store.next_turn("s") for _ in range(25)))
    assert sorted(turns) == list(range(1, 26))
    info = await session_info(store, "s")
    assert info is not None and info.turns == 25
    with pytest.raises(UnknownSession):
        await store.next_turn("never-seen")


async def test_turn_lock_serializes_one_session(store: SessionStore) -> None:
    log: list[tuple[str, int]] = []

    async def turn(n: int) -> None:
        async with store.turn_lock("s"):
            log.append(("start", n))
            await asyncio.sleep(0.05)
            log.append(("end", n))

    await asyncio.gather(*(turn(n) for n in range(4)))

    for i in range(0, len(log), 2):
        assert log[i][0] == "start" and log[i + 1] == ("end", log[i][1])


async def test_turn_lock_times_out_with_session_busy(backend: Any) -> None:
    from proxy.session.store import SessionBusy

    store = await backend.open(lock_timeout_seconds=0.3)
    async with store.turn_lock("s"):
        started = time.perf_counter()
        with pytest.raises(SessionBusy) as busy:
            async with store.turn_lock("s"):
                pytest.fail("the lock was held twice")
        assert time.perf_counter() - started >= 0.25
        assert busy.value.context_id == "s"
        # Another session is not blocked by this one.
        async with store.turn_lock("other"):
            pass
    async with store.turn_lock("s"):
        pass


async def test_turn_lock_is_released_by_errors_and_cancelled_waiters(store: SessionStore) -> None:
    with pytest.raises(RuntimeError):
        async with store.turn_lock("s"):
            raise RuntimeError("the turn failed")

    async def wait_for_lock() -> None:
        async with store.turn_lock("s"):
            pytest.fail("got a lock that was held")

    async with store.turn_lock("s"):
        waiter = asyncio.create_task(wait_for_lock())
        await asyncio.sleep(0.1)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter

    async with asyncio.timeout(1.0), store.turn_lock("s"):
        pass


# SQLite serializes turns within one process only; several replicas need PostgreSQL.
@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
async def test_two_replicas_serialize_the_same_session(backend: Any) -> None:
    from proxy.session.store import SessionBusy

    a = await backend.open(lock_timeout_seconds=5.0)
    b = await backend.open(lock_timeout_seconds=5.0)
    impatient = await backend.open(lock_timeout_seconds=0.3)
    no_wait = await backend.open(lock_timeout_seconds=0)
    log: list[str] = []

    async def turn(replica: SessionStore, name: str) -> None:
        async with replica.turn_lock("s"):
            log.append(f"start {name}")
            await asyncio.sleep(0.1)
            log.append(f"end {name}")

    await asyncio.gather(turn(a, "a"), turn(b, "b"), turn(a, "a2"), turn(b, "b2"))
    for i in range(0, len(log), 2):
        assert log[i + 1] == log[i].replace("start", "end")

    async with a.turn_lock("s"):
        with pytest.raises(SessionBusy):
            async with impatient.turn_lock("s"):
                pytest.fail("two replicas held one session")
        with pytest.raises(SessionBusy):
            async with no_wait.turn_lock("s"):
                pytest.fail("two replicas held one session")
        # A waiter cancelled mid-wait on the server must not end up holding the lock.
        waiter = asyncio.create_task(turn(b, "cancelled"))
        await asyncio.sleep(0.2)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        async with b.turn_lock("other-session"):
            pass
    async with impatient.turn_lock("s"):
        pass
    assert "start cancelled" not in log


async def test_turn_locks_are_per_branch_of_a_session(backend: Any) -> None:
    from proxy.session.store import SessionBusy

    store = await backend.open(lock_timeout_seconds=0.3)
    # Replicas share a PostgreSQL database; a SQLite folder is served by one process only.
    replica = await backend.open(lock_timeout_seconds=0.3) if backend.name == "postgres" else store
    async with store.turn_lock("s", "head-a"):
        # Another branch of the same session (another run with the same opening) is not blocked...
        async with asyncio.timeout(1.0), store.turn_lock("s", "head-b"):
            pass
        # ...but the same branch is, here and (on PostgreSQL) on a replica sharing the database.
        with pytest.raises(SessionBusy):
            async with store.turn_lock("s", "head-a"):
                pytest.fail("one branch was held twice")
        if backend.name == "postgres":
            with pytest.raises(SessionBusy):
                async with replica.turn_lock("s", "head-a"):
                    pytest.fail("two replicas held one branch")
            async with asyncio.timeout(1.0), replica.turn_lock("s", "head-b"):
                pass
        # The branchless lock of earlier releases is a branch of its own.
        async with asyncio.timeout(1.0), store.turn_lock("s"):
            pass
    async with store.turn_lock("s", "head-a"):
        pass


async def test_branch_view_reads_the_nearest_prefix_of_the_requests_own_chain(store: SessionStore) -> None:
    opening = [system(), user("calibrate")]
    run_a = [*opening, assistant("a1"), user("a2")]
    run_b = [*opening, assistant("b1"), user("b2")]
    a = (await store.reconcile("s", "main", run_a)).chain_hashes
    b = (await store.reconcile("s", "main", run_b)).chain_hashes
    await store.put_state("s", a[1], "previews", ["shared"])
    await store.put_state("s", a[3], "previews", ["a only"])
    await store.put_state("s", b[2], "other", 1)
    await store.put_state("s", "", "legacy", "session-wide")  # the root of every chain

    view = await store.branch_view("s", a, ["previews", "other", "legacy"])
    assert view.states["previews"] == BranchState(a[3], ["a only"])
    assert "other" not in view.states and view.value("other") is None
    assert view.states["legacy"] == BranchState("", "session-wide")
    view = await store.branch_view("s", b, ["previews", "other"])  # b never sees a's head, only the opening
    assert view.states["previews"] == BranchState(b[1], ["shared"]) and view.value("other") == 1
    view = await store.branch_view("s", a[:2], ["previews"])  # a rewind sees the state as of its point
    assert view.value("previews") == ["shared"]
    assert (await store.branch_view("s", a, ["nothing"])).states == {}
    assert (await store.branch_view("t", a, ["previews"])).states == {}
    assert (await store.branch_view("s", a, [])).states == {}


@pytest.mark.parametrize("length", [8, 600])  # the SQLite store seeks a short chain's prefixes, reads a long one's rows
async def test_a_branch_view_of_a_long_chain_reads_the_same_nearest_states(store: SessionStore, length: int) -> None:
    opening = [system(), *(user(f"note {i}") for i in range(length))]
    run_a = [*opening, assistant("a1"), user("a2")]
    run_b = [*opening, assistant("b1"), user("b2")]
    a = (await store.reconcile("s", "main", run_a)).chain_hashes
    b = (await store.reconcile("s", "main", run_b)).chain_hashes
    await store.put_state("s", a[3], "previews", ["early"])
    await store.put_state("s", a[-3], "previews", ["shared"])
    await store.put_state("s", a[-1], "previews", ["a only"])
    await store.put_state("s", b[-1], "other", "b only")
    await store.reconcile("t", "main", run_a)
    await store.put_state("t", a[-1], "previews", ["another session"])
    view = await store.branch_view("s", a, ["previews", "other"])
    assert view.states == {"previews": BranchState(a[-1], ["a only"])}
    view = await store.branch_view("s", b, ["previews", "other"])
    assert view.states == {"previews": BranchState(b[-3], ["shared"]), "other": BranchState(b[-1], "b only")}
    start = await store.begin_turn("s", "main", [*run_b, assistant("b3")], ["previews", "other"])
    assert start.view.value("previews") == ["shared"] and start.view.value("other") == "b only"


async def test_begin_turn_reconciles_numbers_and_reads_in_one_call(store: SessionStore) -> None:
    first = conversation(2)
    start = await store.begin_turn("s", "main", first, ["previews"], branch_counter="calls", calibration="route:m")
    hashes = chain_hashes(first)
    assert start.reconciliation.created and start.reconciliation.chain_hashes == tuple(hashes)
    assert len(start.reconciliation.new_messages) == len(first)
    assert start.turn == 1 and start.branch == BranchCount(1, None)
    assert start.view.states == {} and start.view.checkpoints == {} and start.calibration is None
    assert await stored_messages(store, "s", hashes[-1]) == first

    await store.put_state("s", hashes[2], "previews", ["ref"])
    await store.put_checkpoint("s", hashes[2], {"summary": "s"})
    await store.update_calibration("route:m", "route", lambda _: {"samples": [1.0]})
    longer = [*first, user("next")]
    start = await store.begin_turn("s", "main", longer, ["previews"], branch_counter="calls", calibration="route:m")
    assert not start.reconciliation.created and start.reconciliation.known_count == len(first)
    assert start.turn == 2 and start.branch == BranchCount(2, hashes[-1])  # counted after the call at `first`
    assert start.view.states == {"previews": BranchState(hashes[2], ["ref"])}
    assert start.view.checkpoints == {hashes[2]: {"summary": "s"}}
    assert start.calibration == {"samples": [1.0]}

    # The same history again is a sibling of the call counted at its head, not its child.
    again = await store.begin_turn("s", "main", longer, [], branch_counter="calls")
    assert again.turn == 3 and again.branch == BranchCount(2, hashes[-1])
    # Without a counter nothing is counted along the chain, and the session counter still moves.
    plain = await store.begin_turn("s", "main", longer)
    assert plain.turn == 4 and plain.branch is None
    info = await session_info(store, "s")
    assert info is not None and info.turns == 4


async def test_a_failed_begin_turn_leaves_the_session_as_it_was(store: SessionStore) -> None:
    await store.begin_turn("s", "main", conversation(1))
    bad = [*conversation(1), user("fine"), {"role": "user", "content": float("nan")}]
    with pytest.raises(ValueError):
        await store.begin_turn("s", "main", bad, branch_counter="calls")
    info = await session_info(store, "s")
    assert info is not None and info.turns == 1
    assert (await store.branch_view("s", chain_hashes(bad[:-1]), ["calls"])).states == {}


# --- restart and migrations -----------------------------------------------------------------------


async def test_a_restart_keeps_every_session(backend: Any) -> None:
    first = await backend.open()
    messages = [system(), user("go"), call("c1"), result("c1", "the body")]
    r = await first.reconcile("s", "reviewer", messages)
    await first.next_turn("s")
    await first.put_state("s", r.head_hash, "plan", {"step": 2})
    await first.put_checkpoint("s", r.head_hash, {"summary": "so far"})
    await first.put_skill_ref("s", SkillRef("titration", "rev-1", r.head_hash))
    await first.put_internal_steps("s", r.head_hash, [call("p1"), result("p1", "proxy tool output")])
    await first.close()

    second = await backend.open()

    info = await session_info(second, "s")
    assert info is not None and (info.scope, info.turns, info.head_hash) == ("reviewer", 1, r.head_hash)
    assert await stored_messages(second, "s", r.head_hash) == messages
    assert await second.tool_output("s", tool_output_ref(r.head_hash)) == "the body"
    assert await second.state("s", r.head_hash, "plan") == {"step": 2}
    assert await stored_checkpoint(second, "s", r.head_hash) == {"summary": "so far"}
    assert await second.skill_refs("s") == [SkillRef("titration", "rev-1", r.head_hash)]
    assert await second.internal_steps("s", r.head_hash) == [call("p1"), result("p1", "proxy tool output")]
    assert await second.next_turn("s") == 2
    again = await second.reconcile("s", "main", messages)
    assert (again.created, again.new_messages) == (False, [])


# Only PostgreSQL has replicas opening one location together; a second SQLite store on an open file is
# refused (tests/session/test_sqlite_files.py), and its migrations rerun at every restart (above).
@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
async def test_migrations_are_idempotent_and_safe_to_run_at_once(backend: Any) -> None:
    # Two stores opening a fresh location together, as two replicas starting at the same moment do.
    a, b = backend.make(), backend.make()
    backend.opened += [a, b]
    await asyncio.gather(a.open(), b.open())
    versions = await backend.versions()
    assert versions == [1, 2, 3, 4, 5]

    await a.reconcile("s", "main", conversation(1))
    await a.open()  # opening an open store is a no-op
    c = await backend.open()
    assert await backend.versions() == versions
    assert await session_info(c, "s") is not None


async def test_a_secret_is_made_once_and_shared_by_replicas_and_restarts(backend: Any) -> None:
    # Two replicas asking at the same moment on a fresh location get one secret, not one each (replicas
    # share a PostgreSQL database; a SQLite folder is served by one process, so there one store asks twice).
    a = await backend.open()
    b = await backend.open() if backend.name == "postgres" else a
    first, second = await asyncio.gather(a.secret("framing"), b.secret("framing"))
    assert first == second and len(first) == SECRET_BYTES
    await a.close()
    restarted = await backend.open()
    assert await restarted.secret("framing") == first
    other = await restarted.secret("another")
    assert len(other) == SECRET_BYTES and other != first


async def test_calibration_is_shared_by_replicas_and_kept_over_restarts(backend: Any) -> None:
    a = await backend.open()
    b = await backend.open() if backend.name == "postgres" else a

    def append(sample: float) -> Any:
        return lambda current: {"samples": [*(current or {"samples": []})["samples"], sample]}

    # Concurrent updates of one route take turns in one transaction each: none is lost.
    await asyncio.gather(
        *(store.update_calibration("route:m", "route", append(i)) for i, store in enumerate([a, b] * 5))
    )
    stored = await b.calibration("route:m")
    assert sorted(stored["samples"]) == list(range(10))
    await a.close()
    restarted = await backend.open()
    assert await restarted.calibration("route:m") == stored
    assert await restarted.calibration("route:other") is None


async def test_calibration_of_client_named_models_is_bounded(store: SessionStore) -> None:
    await store.update_calibration("route:configured", "route", lambda _: {"n": 0})
    for index in range(5):
        await store.update_calibration(f"model:m{index}", "model", lambda _, i=index: {"n": i}, keep=3)
        await asyncio.sleep(0.002)  # distinct update times, so "most recent" is well defined

    kept = [key for key in (f"model:m{i}" for i in range(5)) if await store.calibration(key) is not None]
    assert kept == ["model:m2", "model:m3", "model:m4"]
    assert await store.calibration("route:configured") == {"n": 0}  # another group is never trimmed


# --- side records ---------------------------------------------------------------------------------


async def test_state_channels_round_trip_per_prefix(store: SessionStore) -> None:
    r = await store.reconcile("s", "main", conversation(1))
    h = r.head_hash
    await store.reconcile("t", "main", conversation(1))

    await store.put_state("s", h, "plan", {"steps": ["a", "b"], "done": 1})
    await store.put_state("s", h, "notes", ["x", 2, None, "nul \x00 and a lone \ud800 survive"])
    await store.put_state("s", h, "plan", {"steps": ["a", "b"], "done": 2})

    assert await store.state("s", h, "plan") == {"steps": ["a", "b"], "done": 2}
    assert await store.state("s", h, "notes") == ["x", 2, None, "nul \x00 and a lone \ud800 survive"]
    assert await store.state("s", h, "missing") is None
    assert await store.state("s", "0" * 64, "plan") is None
    assert await store.state("t", h, "plan") is None
    with pytest.raises(UnknownSession):
        await store.put_state("never-seen", h, "plan", 1)


async def test_checkpoints_round_trip_by_covered_hash(store: SessionStore) -> None:
    messages = conversation(2)
    r = await store.reconcile("s", "main", messages)
    hashes = chain_hashes(messages)

    await store.put_checkpoint("s", hashes[2], {"summary": "first", "sections": {"goal": "g"}})
    await store.put_checkpoint("s", hashes[4], {"summary": "second"})
    await store.put_checkpoint("s", hashes[2], {"summary": "first, revised"})

    assert await stored_checkpoint(store, "s", hashes[2]) == {"summary": "first, revised"}
    assert await stored_checkpoint(store, "s", r.head_hash) == {"summary": "second"}
    assert await stored_checkpoint(store, "s", hashes[1]) is None
    stored = (await store.branch_view("s", hashes, [])).checkpoints
    assert stored == {hashes[2]: {"summary": "first, revised"}, hashes[4]: {"summary": "second"}}
    assert list(stored) == [hashes[2], hashes[4]]
    assert (await store.branch_view("other", hashes, [])).checkpoints == {}
    with pytest.raises(UnknownSession):
        await store.put_checkpoint("never-seen", hashes[2], {})


async def test_skill_refs_are_idempotent_and_ordered(store: SessionStore) -> None:
    r = await store.reconcile("s", "main", conversation(1))
    first = SkillRef("pipetting", "r1", r.head_hash)
    second = SkillRef("pipetting", "r2", r.head_hash)
    third = SkillRef("centrifuge", "r1", r.head_hash)

    for ref in (first, second, first, third, second):
        await store.put_skill_ref("s", ref)

    assert await store.skill_refs("s") == [first, second, third]
    assert await store.skill_refs("other") == []
    with pytest.raises(UnknownSession):
        await store.put_skill_ref("never-seen", first)


async def test_internal_steps_append_in_order_per_anchor(store: SessionStore) -> None:
    messages = conversation(2)
    await store.reconcile("s", "main", messages)
    hashes = chain_hashes(messages)
    round_one = [call("p1"), result("p1", "lines 1-10")]
    round_two = [call("p2"), result("p2", "lines 11-20")]

    await store.put_internal_steps("s", hashes[3], round_one)
    await store.put_internal_steps("s", hashes[3], round_two)

    assert await store.internal_steps("s", hashes[3]) == round_one + round_two
    assert await store.internal_steps("s", hashes[4]) == []
    assert await store.internal_steps("other", hashes[3]) == []
    with pytest.raises(UnknownSession):
        await store.put_internal_steps("never-seen", hashes[3], round_one)


async def test_begin_turn_writes_the_samples_earlier_answers_taught_and_reads_the_route_after_them(
    backend: Any,
) -> None:
    a = await backend.open()
    b = await backend.open() if backend.name == "postgres" else a

    def append(sample: float) -> Any:
        return lambda current: {"samples": [*(current or {"samples": []})["samples"], sample]}

    await a.update_calibration("route:m", "route", append(0))
    updates = [CalibrationUpdate("route:m", "route", append(i)) for i in (1, 2)]
    updates += [CalibrationUpdate("model:x", "model", append(9), keep=3)]
    messages = [{"role": "user", "content": "go"}]
    start = await a.begin_turn("ctx-cal", "main", messages, calibration="route:m", calibration_updates=updates)
    assert start.calibration == {"samples": [0, 1, 2]}  # in their order, and read as they leave the route
    assert await b.calibration("route:m") == {"samples": [0, 1, 2]}  # committed with the turn
    assert await b.calibration("model:x") == {"samples": [9]}
    # Two turns of two sessions at once, each writing samples of both routes: both commit.
    both = [CalibrationUpdate("route:m", "route", append(3)), CalibrationUpdate("model:x", "model", append(8))]
    await asyncio.gather(
        a.begin_turn("ctx-cal-1", "main", messages, calibration_updates=both),
        b.begin_turn("ctx-cal-2", "main", messages, calibration_updates=list(reversed(both))),
    )
    assert (await a.calibration("route:m"))["samples"] == [0, 1, 2, 3, 3]
    assert (await a.calibration("model:x"))["samples"] == [9, 8, 8]


async def test_a_tool_body_is_stored_once(backend: Any) -> None:
    store = await backend.open()
    body = "diffraction frame 7: " + "0.125 " * 2_000
    r = await store.reconcile("s", "main", [system(), user("go"), call("c1"), result("c1", body)])
    assert await store.tool_output("s", tool_output_ref(r.head_hash)) == body
    assert await copies_of(store, body) == {"messages": 1}  # it was in tool_outputs too


async def test_migration_5_drops_the_second_copy_and_bodies_still_read_back(backend: Any, monkeypatch) -> None:
    # A store as the previous release left it: schema version 4, each tool body in its message and in
    # tool_outputs.
    for module in (sqlite_schema, postgres_schema):
        monkeypatch.setattr(module, "MIGRATIONS", module.MIGRATIONS[:4])
    old = await backend.open()
    body = "the old release's tool body " * 50
    r = await old.reconcile("s", "main", [system(), user("go"), call("c1"), result("c1", body)])
    ref = tool_output_ref(r.head_hash)
    if isinstance(old, SqliteSessionStore):
        await old._w().write(
            lambda conn: conn.execute(
                "INSERT INTO tool_outputs (context_id, ref, chain_hash, body) VALUES (?, ?, ?, ?)",
                ("s", ref, r.head_hash, body),
            )
        )
    else:
        assert isinstance(old, PostgresSessionStore)
        await old._write(
            lambda conn: conn.execute(
                "INSERT INTO tool_outputs (context_id, ref, chain_hash, body) VALUES ($1, $2, $3, $4)",
                "s",
                ref,
                r.head_hash,
                body,
            )
        )
    assert await copies_of(old, body) == {"messages": 1, "tool_outputs": 1}
    await old.close()
    monkeypatch.undo()

    upgraded = await backend.open()
    assert await backend.versions() == [1, 2, 3, 4, 5]
    assert await copies_of(upgraded, body) == {"messages": 1}
    assert await upgraded.tool_output("s", ref) == body
