"""Legacy mode through real HTTP: the SDK gets what the provider answered; the provider gets what the client sent."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from proxy.provider.scripted import Reply, ToolCall

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "measure",
            "description": "Measure a sample.",
            "parameters": {
                "type": "object",
                "properties": {"sample": {"type": "string"}},
                "required": ["sample"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    }
]
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a lab agent."},
    {"role": "user", "content": "Measure sample A."},
]


def _sent_without_model(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "model"}


def test_tool_call_answer_and_request_pass_through_unchanged(provider, start_proxy):
    provider.script(lambda body: Reply(tool_calls=(ToolCall("measure", {"sample": "A"}, id="call_a1"),)))
    route = start_proxy(mode="legacy").settings.models[0]
    # A provider extension passes once the route allows it (allowed_client_params).
    allowing = dataclasses.replace(route, allowed_client_params=frozenset({"vendor_knob"}))
    legacy_proxy = start_proxy(mode="legacy", models=(allowing,))
    client = legacy_proxy.client()

    raw = client.chat.completions.with_raw_response.create(
        model="test-model",
        messages=MESSAGES,
        tools=TOOLS,
        temperature=0.2,
        seed=7,
        extra_body={"vendor_knob": {"x": 1}},
    )
    completion = raw.parse()

    received = provider.history[-1]
    assert received["model"] == "scripted"
    assert _sent_without_model(received) == {
        "messages": MESSAGES,
        "tools": TOOLS,
        "temperature": 0.2,
        "seed": 7,
        "vendor_knob": {"x": 1},
    }
    call = completion.choices[0].message.tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == ("call_a1", "measure", {"sample": "A"})
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.id == "chatcmpl-scripted-1"
    assert completion.usage.prompt_tokens > 0
    assert raw.headers["x-context-mode"] == "legacy"
    assert raw.headers["x-context-id"].startswith("fp-")


def test_streamed_tool_call_keeps_name_whole_and_arguments_complete(provider, legacy_proxy):
    provider.script(lambda body: Reply(tool_calls=(ToolCall("measure", {"sample": "A" * 40}, id="call_s1"),)))
    stream = legacy_proxy.client().chat.completions.create(
        model="test-model", messages=MESSAGES, tools=TOOLS, stream=True, stream_options={"include_usage": True}
    )
    names, arguments, finishes, usage = [], "", [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            finishes.append(choice.finish_reason)
            for call in choice.delta.tool_calls or []:
                if call.function and call.function.name:
                    names.append(call.function.name)
                if call.function and call.function.arguments:
                    arguments += call.function.arguments
    assert names == ["measure"]
    assert json.loads(arguments) == {"sample": "A" * 40}
    assert finishes[-1] == "tool_calls"
    assert usage is not None and usage.prompt_tokens > 0
    assert provider.history[-1]["stream"] is True
    assert provider.history[-1]["stream_options"] == {"include_usage": True}


async def test_async_streamed_text_arrives_whole(provider, legacy_proxy):
    text = "The melting point of sample A is 94.6 C, measured twice."
    provider.script(lambda body: Reply(content=text))
    client = legacy_proxy.async_client()
    stream = await client.chat.completions.create(model="test-model", messages=MESSAGES, stream=True)
    pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
    await client.close()
    assert "".join(pieces) == text
    assert len(pieces) > 2  # relayed as a stream, not one blob


async def test_async_non_streaming_answer(provider, legacy_proxy):
    provider.script(lambda body: Reply(content="done"))
    client = legacy_proxy.async_client()
    completion = await client.chat.completions.create(model="test-model", messages=MESSAGES)
    await client.close()
    assert completion.choices[0].message.content == "done"
    assert completion.choices[0].finish_reason == "stop"


def test_tool_loop_resending_whole_history_reaches_provider_verbatim(provider, legacy_proxy):
    def script(body: dict[str, Any]) -> Reply:
        results = [m for m in body["messages"] if m["role"] == "tool"]
        if len(results) < 2:
            return Reply(tool_calls=(ToolCall("measure", {"sample": f"S{len(results)}"}),))
        return Reply(content="both measured")

    provider.script(script)
    client = legacy_proxy.client()
    messages = list(MESSAGES)
    context_ids = set()
    for _ in range(4):
        raw = client.chat.completions.with_raw_response.create(model="test-model", messages=messages, tools=TOOLS)
        context_ids.add(raw.headers["x-context-id"])
        assert provider.history[-1]["messages"] == messages
        message = raw.parse().choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": f"result of {call.function.arguments}"}
            )
    assert messages[-1]["content"] == "both measured"
    assert len(provider.history) == 3
    assert len(context_ids) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_content_part_arrays_pass_through(provider, legacy_proxy, stream):
    # (A "developer" message would reach this non-OpenAI host as "system": litellm's provider adaptation.)
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
            ],
        },
    ]
    result = legacy_proxy.client().chat.completions.create(model="test-model", messages=messages, stream=stream)
    if stream:
        list(result)
    assert provider.history[-1]["messages"] == messages


def test_client_disconnect_cancels_the_upstream_stream_and_frees_the_session(provider, legacy_proxy):
    import time

    provider.script(lambda body: Reply(content="x" * 400), chunk_delay=0.05)  # 25 chunks, ~1.3 s
    client = legacy_proxy.client()
    headers = {"x-session-id": "gone-away"}
    stream = client.chat.completions.create(model="test-model", messages=MESSAGES, stream=True, extra_headers=headers)
    next(iter(stream))
    stream.close()  # the client goes away after the first chunk
    deadline = time.monotonic() + 5
    while provider.provider.streams_abandoned == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert provider.provider.streams_abandoned == 1
    assert provider.provider.streams_finished == 0
    provider.script(lambda body: Reply(content="next turn"))
    again = client.chat.completions.create(model="test-model", messages=MESSAGES, extra_headers=headers)
    assert again.choices[0].message.content == "next turn"  # the session's lock was released
