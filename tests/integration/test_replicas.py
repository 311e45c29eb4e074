"""Two real proxy processes on one PostgreSQL schema serve the same sessions, turn by turn.

The replicas are ``python -m proxy serve`` subprocesses with their own data dirs (traces on) and one
``CONTEXT_PROXY_STORE_URL`` naming a fresh schema; litellm reaches a scripted provider served in this
process. The process and load harness is ``bench/replicas.py`` (loaded by path, so the benchmark and
this proof drive exactly the same load); the benchmark measures, this file asserts.

Needs PostgreSQL (``CONTEXT_PROXY_TEST_PG``, default ``postgresql://postgres@127.0.0.1:5432/test``):
skipped when unreachable, failed instead under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import asyncpg
import httpx
import pytest

from proxy.context.checkpoint import Checkpoint, render_sections
from proxy.context.nonce import SECRET_NAME, session_nonce
from proxy.provider.scripted import Reply, ScriptedProvider, serve_in_thread
from proxy.session import open_store
from proxy.session.store import SessionStore
from tests.session.store_rows import session_info, stored_checkpoint

pytestmark = pytest.mark.postgres

SESSIONS = 30
TURNS = 20
HANDOFF_TURN = 10  # after this turn the test writes a checkpoint, the other replica serves the next


def _load_harness() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "replicas.py"
    spec = importlib.util.spec_from_file_location("bench_replicas", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


harness = _load_harness()


@pytest.fixture
async def pg_dsn() -> str:
    """A reachable PostgreSQL; skip (or under CI=true, fail) when there is none."""
    dsn, why = await harness.find_postgres()
    if dsn is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{why}; CI=true requires the replica tests to run")
        pytest.skip(f"{why}; set CONTEXT_PROXY_TEST_PG to run the replica tests")
    return str(dsn)


@pytest.fixture
async def store_url(pg_dsn: str) -> AsyncIterator[str]:
    """``CONTEXT_PROXY_STORE_URL`` naming a fresh schema, dropped after the test (replicas create it)."""
    schema = harness.new_schema("test_replicas")
    try:
        yield harness.store_url(pg_dsn, schema)
    finally:
        await harness.drop_schema(pg_dsn, schema)


@pytest.fixture
def start_replicas(tmp_path: Path) -> Iterator[Callable[..., list[Any]]]:
    """Start replica processes; every one started is stopped (killed if need be) after the test."""
    started: list[Any] = []

    def start(count: int, provider_url: str, env: dict[str, str], max_input_tokens: int = 128_000) -> list[Any]:
        config = harness.write_config(tmp_path / "config.yaml", provider_url, max_input_tokens)
        for number in range(count):
            started.append(harness.start_replica(f"replica-{'ab'[number]}", tmp_path, config, env))
        return started[-count:]

    yield start
    for replica in started:
        replica.stop()


def _provider_calls_per_session(history: list[dict[str, Any]]) -> Counter[str | None]:
    return Counter(harness.session_of(body) for body in history)


def _traces(replicas: list[Any], sid: str) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    """Every trace file of a session, by file name, with the replica index that wrote it."""
    found: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for index, replica in enumerate(replicas):
        folder = replica.trace_dir / sid
        for path in sorted(folder.glob("turn-*.json")) if folder.is_dir() else []:
            found.setdefault(path.name, []).append((index, json.loads(path.read_text())))
    return found


async def test_thirty_sessions_alternating_between_two_replicas_are_stored_once_and_exactly(
    store_url: str, start_replicas: Callable[..., list[Any]], tmp_path: Path
) -> None:
    """30 concurrent sessions x 20 tool-loop turns, each turn on the other replica than the last.

    Proves: every session finishes; the stored transcript is exactly what its client last sent, on one
    branch (no fork, no stray rows); each session's turn counter equals its model calls; trace files
    turn-0001..turn-0020 exist once across both replicas, each in the folder of the replica the client
    sent that turn to, and each turn's reconciliation found every message the previous turn (on the
    other replica) stored; a checkpoint written into the shared store after turn 10 by a store opened
    from the replicas' own URL (standing in for the process store of the replica that served turn 10)
    is used by the other replica from turn 11 on: its compaction reuses it and the model sees it.

    Here the hand-off checkpoint is written through the store; a checkpoint a replica's own summarizer
    wrote is reused by the other in ``test_a_checkpoint_one_replica_wrote_is_reused_by_the_other``.
    """
    provider = ScriptedProvider(harness.tool_loop_script(TURNS))
    writer = open_store(store_url, tmp_path / "unused", lock_timeout_seconds=10)
    reader = open_store(store_url, tmp_path / "unused", lock_timeout_seconds=10)
    written: dict[str, tuple[str, Checkpoint]] = {}

    async def hand_off(run: Any, turn: int) -> None:
        # Between turn 10 (one replica) and turn 11 (the other): store a checkpoint keyed to the chain
        # hash the serving replica left as the session's head.
        if turn != HANDOFF_TURN:
            return
        index = run.served_by[-1]
        info = await session_info(writer, run.session_id)
        assert info is not None
        head = info.head_hash
        # A well-formed record, as the compactor stores it: the dynamic pipeline of the next replica
        # reads every stored checkpoint of the session, and must be able to reuse this one.
        text = render_sections(
            {
                "completed_work": f"Steps 1-{turn - 1} of {run.session_id} measured on replica {index}.",
                "next_step": f"Look up step {turn}.",
            }
        )
        checkpoint = Checkpoint(text=text, covers_hash=head, covered_messages=2 * turn - 2)
        await writer.put_checkpoint(run.session_id, head, checkpoint.to_record())
        written[run.session_id] = (head, checkpoint)

    with serve_in_thread(provider.app()) as provider_url:
        replicas = start_replicas(2, provider_url, {"CONTEXT_PROXY_STORE_URL": store_url})
        await harness.wait_ready(replicas)
        await writer.open()
        try:
            runs, _ = await harness.drive([r.url for r in replicas], "rep", SESSIONS, TURNS, hand_off)
        except harness.TurnFailed as exc:
            logs = "\n".join(f"--- {r.name} log ---\n{r.log_tail(60)}" for r in replicas)
            pytest.fail(f"{exc}\n{logs}")
        finally:
            await writer.close()

    calls = _provider_calls_per_session(provider.history)
    await reader.open()
    try:
        for run in runs:
            await _check_session(run, replicas, reader, calls[run.session_id], written[run.session_id])
        await _check_no_stray_rows(reader, runs)
    finally:
        await reader.close()
    assert sum(calls.values()) == SESSIONS * TURNS  # no call the harness did not make


async def _check_session(
    run: Any, replicas: list[Any], store: SessionStore, model_calls: int, handoff: tuple[str, Checkpoint]
) -> None:
    sid = run.session_id
    assert run.answer == f"finished after {TURNS - 1} steps", sid
    assert len(run.served_by) == TURNS and set(run.served_by) == {0, 1}, sid

    traces = _traces(replicas, sid)
    # Both replicas frame the session with one nonce: the store's secret is shared.
    nonce = session_nonce(await store.secret(SECRET_NAME), sid)
    assert sorted(traces) == [f"turn-{turn:04d}.json" for turn in range(1, TURNS + 1)], sid
    for turn in range(1, TURNS + 1):
        copies = traces[f"turn-{turn:04d}.json"]
        assert [index for index, _ in copies] == [run.served_by[turn - 1]], (sid, turn, "written once, by its server")
        trace = copies[0][1]
        # Turn k sends 2k messages; all but the 2 new ones were stored by the other replica's turn k-1.
        assert trace["turn"] == turn
        assert (trace["session"]["knownMessages"], trace["session"]["newMessages"]) == (2 * turn - 2, 2), (sid, turn)
        assert trace["session"]["forked"] is False, (sid, turn)
        # The checkpoint written after turn 10 is reused by every later turn (turn 11 on the other
        # replica first) and stands in the model's input for the steps it covers.
        reused = (trace["compaction"] or {}).get("reusedCheckpoint")
        shown = handoff[1].message(nonce) in trace["llmInput"]["messages"]
        assert (reused, shown) == ((handoff[0], True) if turn > HANDOFF_TURN else (None, False)), (sid, turn)
    head = traces[f"turn-{TURNS:04d}.json"][0][1]["session"]["headHash"]

    info = await session_info(store, sid)
    assert info is not None and info.head_hash == head
    assert info.turns == model_calls == TURNS, sid
    transcript = await store.transcript(sid, head)
    assert [message.message for message in transcript] == run.sent, sid

    covers, checkpoint = handoff
    assert transcript[2 * HANDOFF_TURN - 1].chain_hash == covers  # the branch continued past it
    assert await stored_checkpoint(store, sid, covers) == checkpoint.to_record()
    assert run.served_by[HANDOFF_TURN] != run.served_by[HANDOFF_TURN - 1]  # turn 11 ran on the other replica


async def _check_no_stray_rows(store: Any, runs: list[Any]) -> None:
    """Each session holds exactly its 40 messages: a turn applied twice or on a fork would add rows."""
    conn = await asyncpg.connect(store.dsn, server_settings={"search_path": store.schema})
    try:
        rows = await conn.fetch("SELECT context_id, count(*) AS n FROM messages GROUP BY context_id")
    finally:
        await conn.close()
    assert {row["context_id"]: row["n"] for row in rows} == {run.session_id: 2 * TURNS for run in runs}


async def test_a_turn_of_a_session_busy_on_the_other_replica_gets_409_session_busy(
    store_url: str, start_replicas: Callable[..., list[Any]]
) -> None:
    """While replica A serves a slow turn of a session, the same session's request on replica B waits
    the configured CONTEXT_PROXY_SESSION_LOCK_SECONDS (1 s) and then gets 409 ``session_busy``; once
    A's turn is done, B serves the session."""
    release = threading.Event()

    def script(body: dict[str, Any]) -> Reply:
        # Blocks the provider's thread, which is fine: the only other request must never reach it.
        if body["messages"][-1]["content"] == "slow":
            release.wait(timeout=20)
        return Reply(content="done")

    provider = ScriptedProvider(script)
    slow = [{"role": "user", "content": "slow"}]
    with serve_in_thread(provider.app()) as provider_url:
        env = {"CONTEXT_PROXY_STORE_URL": store_url, "CONTEXT_PROXY_SESSION_LOCK_SECONDS": "1"}
        a, b = start_replicas(2, provider_url, env)
        await harness.wait_ready([a, b])
        async with httpx.AsyncClient(timeout=30) as http:

            async def send(replica: Any, messages: list[dict[str, Any]]) -> httpx.Response:
                body = {"model": harness.MODEL, "messages": messages}
                return await http.post(
                    f"{replica.url}/v1/chat/completions", json=body, headers={"x-session-id": "busy"}
                )

            first = asyncio.create_task(send(a, slow))
            try:
                async with asyncio.timeout(20):
                    while not provider.history:  # A holds the session's lock once its call reached the provider
                        await asyncio.sleep(0.02)
                started = asyncio.get_running_loop().time()
                try:
                    async with asyncio.timeout(8):
                        second = await send(b, slow)
                except TimeoutError:
                    pytest.fail("replica B neither refused nor served the busy session: its turn was not serialized")
                waited = asyncio.get_running_loop().time() - started
            finally:
                release.set()
            assert (await first).status_code == 200

            then = await send(b, [*slow, {"role": "assistant", "content": "done"}, {"role": "user", "content": "next"}])

    assert second.status_code == 409, second.text
    error = second.json()["error"]
    assert (error["type"], error["code"]) == ("conflict_error", "session_busy")
    assert set(error) == {"message", "type", "param", "code"} and "busy" in error["message"]
    assert 0.9 <= waited < 10  # the bounded wait, not an immediate refusal nor the provider's hold
    assert then.status_code == 200, then.text
    assert len(provider.history) == 2  # the refused request never reached the provider


async def test_a_checkpoint_one_replica_wrote_is_reused_by_the_other(
    start_replicas: Callable[..., list[Any]], store_url: str
) -> None:
    """Real compaction across replicas: a long run in a small window makes the replica serving a turn
    summarize (the scripted model writes the checkpoint); the other replica's next turn applies that
    stored checkpoint instead of summarizing again."""
    from proxy.provider.science_script import TOOLS, ScienceModel, client_tool_result

    steps = 30  # tiktoken-based counts compact less often than the conservative ones did
    model = ScienceModel(steps)
    provider = ScriptedProvider(model, token_scale=1.0)  # counts as tiktoken: the window means what it says
    with serve_in_thread(provider.app()) as provider_url:
        replicas = start_replicas(2, provider_url, {"CONTEXT_PROXY_STORE_URL": store_url}, max_input_tokens=16_000)
        await harness.wait_ready(replicas)
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"Run the {steps}-step protocol."}]
        async with httpx.AsyncClient(timeout=60) as http:
            for turn in range(steps + 2):
                replica = replicas[turn % 2]
                body = {"model": harness.MODEL, "messages": messages, "tools": TOOLS}
                response = await http.post(
                    f"{replica.url}/v1/chat/completions", json=body, headers={"x-session-id": "handoff"}
                )
                assert response.status_code == 200, f"{response.text}\n{replica.log_tail()}"
                message = response.json()["choices"][0]["message"]
                messages.append({k: v for k, v in message.items() if v is not None})
                if not message.get("tool_calls"):
                    break
                messages += [client_tool_result(call) for call in message["tool_calls"]]
    assert model.summaries >= 1
    written: dict[str, int] = {}  # covers hash -> replica that summarized it
    reused_elsewhere = []
    for name, found in sorted(_traces(replicas, "handoff").items()):
        ((index, trace),) = found  # every model call traced once, by the replica that made it
        compaction = trace["compaction"] or {}
        if compaction.get("newCheckpoint"):
            written[compaction["checkpointCovers"]] = index
        reused = compaction.get("reusedCheckpoint")
        if reused in written and written[reused] != index:
            reused_elsewhere.append(name)
    assert written, "no replica wrote a checkpoint"
    assert reused_elsewhere, f"no replica reused the other's checkpoint: written {written}"
