"""Runs that open alike (pass@k, parallel seeds, no session header) are separate branches of one session.

Through real HTTP on both store backends: they run in parallel instead of queueing behind one lock,
each provider call carries exactly its own run's history, identical requests still take turns and
store one copy, and what compaction decided for one run (previews) never shows in another.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import openai
import pytest

from proxy.ingress.front_door import identify
from proxy.kernel.canonical import chain_hashes
from proxy.kernel.config import ModelRoute
from proxy.provider.science_script import is_summary_request
from proxy.provider.scripted import Reply, ToolCall
from proxy.session import open_store
from tests.integration.conftest import STORE_BACKENDS, route_to, store_url_for
from tests.session.store_rows import session_info

RUNS = 10
STEPS = 8  # model calls per run: seven tool steps, then the answer
LATENCY = 0.5
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "measure",
            "description": "Take a measurement.",
            "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}, "required": ["step"]},
        },
    }
]
OPENING = [
    {"role": "system", "content": "You are a lab agent."},
    {"role": "user", "content": "Calibrate the instrument."},
]


@pytest.fixture(params=STORE_BACKENDS)
async def store_url(request: pytest.FixtureRequest) -> AsyncIterator[str | None]:
    """``None`` (the SQLite default) or a fresh PostgreSQL schema, dropped afterwards."""
    async for url in store_url_for(request.param, "test_branches", pool_size=4, lock_connections=RUNS + 2):
        yield url


def _script(body: dict[str, Any]) -> Reply:
    """Seven tool steps, then an answer; the calls are the same in every run (only the results differ)."""
    done = sum(1 for m in body["messages"] if m.get("role") == "tool")
    if done < STEPS - 1:
        return Reply(tool_calls=(ToolCall("measure", {"step": done + 1}, id=f"call_{done + 1}"),))
    return Reply(content="calibrated")


def _result(run: str, step: int) -> str:
    return f"[{run}] reading {step}: {uuid.uuid5(uuid.NAMESPACE_OID, f'{run}-{step}').hex}"


async def _run(client: Any, run: str, opening: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One agent run without a session header: call, execute the tool with this run's result, repeat."""
    messages = [dict(m) for m in opening]
    for _ in range(STEPS):
        response = await client.chat.completions.create(model="test-model", messages=messages, tools=TOOLS)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return messages
        for call in message.tool_calls:
            step = json.loads(call.function.arguments)["step"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": _result(run, step)})
    raise AssertionError(f"{run} did not finish in {STEPS} calls")


def _runs_in(body: dict[str, Any]) -> set[str]:
    return {m["content"].split("]")[0][1:] for m in body["messages"] if m.get("role") == "tool"}


async def test_runs_with_one_opening_run_in_parallel_each_with_its_own_history(
    start_proxy: Callable[..., Any], provider: Any, store_url: str | None
) -> None:
    provider.script(_script)
    provider.provider.latency = LATENCY
    proxy = start_proxy(store_url=store_url, trace_enabled=True)
    client = proxy.async_client()
    try:
        started = time.perf_counter()
        alone = await _run(client, "solo", [OPENING[0], {"role": "user", "content": "Calibrate it alone."}])
        one_run = time.perf_counter() - started

        started = time.perf_counter()
        histories = await asyncio.gather(*(_run(client, f"run{k}", OPENING) for k in range(RUNS)))
        ten_runs = time.perf_counter() - started
        print(f"one run {one_run:.2f}s, {RUNS} runs with one opening {ten_runs:.2f}s")
    finally:
        await client.close()

    assert len(alone) == 2 + 2 * (STEPS - 1) + 1
    # The runs overlapped at the provider (one session lock would have let one call through at a time)...
    assert provider.provider.most_concurrent >= RUNS // 2
    # Only the identical first requests take turns; from the first tool result on the runs overlap.
    assert ten_runs < 3 * one_run, f"{RUNS} runs took {ten_runs:.2f}s, one run {one_run:.2f}s"
    assert len(provider.history) == STEPS * (RUNS + 1)
    for body in provider.history:
        assert len(_runs_in(body)) <= 1, f"a provider call mixed runs: {_runs_in(body)}"
    for k, history in enumerate(histories):
        run = f"run{k}"
        assert [m["content"] for m in history if m["role"] == "tool"] == [_result(run, s) for s in range(1, STEPS)]
        seen = [b for b in provider.history if _runs_in(b) == {run}]
        assert len(seen) == STEPS - 1  # every call after its first carried this run's results, and only those
        last = max(seen, key=lambda b: len(b["messages"]))
        tool_results = [m["content"] for m in last["messages"] if m.get("role") == "tool"]
        assert tool_results == [_result(run, s) for s in range(1, STEPS)]

    # One context id (the shared fingerprint), distinct trace files, and each run readable on its own.
    folder = proxy.settings.data_dir / "context-traces" / identify({}, {"messages": OPENING}).context_id
    traces = [json.loads(p.read_text()) for p in sorted(folder.glob("turn-*.json"))]
    shared = [t for t in traces if t["llmInput"]["messages"][1]["content"] == OPENING[1]["content"]]
    assert len(shared) == RUNS * STEPS and len({t["turn"] for t in shared}) == RUNS * STEPS
    by_head = {t["session"]["headHash"]: t for t in shared}
    for k in range(RUNS):
        mine = [t for t in shared if _runs_in(t["llmInput"]) == {f"run{k}"}]
        last = max(mine, key=lambda t: t["session"]["branch"]["turn"])
        chain = [last]
        while chain[-1]["session"]["branch"]["parentHeadHash"] is not None:
            chain.append(by_head[chain[-1]["session"]["branch"]["parentHeadHash"]])
        assert [t["session"]["branch"]["turn"] for t in reversed(chain)] == list(range(1, STEPS + 1))


async def test_identical_requests_sent_together_take_turns_and_store_one_copy(
    start_proxy: Callable[..., Any], provider: Any, store_url: str | None
) -> None:
    provider.script(lambda body: Reply(content="ok"))
    provider.provider.latency = LATENCY
    proxy = start_proxy(store_url=store_url)
    client = proxy.async_client()
    messages = [*OPENING, {"role": "assistant", "content": "Which instrument?"}, {"role": "user", "content": "The pH"}]
    try:
        started = time.perf_counter()
        answers = await asyncio.gather(
            *(client.chat.completions.create(model="test-model", messages=messages) for _ in range(2))
        )
        both = time.perf_counter() - started
        identical_overlap, provider.provider.most_concurrent = provider.provider.most_concurrent, 0
        others = [
            [*messages, {"role": "assistant", "content": "ok"}, {"role": "user", "content": f"now {n}"}]
            for n in range(2)
        ]
        await asyncio.gather(*(client.chat.completions.create(model="test-model", messages=m) for m in others))
    finally:
        await client.close()

    assert [a.choices[0].message.content for a in answers] == ["ok", "ok"]
    # The second waited for the first (one branch, one turn at a time)...
    assert identical_overlap == 1 and both >= 2 * LATENCY
    # ...while two different continuations of that history are served at the same time.
    assert provider.provider.most_concurrent == 2
    proxy.stop()  # the proxy holds its SQLite store until it ends
    store = open_store(store_url, proxy.settings.data_dir, 5.0)
    await store.open()
    try:
        context_id = identify({}, {"messages": messages}).context_id
        info = await session_info(store, context_id)
        transcript = await store.transcript(context_id, chain_hashes(messages)[-1])
    finally:
        await store.close()
    assert info is not None and info.turns == 4
    # Both identical requests succeeded and the store holds their history once.
    assert [m.message["content"] for m in transcript] == [m["content"] for m in messages]
    assert [m.position for m in transcript] == [0, 1, 2, 3]


def _route(provider_url: str) -> ModelRoute:
    return route_to(provider_url, window=6_000, max_output=1_000)


def _body(tag: str, size: int) -> str:
    words = [f"{tag}{i % 97}" for i in range(size)]
    return " ".join(words)


def _step(call_id: str, body: str) -> list[dict[str, Any]]:
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "measure", "arguments": '{"step": 1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": body},
    ]


async def test_previews_of_one_run_never_show_in_another(
    start_proxy: Callable[..., Any], provider: Any, store_url: str | None
) -> None:
    proxy = start_proxy(store_url=store_url, models=(_route(provider.url),))
    client = proxy.async_client()
    shared = [*OPENING, *_step("c1", _body("alpha", 600))]
    run_a = [*shared, *_step("c2", _body("beta", 1_500))]
    run_b = [*shared, *_step("c3", "a short reading")]
    try:
        await client.chat.completions.create(model="test-model", messages=run_a, tools=TOOLS)
        await client.chat.completions.create(model="test-model", messages=run_b, tools=TOOLS)
        await client.chat.completions.create(
            model="test-model", messages=[*run_a, {"role": "user", "content": "go on"}], tools=TOOLS
        )
    finally:
        await client.close()

    def first_body(sent: dict[str, Any]) -> str:
        return next(m["content"] for m in sent["messages"] if m.get("tool_call_id") == "c1")

    a_first, b_sent, a_again = provider.history
    assert "ref=" in first_body(a_first)  # run A was over the threshold: its oldest body became a preview
    assert first_body(b_sent) == shared[-1]["content"]  # run B is not, and A's decision is not B's
    assert "ref=" in first_body(a_again)  # ...while A's next turn keeps its own preview in place


def _skill_script(body: dict[str, Any]) -> Reply:
    """Read the skill (a proxy-owned tool), then measure (the client's tool), then answer."""
    called = [c["function"]["name"] for m in body["messages"] for c in m.get("tool_calls") or []]
    if "read_skill" not in called:
        return Reply(tool_calls=(ToolCall("read_skill", {"name": "titration"}),))
    if "measure" not in called:
        return Reply(tool_calls=(ToolCall("measure", {"step": 1}),))
    return Reply(content="done")


def _skill_calls(body: dict[str, Any]) -> list[str]:
    return [
        c["id"] for m in body["messages"] for c in m.get("tool_calls") or [] if c["function"]["name"] == "read_skill"
    ]


async def test_proxy_steps_of_identical_first_requests_stay_with_their_runs(
    start_proxy: Callable[..., Any], provider: Any, store_url: str | None, tmp_path: Any
) -> None:
    skills = tmp_path / "skills" / "titration"
    skills.mkdir(parents=True)
    (skills / "SKILL.md").write_text("---\nname: titration\ndescription: Titrate.\n---\nAdd base dropwise.\n")
    provider.script(_skill_script)
    proxy = start_proxy(store_url=store_url, contributor_options={"skills": {"folder": str(skills.parent)}})
    client = proxy.async_client()
    try:
        firsts = [await client.chat.completions.create(model="test-model", messages=OPENING, tools=TOOLS) for _ in "ab"]
        for first, run in zip(firsts, "ab", strict=True):
            message = first.choices[0].message
            (call,) = message.tool_calls or []
            messages = [*OPENING, message.model_dump(exclude_none=True)]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": _result(run, 1)})
            await client.chat.completions.create(model="test-model", messages=messages, tools=TOOLS)
    finally:
        await client.close()

    a_skill, a_measure, b_first, b_measure, a_second, b_second = provider.history
    # The second identical request does not replay the first one's read_skill step: it reads the skill itself.
    assert _skill_calls(b_first) == [] and _skill_calls(b_measure) == ["call_3_0"]
    assert _skill_calls(a_skill) == [] and _skill_calls(a_measure) == ["call_1_0"]
    # Each run's next turn has its own proxy step back in place, and only that one.
    assert _skill_calls(a_second) == ["call_1_0"]
    assert _skill_calls(b_second) == ["call_3_0"]


def _long_run(tag: str, steps: int) -> list[dict[str, Any]]:
    """Finished steps whose reasoning (assistant text, never previewed) outgrows the window: only a summary helps."""
    messages = [dict(m) for m in OPENING]
    for i in range(steps):
        call_id = f"{tag}{i}"
        step = _step(call_id, _body(f"{tag}r", 150))
        step[0]["content"] = _body(f"{tag}think", 250)
        messages += step
    return messages


async def test_summarizer_back_off_of_one_run_does_not_hold_back_another(
    start_proxy: Callable[..., Any], provider: Any, store_url: str | None
) -> None:
    def script(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return Reply(error_status=500, error_body={"error": {"message": "summarizer down", "type": "server_error"}})
        return Reply(content="ok")

    provider.script(script)
    proxy = start_proxy(store_url=store_url, models=(_route(provider.url),), trace_enabled=True)
    client = proxy.async_client()
    run_a, run_b = _long_run("a", 8), _long_run("b", 8)
    try:
        for messages in (run_a, [*run_a, {"role": "user", "content": "go on"}], run_b):
            await client.chat.completions.create(model="test-model", messages=messages, tools=TOOLS)
    finally:
        await client.close()

    folder = proxy.settings.data_dir / "context-traces" / identify({}, {"messages": OPENING}).context_id
    a_first, a_next, b_first = (json.loads((folder / f"turn-{n:04d}.json").read_text()) for n in (1, 2, 3))
    assert a_first["summarizerCalls"] and "summaryBackoff" not in a_first  # it tried, and the summary failed
    assert "summaryBackoff" in a_next and not a_next["summarizerCalls"]  # so run A waits before trying again
    assert b_first["summarizerCalls"] and "summaryBackoff" not in b_first  # run B is not held back by A's failure


async def test_the_same_history_twice_is_still_a_conflict_a_different_one_is_not(
    start_proxy: Callable[..., Any], provider: Any, store_url: str | None
) -> None:
    provider.script(lambda body: Reply(content="ok"))
    provider.provider.latency = 2.5
    proxy = start_proxy(store_url=store_url, session_lock_seconds=1)
    client = proxy.async_client()
    other = [*OPENING, {"role": "assistant", "content": "Which?"}, {"role": "user", "content": "The pH meter"}]
    try:
        first = asyncio.create_task(client.chat.completions.create(model="test-model", messages=OPENING))
        while not provider.history:  # the first holds its branch's lock once its call reached the provider
            await asyncio.sleep(0.02)
        same, different = await asyncio.gather(
            client.chat.completions.with_raw_response.create(model="test-model", messages=OPENING),
            client.chat.completions.create(model="test-model", messages=other),
            return_exceptions=True,
        )
        await first
    finally:
        await client.close()

    assert isinstance(same, openai.ConflictError) and same.status_code == 409
    assert same.body["code"] == "session_busy"
    assert not isinstance(different, BaseException) and different.choices[0].message.content == "ok"
    assert len(provider.history) == 2  # the refused request never reached the provider
