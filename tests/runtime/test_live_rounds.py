"""A streamed answer stays live while the proxy runs its own tools (``proxy/runtime/rounds.py``).

``TurnService`` with the dynamic assembler, a real SQLite store and a ``FunctionBackend``; proxy-owned
rounds use ``find_tools`` (offered while a deferred client tool waits for promotion).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.provider.function import completion, tool_call
from proxy.runtime.answers import LiveStream
from proxy.runtime.rounds import ROUND_LIMIT_NOTICE, ChatRoundRelay
from tests.runtime.test_turn import IDENTITY, ROUTE, answered, body, runner_for

FIND = tool_call("p1", "find_tools", '{"query": "lims"}')
MEASURE_CALL = tool_call("c1", "measure", '{"sample": 7}')


def numbered(answer: dict[str, Any], n: int) -> dict[str, Any]:
    """A completion with an id of its own, as each provider call has."""
    return {**answer, "id": f"chatcmpl-{n}", "created": n}


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))


def calls_of(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [call for c in chunks if c.get("choices") for call in c["choices"][0]["delta"].get("tool_calls") or []]


def finishes(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices") and c["choices"][0]["finish_reason"]]


async def test_rounds_stream_on_into_one_answer_and_the_first_token_comes_before_the_proxy_call(
    tmp_path: Path, store: Any
) -> None:
    def handler(llm_input: dict[str, Any]) -> dict[str, Any]:
        if answered(llm_input):
            return numbered(completion({"content": " Found it.", "tool_calls": [MEASURE_CALL]}), 2)
        return numbered(completion({"content": "Let me look.", "tool_calls": [FIND]}), 1)

    runner, backend = runner_for(tmp_path, store, handler)
    result = await runner.run(body(stream=True), IDENTITY, ROUTE)
    assert isinstance(result.answer, LiveStream)
    first = await result.answer.__anext__()
    assert len(backend.history) == 1  # the client reads the first round before the proxy's call is run
    chunks = [first] + [chunk async for chunk in result.answer]

    assert len(backend.history) == 2
    assert text_of(chunks) == "Let me look. Found it."
    assert {c["id"] for c in chunks} == {"chatcmpl-1"}  # one answer: the first round's id
    calls = calls_of(chunks)
    assert [c["function"]["name"] for c in calls if c.get("function", {}).get("name")] == ["measure"]
    assert {c["index"] for c in calls} == {0}  # the client's first call, whatever the provider numbered it
    assert finishes(chunks) == ["tool_calls"]  # one finish, the answer's


async def test_the_next_turn_shows_the_model_its_rounds_not_the_merged_answer(tmp_path: Path, store: Any) -> None:
    seen: list[list[dict[str, Any]]] = []

    def handler(llm_input: dict[str, Any]) -> dict[str, Any]:
        seen.append(llm_input["messages"])
        if len(seen) == 3:
            return completion({"content": "Sample 7 measured."})
        if answered(llm_input):
            return completion({"content": " Found it.", "tool_calls": [MEASURE_CALL]})
        return completion({"content": "Let me look.", "tool_calls": [FIND]})

    runner, _ = runner_for(tmp_path, store, handler)
    result = await runner.run(body(stream=True), IDENTITY, ROUTE)
    assert isinstance(result.answer, LiveStream)
    chunks = [chunk async for chunk in result.answer]
    client_message = {
        "role": "assistant",
        "content": text_of(chunks),
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "measure", "arguments": '{"sample": 7}'}}],
    }
    follow = body(stream=True)
    follow["messages"] += [client_message, {"role": "tool", "tool_call_id": "c1", "content": "pH 7.2"}]
    second = await runner.run(follow, IDENTITY, ROUTE)
    assert isinstance(second.answer, LiveStream)
    assert text_of([chunk async for chunk in second.answer]) == "Sample 7 measured."

    after_user = [m for m in seen[2] if m["role"] != "system"][1:]
    assert [(m["role"], m.get("content")) for m in after_user] == [
        ("assistant", "Let me look."),  # the first round, with the proxy's call
        ("tool", after_user[1]["content"]),  # find_tools' result
        ("assistant", " Found it."),  # the provider's last round in place of the client's merged message
        ("tool", "pH 7.2"),
    ]
    assert [c["function"]["name"] for c in after_user[0]["tool_calls"]] == ["find_tools"]
    assert [c["function"]["name"] for c in after_user[2]["tool_calls"]] == ["measure"]


async def test_a_client_call_already_streamed_is_kept_and_the_proxy_call_dropped(tmp_path: Path, store: Any) -> None:
    runner, backend = runner_for(
        tmp_path, store, lambda _: completion({"content": None, "tool_calls": [MEASURE_CALL, FIND]})
    )
    result = await runner.run(body(stream=True), IDENTITY, ROUTE)
    assert isinstance(result.answer, LiveStream)
    chunks = [chunk async for chunk in result.answer]
    assert len(backend.history) == 1  # the proxy's call is not run: the client's went out first
    assert {c["function"]["name"] for c in calls_of(chunks) if c.get("function", {}).get("name")} == {"measure"}
    assert finishes(chunks) == ["tool_calls"]


async def test_a_client_call_after_a_proxy_call_waits_for_the_next_round(tmp_path: Path, store: Any) -> None:
    def handler(llm_input: dict[str, Any]) -> dict[str, Any]:
        if answered(llm_input):
            return completion({"content": "No need to measure."})
        return completion({"content": None, "tool_calls": [FIND, MEASURE_CALL]})

    runner, backend = runner_for(tmp_path, store, handler)
    result = await runner.run(body(stream=True), IDENTITY, ROUTE)
    assert isinstance(result.answer, LiveStream)
    chunks = [chunk async for chunk in result.answer]
    assert len(backend.history) == 2
    assert calls_of(chunks) == []  # made without the proxy's result: the model was asked again
    assert text_of(chunks) == "No need to measure." and finishes(chunks) == ["stop"]


async def test_past_the_round_limit_a_live_answer_says_so(tmp_path: Path, store: Any) -> None:
    runner, backend = runner_for(
        tmp_path, store, lambda _: completion({"content": None, "tool_calls": [FIND]}), max_tool_rounds=2
    )
    result = await runner.run(body(stream=True), IDENTITY, ROUTE)
    assert isinstance(result.answer, LiveStream)
    chunks = [chunk async for chunk in result.answer]
    assert len(backend.history) == 3  # the first call and two rounds
    assert calls_of(chunks) == [] and text_of(chunks) == ROUND_LIMIT_NOTICE and finishes(chunks) == ["stop"]
    await runner.run(body(), IDENTITY, ROUTE)  # the lock was released


def chunk(n: int, delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": n, "model": "m", "choices": choices}


def test_the_client_gets_the_usage_summed_over_the_rounds() -> None:
    relay = ChatRoundRelay(frozenset({"find_tools"}))
    usage = {"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 64}}
    first = [
        chunk(1, {"role": "assistant", "content": "Looking."}),
        chunk(1, {"tool_calls": [{"index": 0, "id": "p1", "function": {"name": "find_tools", "arguments": "{}"}}]}),
        chunk(1, {}, "tool_calls"),
        {**chunk(1), "usage": usage},
    ]
    out = [event for c in first for event in relay.feed(c)]
    assert text_of(out) == "Looking." and calls_of(out) == []
    assert [c["function"]["name"] for c in relay.round_message()["tool_calls"]] == ["find_tools"]
    out += relay.next_round()
    second = [chunk(2, {"role": "assistant", "content": " Done."}), chunk(2, {}, "stop"), {**chunk(2), "usage": usage}]
    out += [event for c in second for event in relay.feed(c)]
    out += relay.close(frozenset())
    assert text_of(out) == "Looking. Done." and finishes(out) == ["stop"]
    assert [c["usage"] for c in out if c.get("usage")] == [
        {"prompt_tokens": 200, "completion_tokens": 10, "prompt_tokens_details": {"cached_tokens": 128}}
    ]
    assert {c["id"] for c in out} == {"chatcmpl-1"}
    assert relay.client_message()["content"] == "Looking. Done."
    assert relay.last_message()["content"] == " Done."


def test_one_round_without_a_proxy_call_is_relayed_as_the_provider_sent_it() -> None:
    relay = ChatRoundRelay(frozenset({"find_tools"}))
    stream = [chunk(1, {"role": "assistant", "content": "Hi."}), chunk(1, {}, "stop"), {**chunk(1), "usage": {"a": 1}}]
    out = [event for c in stream for event in relay.feed(c)] + relay.close(frozenset())
    assert out == stream
