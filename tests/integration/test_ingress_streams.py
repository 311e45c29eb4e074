"""Streams of both ingresses through real HTTP: tool-call arguments relayed live, and a provider that
breaks off mid-stream (``Reply.break_after``) ending in the format's own failure event.

Responses: ``response.failed`` after what was already relayed (the official SDK raises nothing and
reports the failed response); Messages: an ``error`` event (the anthropic SDK raises it).
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from proxy.provider.scripted import Reply, ToolCall, estimate_prompt_tokens
from tests.integration.conftest import MODEL

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
LONG_ARGUMENTS = {"city": "Rome", "note": "n" * 300}  # about 30 fragments of 12 characters


def _events(text: str) -> list[dict[str, Any]]:
    """The SSE ``data`` payloads of an answer, in order."""
    found = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                found.append(json.loads(line.removeprefix("data: ")))
    return found


def test_function_call_arguments_stream_while_the_provider_is_still_sending(start_proxy, provider):
    provider.script(
        lambda body: Reply(tool_calls=(ToolCall("get_weather", LONG_ARGUMENTS, id="call_r"),)), chunk_delay=0.02
    )
    proxy = start_proxy()
    finished_at_first_delta = None
    deltas = []
    with proxy.client().responses.stream(model=MODEL, input="weather?", tools=[WEATHER]) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                if finished_at_first_delta is None:
                    finished_at_first_delta = provider.provider.streams_finished
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert finished_at_first_delta == 0  # the first fragment reached the client before the provider's stream ended
    assert len(deltas) > 10
    (call,) = final.output
    assert call.type == "function_call" and call.call_id == "call_r" and call.status == "completed"
    assert json.loads(call.arguments) == LONG_ARGUMENTS == json.loads("".join(deltas))


def test_text_then_call_are_two_items_in_order_with_consistent_indexes(start_proxy, provider):
    reply = Reply(content="Let me check.", tool_calls=(ToolCall("get_weather", {"city": "Oslo"}, id="call_o"),))
    provider.script(lambda body: reply)
    proxy = start_proxy()
    with proxy.client().responses.stream(model=MODEL, input="weather?", tools=[WEATHER]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert final.output[0].content[0].text == "Let me check." and json.loads(final.output[1].arguments) == {
        "city": "Oslo"
    }
    added = {e.output_index: e.item.type for e in events if e.type == "response.output_item.added"}
    done = {e.output_index: e.item.type for e in events if e.type == "response.output_item.done"}
    assert added == done == {0: "message", 1: "function_call"}
    message_done = next(i for i, e in enumerate(events) if e.type == "response.output_item.done")
    call_added = next(
        i for i, e in enumerate(events) if e.type == "response.output_item.added" and e.item.type == "function_call"
    )
    assert message_done < call_added  # the message item is closed before the call item opens


def test_a_provider_stream_cut_mid_call_ends_in_response_failed(start_proxy, provider):
    # Chunks: role, the call's name, then argument fragments; the connection drops after a few of them.
    provider.script(
        lambda body: Reply(tool_calls=(ToolCall("get_weather", LONG_ARGUMENTS, id="call_x"),), break_after=6)
    )
    proxy = start_proxy()
    body = {"model": MODEL, "input": "weather?", "tools": [WEATHER], "stream": True}
    answer = httpx.post(f"{proxy.url}/v1/responses", json=body, timeout=60)
    assert answer.status_code == 200
    events = _events(answer.text)
    types = [e["type"] for e in events]
    assert types[0] == "response.created" and types[-1] == "response.failed"
    assert "response.completed" not in types and "response.function_call_arguments.done" not in types
    assert "response.function_call_arguments.delta" in types  # what came before the cut was relayed
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["message"]
    assert failed["output"][0]["status"] == "incomplete" and failed["output"][0]["type"] == "function_call"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_the_sdk_reports_a_cut_stream_as_a_failed_response(start_proxy, provider):
    provider.script(lambda body: Reply(content="a long answer " * 20, break_after=4))
    proxy = start_proxy()
    with proxy.client().responses.stream(model=MODEL, input="hi") as stream:
        types = [event.type for event in stream]
    assert types[-1] == "response.failed"
    assert "response.output_text.delta" in types


def test_a_messages_stream_cut_mid_answer_ends_in_an_error_event(start_proxy, provider):
    provider.script(lambda body: Reply(content="a long answer " * 20, break_after=4))
    proxy = start_proxy()
    body = {"model": MODEL, "max_tokens": 100, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(f"{proxy.url}/v1/messages", json=body, timeout=60)
    assert answer.status_code == 200
    events = _events(answer.text)
    types = [e["type"] for e in events]
    assert types[0] == "message_start" and "content_block_delta" in types
    assert types[-1] == "error" and "message_stop" not in types
    assert events[-1]["error"]["type"] in ("api_error", "overloaded_error") and events[-1]["error"]["message"]

    client = proxy.anthropic_client()
    user = [{"role": "user", "content": "hi"}]
    with (
        pytest.raises(anthropic.APIStatusError) as caught,
        client.messages.stream(model=MODEL, max_tokens=100, messages=user) as stream,
    ):
        for _ in stream:
            pass
    assert isinstance(caught.value.body, dict) and caught.value.body["type"] == "error"


def test_a_chat_stream_stays_live_through_a_proxy_round(start_proxy, provider):
    """The model says a line and calls the proxy's ``read_tool_output``, then calls the client's tool: the
    official SDK's stream is one answer (one id, the line, the client's call at index 0, usage summed), the
    line arrives while the provider's first round is still streaming, and the proxy's call never shows."""
    measure = {"type": "function", "function": {"name": "measure", "parameters": {"type": "object"}}}

    def script(body: dict[str, Any]) -> Reply:
        if not any(m.get("role") == "tool" for m in body["messages"]):
            return Reply(content="Looking it up.", tool_calls=(ToolCall("read_tool_output", {"ref": "nothing"}),))
        return Reply(tool_calls=(ToolCall("measure", {"sample": 7}),))

    provider.script(script, chunk_delay=0.05)
    client = start_proxy().client()
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Measure sample 7."}],
        tools=[measure],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-session-id": "live-chat"},
    )
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].delta.content:
            # The line came while the provider was still on its first round: one call so far.
            assert len(provider.history) == 1
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []]
    assert text == "Looking it up."
    assert {call.index for call in calls} == {0}
    assert [call.function.name for call in calls if call.function and call.function.name] == ["measure"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    (usage,) = [c.usage for c in chunks if c.usage]
    assert len(provider.history) == 2  # the proxy's round and the client's answer
    # Usage is the sum over both rounds, as the provider counted them (a quarter of each body's messages).
    assert usage.prompt_tokens == sum(estimate_prompt_tokens(body) for body in provider.history)
