"""``ChunkReader`` (``proxy/provider/fast/streaming.py``) builds a stream's chunk objects as the openai SDK's own
client builds them: for every chunk, whichever way it is built, the same classes holding the same values
(types included), the same fields set, the same extra keys. Held over generated chunks of every shape an
OpenAI-compatible server sends (text, tool calls, logprobs, usage with details, extra fields, nulls) and
over values strict validation refuses (an ``int`` for a ``float``, a string for an ``int``, a finish reason
the SDK does not list), which go to ``construct_type`` as before. Fails when an SDK upgrade changes how
``construct_type`` builds a chunk that strict validation accepts."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pydantic
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionChunk

from proxy.provider.fast.streaming import ChunkReader

_RESPONSE = httpx.Response(200, request=httpx.Request("POST", "http://provider/v1/chat/completions"))
_SDK = openai.AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1:9/unused")
_OURS = ChunkReader(api_key="unused", base_url="http://127.0.0.1:9/unused")


def _state(value: Any) -> Any:
    """Everything an object holds, with the type of every value: equal states, indistinguishable objects."""
    if isinstance(value, pydantic.BaseModel):
        extra = value.__pydantic_extra__ or {}
        return (
            type(value),
            {key: _state(item) for key, item in value.__dict__.items()},
            {key: _state(item) for key, item in extra.items()},
            frozenset(value.__pydantic_fields_set__),
            value.__pydantic_private__,
        )
    if isinstance(value, list):
        return (list, [_state(item) for item in value])
    if isinstance(value, dict):
        return (dict, {key: _state(item) for key, item in value.items()})
    return (type(value), value)


def _built(client: openai.AsyncOpenAI, data: dict[str, Any]) -> Any:
    copy = json.loads(json.dumps(data))  # each client gets its own decoded chunk, as from the wire
    return client._process_response_data(data=copy, cast_to=ChatCompletionChunk, response=_RESPONSE)


def _strictly_valid(data: dict[str, Any]) -> bool:
    try:
        ChatCompletionChunk.model_validate(json.loads(json.dumps(data)), strict=True)
    except pydantic.ValidationError:
        return False
    return True


_FINISH = st.sampled_from([None, "stop", "length", "tool_calls", "content_filter", "function_call", "eos"])
_TEXT = st.text(max_size=12)
_NUMBER = st.one_of(st.integers(-5, 5), st.floats(-5, 5, allow_nan=False))
_EXTRA = st.dictionaries(  # keys the SDK does not declare, at any level (Azure's content_filter_results...)
    st.sampled_from(["obfuscation", "reasoning_content", "provider_specific_fields", "content_filter_results", "x"]),
    st.one_of(st.none(), _TEXT, _NUMBER, st.lists(_NUMBER, max_size=2), st.dictionaries(st.just("a"), _TEXT)),
    max_size=2,
)


def _with_extra(value: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """``value`` with keys the SDK does not declare added."""
    return _EXTRA.map(lambda extra: {**value, **extra})


_TOOL_CALL = st.fixed_dictionaries(
    {"index": st.integers(0, 3)},
    optional={
        "id": st.one_of(st.none(), _TEXT),
        "type": st.sampled_from(["function", None]),
        "function": st.fixed_dictionaries({}, optional={"name": st.one_of(st.none(), _TEXT), "arguments": _TEXT}),
    },
)
_DELTA = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["assistant", None, "tool"]),
        "content": st.one_of(st.none(), _TEXT),
        "refusal": st.one_of(st.none(), _TEXT),
        "tool_calls": st.one_of(st.none(), st.lists(_TOOL_CALL, max_size=2)),
    },
).flatmap(_with_extra)


def _logprobs(number: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A choice's ``logprobs``: none, or tokens with their log probabilities drawn from ``number``."""
    top = st.fixed_dictionaries({"token": _TEXT, "logprob": number, "bytes": st.none()})
    token = st.fixed_dictionaries(
        {
            "token": _TEXT,
            "logprob": number,
            "bytes": st.one_of(st.none(), st.lists(st.integers(0, 255), max_size=3)),
            "top_logprobs": st.lists(top, max_size=2),
        }
    )
    return st.one_of(st.none(), st.fixed_dictionaries({"content": st.lists(token, max_size=2)}))


_LOGPROBS = _logprobs(_NUMBER)
_CHOICE = st.fixed_dictionaries(
    {"index": st.integers(0, 2), "delta": _DELTA},
    optional={"finish_reason": _FINISH, "logprobs": _LOGPROBS},
).flatmap(_with_extra)
_USAGE = st.fixed_dictionaries(
    {"prompt_tokens": st.integers(0, 10**6), "completion_tokens": st.integers(0, 10**6), "total_tokens": _NUMBER},
    optional={
        "prompt_tokens_details": st.one_of(
            st.none(),
            st.fixed_dictionaries({}, optional={"cached_tokens": st.integers(0, 9), "audio_tokens": st.none()}),
        ),
        "completion_tokens_details": st.one_of(
            st.none(), st.fixed_dictionaries({}, optional={"reasoning_tokens": st.integers(0, 9), "x": _TEXT})
        ),
    },
)
_CHUNK = st.fixed_dictionaries(
    {
        "id": st.just("chatcmpl-1"),
        "object": st.sampled_from(["chat.completion.chunk", "chat.completion"]),
        "model": st.just("m"),
        "choices": st.lists(_CHOICE, max_size=2),
    },
    optional={
        "created": st.one_of(st.integers(0, 2**40), st.floats(0, 10, allow_nan=False), st.just("1")),
        "system_fingerprint": st.one_of(st.none(), _TEXT),
        "service_tier": st.sampled_from([None, "default", "auto", "flex", "scale", "priority", "other"]),
        "usage": st.one_of(st.none(), _USAGE),
    },
).flatmap(_with_extra)


# Chunks whose every value has its field's type: the ones strict validation takes (most of them).
_FLOAT = st.floats(-5, 5, allow_nan=False)
_VALID_LOGPROBS = _logprobs(_FLOAT)
_VALID_CHUNK = st.fixed_dictionaries(
    {
        "id": st.just("chatcmpl-1"),
        "object": st.just("chat.completion.chunk"),
        "created": st.integers(0, 2**40),
        "model": st.just("m"),
        "choices": st.lists(
            st.fixed_dictionaries(
                {"index": st.integers(0, 2), "delta": _DELTA},
                optional={
                    "finish_reason": st.sampled_from([None, "stop", "length", "tool_calls", "content_filter"]),
                    "logprobs": _VALID_LOGPROBS,
                },
            ).flatmap(_with_extra),
            max_size=2,
        ),
    },
    optional={
        "system_fingerprint": st.one_of(st.none(), _TEXT),
        "service_tier": st.sampled_from([None, "default", "auto", "flex", "scale", "priority"]),
        "usage": st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {"prompt_tokens": st.integers(0, 10**6), "completion_tokens": st.integers(0, 10**6)},
                optional={
                    "total_tokens": st.integers(0, 10**6),
                    "prompt_tokens_details": st.one_of(
                        st.none(), st.fixed_dictionaries({}, optional={"cached_tokens": st.integers(0, 9), "y": _TEXT})
                    ),
                },
            ),
        ),
    },
).flatmap(_with_extra)


@settings(max_examples=400, deadline=None)
@given(_VALID_CHUNK)
def test_stream_chunks_are_the_objects_the_sdk_builds(chunk: dict[str, Any]) -> None:
    assert _state(_built(_OURS, chunk)) == _state(_built(_SDK, chunk))


@settings(max_examples=400, deadline=None)
@given(_CHUNK)
def test_chunks_of_any_types_are_the_objects_the_sdk_builds(chunk: dict[str, Any]) -> None:
    """The same over values of other types too, most of which strict validation refuses."""
    assert _state(_built(_OURS, chunk)) == _state(_built(_SDK, chunk))


def test_what_servers_send_takes_the_fast_build() -> None:
    """The chunks an OpenAI-compatible server sends (text, a tool call, the finish, the usage, OpenAI's
    ``obfuscation`` field) are the ones strict validation accepts; a chunk it refuses is still built."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1_700_000_000, "model": "m"}
    sent = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {"content": "hi"}, "logprobs": None, "finish_reason": None}]},
        {
            **base,
            "system_fingerprint": "fp_1",
            "service_tier": "default",
            "obfuscation": "x1",
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "f"}}]},
                    "finish_reason": None,
                }
            ],
        },
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {**base, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}},
    ]
    assert all(_strictly_valid(chunk) for chunk in sent)
    for chunk in sent:
        assert _state(_built(_OURS, chunk)) == _state(_built(_SDK, chunk))
    refused = {**base, "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "eos"}]}
    assert not _strictly_valid(refused)
    assert _built(_OURS, refused).choices[0].finish_reason == "eos"  # kept as the SDK keeps it


def test_other_types_are_built_by_the_sdk() -> None:
    """Only chunks take the fast build: a stream of anything else is the SDK's own."""
    data = {"id": "x", "object": "model", "created": 1, "owned_by": "me"}
    ours = _OURS._process_response_data(data=dict(data), cast_to=openai.types.Model, response=_RESPONSE)
    theirs = _SDK._process_response_data(data=dict(data), cast_to=openai.types.Model, response=_RESPONSE)
    assert _state(ours) == _state(theirs)
