"""litellm's real response objects, serialized, validate against OpenAI's official schemas."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import jsonschema
import pytest

from proxy.provider.serialize import StreamSerializer, chunk_to_openai, response_to_openai

# Warnings litellm 1.110 raises inside its own streaming code under pydantic 2.11+: one, once, about a
# TypedDict it cannot protect; the other on every usage chunk (include_usage).
pytestmark = [
    pytest.mark.filterwarnings("ignore:Item .* is using the `ReadOnly` qualifier:UserWarning"),
    pytest.mark.filterwarnings(
        "ignore:Accessing the 'model_\\w+' attribute on the instance is deprecated"
        ":pydantic.warnings.PydanticDeprecatedSince211"
    ),
]

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}


def _response(message: dict[str, Any], finish: str = "stop", **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish, **extra}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "test-model",
        "choices": [choice],
        "usage": USAGE,
    }


def _chunk(
    delta: dict[str, Any] | None, finish: str | None = None, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    chunk: dict[str, Any] = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 1700000000, "model": "m"}
    chunk["choices"] = (
        [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    )
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def _call(index: int, name: str | None = None, arguments: str | None = None, id: str | None = None) -> dict[str, Any]:
    function = {k: v for k, v in (("name", name), ("arguments", arguments)) if v is not None}
    call: dict[str, Any] = {"index": index, "function": function}
    if id is not None:
        call.update(id=id, type="function")
    return call


TEXT_STREAM = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"content": "Sunny"}),
    _chunk({"content": " today."}),
    _chunk({}, "stop"),
    _chunk(None, usage=USAGE),
]
TOOL_STREAM = [
    _chunk({"role": "assistant", "content": None, "tool_calls": [_call(0, "get_weather", "", id="call_1")]}),
    _chunk({"tool_calls": [_call(0, arguments='{"city":')]}),
    _chunk({"tool_calls": [_call(0, arguments='"Paris"}')]}),
    _chunk({}, "tool_calls"),
    _chunk(None, usage=USAGE),
]
SPLIT_NAME_STREAM = [
    _chunk({"role": "assistant", "tool_calls": [_call(0, "get_", id="call_1")]}),
    _chunk({"tool_calls": [_call(0, "weather")]}),
    _chunk({"tool_calls": [_call(0, arguments='{"city":"Paris"}')]}),
    _chunk({}, "tool_calls"),
]
REPEATED_NAME_STREAM = [
    _chunk({"role": "assistant", "tool_calls": [_call(0, "get_weather", "", id="call_1")]}),
    _chunk({"tool_calls": [_call(0, "get_weather", '{"city":')]}),
    _chunk({"tool_calls": [_call(0, "get_weather", '"Paris"}')]}),
    _chunk({}, "tool_calls"),
]
PARALLEL_STREAM = [
    _chunk({"role": "assistant", "tool_calls": [_call(0, "get_weather", "", id="call_1")]}),
    _chunk({"tool_calls": [_call(0, arguments='{"city":"Paris"}')]}),
    _chunk({"tool_calls": [_call(1, "get_time", "", id="call_2")]}),
    _chunk({"tool_calls": [_call(1, arguments='{"tz":"CET"}')]}),
    _chunk({}, "tool_calls"),
    _chunk(None, usage=USAGE),
]
EXPECTED_CALLS = {
    "tools": {0: ("call_1", "get_weather", '{"city":"Paris"}')},
    "split_name": {0: ("call_1", "get_weather", '{"city":"Paris"}')},
    "repeated_name": {0: ("call_1", "get_weather", '{"city":"Paris"}')},
    "parallel": {0: ("call_1", "get_weather", '{"city":"Paris"}'), 1: ("call_2", "get_time", '{"tz":"CET"}')},
}
STREAMS = {
    "text": TEXT_STREAM,
    "tools": TOOL_STREAM,
    "split_name": SPLIT_NAME_STREAM,
    "repeated_name": REPEATED_NAME_STREAM,
    "parallel": PARALLEL_STREAM,
}


@pytest.fixture(scope="module")
def response_validator(schemas: dict[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schemas["CreateChatCompletionResponse"])


@pytest.fixture(scope="module")
def chunk_validator(schemas: dict[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schemas["CreateChatCompletionStreamResponse"])


async def _complete(litellm: ModuleType, api_base: str, **kwargs: Any) -> Any:
    return await litellm.acompletion(
        model="openai/test", api_base=api_base, api_key="sk-test", messages=MESSAGES, max_retries=0, **kwargs
    )


async def _stream(litellm: ModuleType, api_base: str, **kwargs: Any) -> list[Any]:
    response = await _complete(litellm, api_base, stream=True, **kwargs)
    return [chunk async for chunk in response]


RESPONSES = {
    "text": _response({"content": "Sunny today."}),
    "tool_calls": _response({"content": None, "refusal": None, "tool_calls": [TOOL_CALL]}, "tool_calls"),
    "empty_tool_calls": _response({"content": "No tools needed.", "tool_calls": []}),
    "reasoning_and_extras": _response(
        {"content": "Sunny.", "reasoning_content": "The user asked about Paris.", "provider_specific_fields": {"x": 1}},
        logprobs={"content": [{"token": "Sunny", "logprob": -0.1, "bytes": [83], "top_logprobs": []}], "refusal": None},
    ),
    "usage_details": {
        **_response({"content": "ok"}),
        "system_fingerprint": "fp_1",
        "service_tier": "default",
        "usage": {
            **USAGE,
            "prompt_tokens_details": {"cached_tokens": 4, "audio_tokens": None},
            "completion_tokens_details": {"reasoning_tokens": 2},
        },
    },
}


@pytest.mark.parametrize("name", list(RESPONSES))
async def test_responses_validate(
    litellm: ModuleType, provider: Any, response_validator: jsonschema.Draft202012Validator, name: str
) -> None:
    response = await _complete(litellm, provider.add(body=RESPONSES[name]))
    raw = response.model_dump()
    out = response_to_openai(response)
    response_validator.validate(out)
    message = out["choices"][0]["message"]
    assert {"content", "refusal"} <= message.keys() and "logprobs" in out["choices"][0]
    assert "function_call" not in message and "provider_specific_fields" not in out["choices"][0]
    sent = RESPONSES[name]["choices"][0]["message"]
    assert message["content"] == sent["content"]
    if name == "tool_calls":
        assert message["tool_calls"] == [TOOL_CALL]
        assert not response_validator.is_valid(raw)  # the raw dump is what the schema rejects
    else:
        assert "tool_calls" not in message
    if name == "reasoning_and_extras":
        assert message["reasoning_content"] == "The user asked about Paris."
        assert out["choices"][0]["logprobs"]["content"][0]["token"] == "Sunny"
    if name == "usage_details":
        assert out["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}
        assert (out["system_fingerprint"], out["service_tier"]) == ("fp_1", "default")


@pytest.mark.parametrize("include_usage", [True, False], ids=["usage", "no_usage"])
@pytest.mark.parametrize("name", list(STREAMS))
async def test_stream_chunks_validate(
    litellm: ModuleType,
    provider: Any,
    chunk_validator: jsonschema.Draft202012Validator,
    name: str,
    include_usage: bool,
) -> None:
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = await _stream(litellm, provider.add(chunks=STREAMS[name], body={}), **options)
    serializer = StreamSerializer()
    sent = [d for chunk in chunks for d in serializer.feed(chunk)] + serializer.finish()
    for out in [chunk_to_openai(chunk) for chunk in chunks] + sent:
        chunk_validator.validate(out)
        for choice in out["choices"]:
            assert "finish_reason" in choice
            assert choice["delta"].get("tool_calls", True)  # never an empty array
    assert any(c["finish_reason"] for out in sent for c in out["choices"])
    usage_chunks = [out for out in sent if "usage" in out]
    if include_usage:  # litellm estimates a usage chunk itself when the provider sends none
        assert usage_chunks[-1]["choices"] == []
        assert usage_chunks[-1]["usage"]["total_tokens"] == 15 or STREAMS[name][-1]["choices"]
    if name == "text":
        assert "".join(c["delta"].get("content", "") for out in sent for c in out["choices"]) == "Sunny today."
    else:
        assert _calls(sent) == EXPECTED_CALLS[name]
    if name in ("split_name", "repeated_name"):  # litellm relays these as the provider sent them
        with pytest.raises(AssertionError, match="arrived twice"):
            _calls([chunk_to_openai(chunk) for chunk in chunks])


def _calls(sent: list[dict[str, Any]]) -> dict[int, tuple[str, str, str]]:
    """Reassemble tool calls as a client does, insisting that each name arrives whole, once."""
    ids: dict[int, str] = {}
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for out in sent:
        for choice in out["choices"]:
            for call in choice["delta"].get("tool_calls", []):
                index = call["index"]
                if "id" in call:
                    ids[index] = call["id"]
                if "name" in call.get("function", {}):
                    assert index not in names, "a tool call's name arrived twice"
                    names[index] = call["function"]["name"]
                arguments[index] = arguments.get(index, "") + call.get("function", {}).get("arguments", "")
    return {index: (ids[index], names[index], arguments[index]) for index in names}


def test_a_stream_that_ends_without_finishing_still_delivers_held_calls() -> None:
    serializer = StreamSerializer()
    out = serializer.feed(_chunk({"role": "assistant", "tool_calls": [_call(0, "get_weather", "", id="call_1")]}))
    assert out and "tool_calls" not in out[0]["choices"][0]["delta"]  # held until its arguments start
    assert _calls(serializer.finish()) == {0: ("call_1", "get_weather", "")}
    assert serializer.finish() == []


def test_dicts_from_other_sources_serialize_too() -> None:
    chunk = _chunk({"role": "assistant", "content": "x", "tool_calls": None, "function_call": None}, "end_turn")
    out = chunk_to_openai(chunk)
    assert out["choices"][0] == {"index": 0, "delta": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}
    response = response_to_openai(_response({"content": "x"}, finish="max_tokens"))
    assert response["choices"][0]["finish_reason"] == "length"
