"""``TurnService`` with the dynamic assembler, a real SQLite store and a ``FunctionBackend``: no HTTP, no litellm.

Proxy-owned tool rounds use ``find_tools`` (offered while a deferred client tool waits for promotion).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.builder import build_service
from proxy.context import estimators
from proxy.kernel.config import ModelRoute, Settings
from proxy.kernel.errors import ContextOverflow, SessionConflict
from proxy.provider.function import FunctionBackend, Handler, completion, tool_call
from proxy.runtime.answers import Completion, LiveStream, TurnResult
from proxy.runtime.service import TurnService
from proxy.runtime.session_identity import SessionIdentity
from proxy.session.sqlite import SqliteSessionStore

SECRET = b"k" * 32
ROUTE = ModelRoute(
    model_name="m", litellm_params={"model": "openai/m"}, max_input_tokens=16_000, max_output_tokens=2_000
)
IDENTITY = SessionIdentity("ctx-turn", "header:x-session-id", "main")
MEASURE = {"type": "function", "function": {"name": "measure", "parameters": {"type": "object"}}}
LIMS = {
    "type": "function",
    "function": {
        "name": "mcp__lims__lookup",
        "description": "Look up a LIMS sample.",
        "parameters": {"type": "object"},
    },
}


def body(stream: bool = False, tools: tuple[dict[str, Any], ...] = (MEASURE, LIMS)) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "Measure sample 7."}],
        "tools": list(tools),
        "stream": stream,
    }


def runner_for(
    tmp_path: Path, store: SqliteSessionStore, handler: Handler, **overrides: Any
) -> tuple[TurnService, FunctionBackend]:
    settings = Settings(
        **{
            "data_dir": tmp_path / "data",
            "models": (ROUTE,),
            "trace_enabled": True,
            "contributor_options": {"capabilities": {"deferred": ["mcp__*"]}},
            "framing_secret": SECRET,
            **overrides,
        }
    )
    backend = FunctionBackend(handler)
    return build_service(settings, store, backend, lambda model: (None, None), SECRET), backend


def traces(tmp_path: Path) -> dict[str, dict[str, Any]]:
    folder = tmp_path / "data" / "context-traces" / IDENTITY.context_id
    return {path.name: json.loads(path.read_text()) for path in sorted(folder.glob("turn-*.json"))}


def names(message: dict[str, Any]) -> list[str]:
    return [call["function"]["name"] for call in message.get("tool_calls") or []]


def answered(llm_input: dict[str, Any]) -> bool:
    """True once the model has a ``find_tools`` result to look at."""
    return llm_input["messages"][-1]["role"] == "tool"


async def test_a_proxy_round_runs_the_tool_and_asks_the_model_again(tmp_path: Path, store: SqliteSessionStore) -> None:
    def handler(llm_input: dict[str, Any]) -> dict[str, Any]:
        if answered(llm_input):
            return completion({"content": "Found it."})
        return completion({"content": None, "tool_calls": [tool_call("c1", "find_tools", '{"query": "lims"}')]})

    runner, backend = runner_for(tmp_path, store, handler)
    result = await runner.run(body(), IDENTITY, ROUTE)

    assert isinstance(result.answer, Completion)
    assert result.answer.message["content"] == "Found it." and "tool_calls" not in result.answer.message
    _, second = backend.history
    offered = [[t["function"]["name"] for t in call["tools"]] for call in backend.history]
    assert "find_tools" in offered[0] and "mcp__lims__lookup" not in offered[0]
    assert "mcp__lims__lookup" in offered[1]  # promoted by the round
    step, result_message = second["messages"][-2:]
    assert names(step) == ["find_tools"] and result_message["tool_call_id"] == "c1"
    assert "mcp__lims__lookup" in result_message["content"]
    assert sorted(traces(tmp_path)) == ["turn-0001.json", "turn-0002.json"]  # one trace per model call


async def test_a_mixed_answer_is_a_proxy_round_and_its_client_calls_are_dropped(
    tmp_path: Path, store: SqliteSessionStore
) -> None:
    def handler(llm_input: dict[str, Any]) -> dict[str, Any]:
        calls = [tool_call("c2", "measure", '{"sample": 7}')]
        if not answered(llm_input):
            calls.insert(0, tool_call("c1", "find_tools", '{"query": "lims"}'))
        return completion({"content": None, "tool_calls": calls})

    runner, backend = runner_for(tmp_path, store, handler)
    result = await runner.run(body(), IDENTITY, ROUTE)

    assert len(backend.history) == 2
    assert names(backend.history[1]["messages"][-2]) == ["find_tools"]  # the stored step has no client call
    assert isinstance(result.answer, Completion)
    assert names(result.answer.message) == ["measure"]  # made again, now with the result in view


async def test_an_overflow_is_retried_once_after_a_forced_pass_and_both_attempts_are_traced(
    tmp_path: Path, store: SqliteSessionStore
) -> None:
    def handler(llm_input: dict[str, Any]) -> dict[str, Any]:
        if len(backend.history) == 1:
            raise ContextOverflow("too long", limit=9_000, provider_message="maximum context length is 9000 tokens")
        return completion({"content": "ok"})

    runner, backend = runner_for(tmp_path, store, handler)
    result = await runner.run(body(tools=(MEASURE,)), IDENTITY, ROUTE)

    assert isinstance(result.answer, Completion) and result.answer.message["content"] == "ok"
    assert len(backend.history) == 2
    written = traces(tmp_path)
    assert sorted(written) == ["turn-0001-recovery-1.json", "turn-0001.json"]
    assert written["turn-0001.json"]["providerError"]["code"] == "context_length_exceeded"
    retry = written["turn-0001-recovery-1.json"]
    assert retry["recovery"] == {
        "attempt": 1,
        "reason": "provider_context_overflow",
        "providerMessage": "maximum context length is 9000 tokens",
    }
    assert retry["compaction"]["recovery"] == {"reason": "provider_context_overflow", "statedLimit": 9_000}
    assert retry["budgets"]["modelMaxTokens"] == 9_000 and retry["budgets"]["source"] == "provider_error"


async def test_an_overflow_is_judged_by_the_calibrated_count_of_what_was_sent(
    tmp_path: Path, store: SqliteSessionStore
) -> None:
    # ~4,500 tiktoken tokens: the route's estimate (no samples yet: tiktoken x the 1.25 start margin) is
    # about 5,700, the conservative estimator's about twice the real count. A provider claiming a
    # 6,000-token window cannot be right about this request by the estimate the window was filled by, so
    # the route must not shrink to it (it did while the overflow was counted conservatively).
    text = "The titration curve flattens near the equivalence point. " * 340
    request = {"model": "m", "messages": [{"role": "user", "content": text}], "stream": False}

    def handler(llm_input: dict[str, Any]) -> dict[str, Any]:
        raise ContextOverflow("too long", limit=6_000, provider_message="maximum context length is 6000 tokens")

    runner, _ = runner_for(tmp_path, store, handler)
    accounting = await runner.calibrator.accounting(ROUTE)
    calibrated = accounting.estimator.count_message(request["messages"][0])
    assert calibrated < 6_000 < estimators.ConservativeTokenEstimator().count_message(request["messages"][0])

    with pytest.raises(ContextOverflow):
        await runner.run(request, IDENTITY, ROUTE)
    assert runner.limits_for(ROUTE).model_max_tokens == 16_000 and runner.limits_for(ROUTE).source == "config"


async def test_a_second_overflow_is_surfaced_not_retried_again(tmp_path: Path, store: SqliteSessionStore) -> None:
    def handler(llm_input: dict[str, Any]) -> dict[str, Any]:
        raise ContextOverflow("too long", limit=9_000)

    runner, backend = runner_for(tmp_path, store, handler)
    with pytest.raises(ContextOverflow, match="after one forced compaction retry"):
        await runner.run(body(tools=(MEASURE,)), IDENTITY, ROUTE)
    assert len(backend.history) == 2
    with pytest.raises(ContextOverflow):  # not SessionConflict: the failed turn released its lock
        await runner.run(body(tools=(MEASURE,)), IDENTITY, ROUTE)


async def read_one_and_drop(result: TurnResult) -> dict[str, Any]:
    assert isinstance(result.answer, LiveStream)
    chunk = await result.answer.__anext__()
    await result.answer.aclose()
    return chunk


async def test_a_live_stream_holds_the_lock_until_the_client_drops_it(
    tmp_path: Path, store: SqliteSessionStore
) -> None:
    runner, backend = runner_for(tmp_path, store, lambda _: completion({"content": "a long answer"}))
    streamed = body(stream=True, tools=(MEASURE,))  # no deferred tool: no proxy tool, relayed live
    result = await runner.run(streamed, IDENTITY, ROUTE)

    with pytest.raises(SessionConflict):  # the same branch waits for the stream that owns its lock
        await runner.run(streamed, IDENTITY, ROUTE)
    assert (await read_one_and_drop(result))["choices"][0]["delta"]["role"] == "assistant"
    assert backend.streams_closed == backend.streams_opened == 1  # the provider stream was closed
    assert "turn-0001.json" in traces(tmp_path)  # its trace written when it was dropped
    again = await runner.run(streamed, IDENTITY, ROUTE)  # the lock was released
    await read_one_and_drop(again)


async def test_a_stream_stays_live_when_proxy_tools_are_offered(tmp_path: Path, store: SqliteSessionStore) -> None:
    runner, backend = runner_for(tmp_path, store, lambda _: completion({"content": "done"}))
    result = await runner.run(body(stream=True), IDENTITY, ROUTE)  # a deferred tool: find_tools is offered
    assert isinstance(result.answer, LiveStream)
    first = await result.answer.__anext__()
    assert backend.streams_closed == 0  # the client has its first chunk while the provider still streams
    chunks = [first] + [chunk async for chunk in result.answer]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "done"
    assert backend.streams_closed == 1
    again = await runner.run(body(stream=True), IDENTITY, ROUTE)  # the stream's end released the lock
    await read_one_and_drop(again)


async def test_a_trace_that_cannot_be_written_leaves_the_answer_and_releases_the_lock(
    tmp_path: Path, store: SqliteSessionStore
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the trace folder should be")
    runner, _ = runner_for(tmp_path, store, lambda _: completion({"content": "unchanged"}), trace_dir=blocker)
    first = await runner.run(body(tools=(MEASURE,)), IDENTITY, ROUTE)
    second = await runner.run(body(tools=(MEASURE,)), IDENTITY, ROUTE)  # would wait and fail if still locked
    for result in (first, second):
        assert isinstance(result.answer, Completion) and result.answer.message["content"] == "unchanged"
    assert runner.traces is not None and runner.traces.failures == 2


async def test_past_the_round_limit_proxy_calls_are_removed_from_the_answer(
    tmp_path: Path, store: SqliteSessionStore
) -> None:
    def handler(llm_input: dict[str, Any]) -> dict[str, Any]:
        return completion({"content": None, "tool_calls": [tool_call("c", "find_tools", '{"query": "nothing"}')]})

    runner, backend = runner_for(tmp_path, store, handler, max_tool_rounds=2)
    result = await runner.run(body(), IDENTITY, ROUTE)

    assert len(backend.history) == 3  # the first call and two rounds
    assert isinstance(result.answer, Completion)
    message = result.answer.message
    assert "tool_calls" not in message and result.answer.response["choices"][0]["finish_reason"] == "stop"
    assert message["content"] == "[context-proxy: the model was still calling proxy-owned tools after 2 rounds]"


class CountingStore:
    """The store with the name of every awaited call recorded: each is one round trip to its thread."""

    def __init__(self, inner: SqliteSessionStore) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name == "turn_lock" or not inspect.iscoroutinefunction(attribute):
            return attribute

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return await attribute(*args, **kwargs)

        return counted


async def test_a_small_turn_makes_one_store_call(tmp_path: Path, store: SqliteSessionStore) -> None:
    counting = CountingStore(store)
    runner, _ = runner_for(tmp_path, counting, lambda llm_input: completion({"content": "ok"}))
    await runner.run(body(), IDENTITY, ROUTE)
    key = runner.calibrator.stored_key(ROUTE)
    assert key is not None and await store.calibration(key) is None  # the sample waits for the next turn
    await runner.run(
        {**body(), "messages": [*body()["messages"], {"role": "assistant", "content": "ok"}]}, IDENTITY, ROUTE
    )
    # begin_turn before each provider call (reconcile, numbering, branch state, checkpoints, calibration),
    # which also writes the samples the answers before it taught.
    assert counting.calls == ["begin_turn"] * 2
    assert [t["session"]["branch"]["turn"] for t in traces(tmp_path).values()] == [1, 2]
    assert await store.calibration(key) == {"samples": []}  # the first answer's (too small to teach anything)
    await runner.calibrator.flush()  # what the app does on shutdown
    assert counting.calls == ["begin_turn"] * 2 + ["update_calibration"]


async def test_an_overflow_retry_and_a_proxy_round_read_the_branch_state_again(
    tmp_path: Path, store: SqliteSessionStore
) -> None:
    # What the first attempt wrote (a checkpoint, previews) must be what the retry sees, not the
    # view read when the turn began.
    def overflow_once(llm_input: dict[str, Any]) -> dict[str, Any]:
        if len(backend.history) == 1:
            raise ContextOverflow("too long", limit=9_000)
        return completion({"content": "ok"})

    counting = CountingStore(store)
    runner, backend = runner_for(tmp_path, counting, overflow_once)
    await runner.run(body(tools=(MEASURE,)), IDENTITY, ROUTE)
    assert counting.calls[:2] == ["begin_turn", "branch_view"]

    def one_round(llm_input: dict[str, Any]) -> dict[str, Any]:
        if answered(llm_input):
            return completion({"content": "Found it."})
        return completion({"content": None, "tool_calls": [tool_call("c1", "find_tools", '{"query": "lims"}')]})

    counting = CountingStore(store)
    runner, backend = runner_for(tmp_path, counting, one_round)
    identity = SessionIdentity("ctx-round", "header:x-session-id", "main")
    await runner.run(body(), identity, ROUTE)
    calls = counting.calls
    stored = calls.index("put_internal_steps")
    # The first round needs no read of its own steps (its key is new); the second reads the view and them.
    assert calls[0] == "begin_turn" and "internal_steps" not in calls[:stored]
    assert "branch_view" in calls[stored:] and "internal_steps" in calls[stored:]
    assert len(backend.history) == 2 and backend.history[1]["messages"][-1]["tool_call_id"] == "c1"


async def test_a_resent_history_is_counted_by_chain_hash_in_the_assembly_and_the_calibration(
    tmp_path: Path, store: SqliteSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, backend = runner_for(tmp_path, store, lambda llm_input: completion({"content": "ok"}))
    first = [{"role": "user", "content": f"Measure sample {i}."} for i in range(30)]
    await runner.run({**body(), "messages": first}, IDENTITY, ROUTE)
    digested: list[Any] = []
    real = estimators.message_digest

    def recording(message: Any) -> bytes:
        digested.append(dict(message))
        return real(message)

    monkeypatch.setattr(estimators, "message_digest", recording)
    counted: list[Any] = []
    for kind in (estimators.ConservativeTokenEstimator, estimators.TiktokenEstimator):
        monkeypatch.setattr(kind, "count_message", counting(kind.count_message, counted))
    resent = [dict(m) for m in first] + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "Next."}]
    await runner.run({**body(), "messages": resent}, IDENTITY, ROUTE)
    # Only the two new messages are digested (in the assembly; the calibration then finds every message
    # the assembly counted); the 30 resent ones are looked up by the chain hashes reconciliation gave them.
    assert [m for m in digested if m in first] == []
    assert resent[-2] in digested and resent[-1] in digested
    # Nor is any of them counted again: not by the route's counter, not for the trace's clientTokens.
    assert [m for m in counted if m in first] == []
    assert resent[-1] in counted
    assert len(backend.history) == 2


def counting(method: Any, counted: list[Any]) -> Any:
    """``method`` recording each message it counts."""

    def count_message(self: Any, message: Any) -> int:
        counted.append(dict(message))
        return int(method(self, message))

    return count_message
