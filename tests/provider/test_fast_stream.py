"""Streams on the fast path (``proxy/provider/fast/streaming.py``) against ``litellm.acompletion``, side by side
over loopback on the ``openai/`` route: the provider receives the same bytes with the same credentials, and
the proxy relays the same chunks (usage chunk included) or raises the same translated error, before the
first chunk and inside the stream. Both paths run litellm's own ``CustomStreamWrapper``, so the one field
litellm's wrapper makes up per call, ``created`` (its clock, not the provider's), is compared for type only.
And the rule: Azure's and Anthropic's streams stay on acompletion; and a litellm upgrade that changes what
the wrapper reads of its logging object fails here.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import socket
from typing import Any

import openai
import pytest

from proxy.kernel.errors import ProxyError
from proxy.provider.fast.streaming import StreamLog, built_inline
from proxy.provider.fast.surface import load
from proxy.provider.litellm_backend import LiteLLMBackend
from tests.provider.test_fast_path import HISTORY, READ_HEADERS, TOOLS, _outcome

ROUTE = {"model": "openai/test"}


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-s1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "test",
        "system_fingerprint": "fp_1",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        **extra,
    }


USAGE = {
    "id": "chatcmpl-s1",
    "object": "chat.completion.chunk",
    "created": 1_700_000_000,
    "model": "test",
    "choices": [],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
}
TEXT = [_chunk({"role": "assistant", "content": ""}), _chunk({"content": "Measur"}), _chunk({"content": "ing."})]
TEXT_END = [*TEXT, _chunk({}, "stop")]
CALL = {"index": 0, "id": "c2", "type": "function", "function": {"name": "meas", "arguments": ""}}
TOOL_CALL = [
    _chunk({"role": "assistant", "content": None, "tool_calls": [CALL]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"name": "ure", "arguments": '{"sam'}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ple": "B"}'}}]}),
    _chunk({}, "tool_calls"),
]


async def _both(provider: Any, reply: dict[str, Any], **llm_input: Any) -> list[tuple[Any, Any]]:
    """(what the provider received, the chunks and how the stream ended) on each path, acompletion first."""
    results = []
    for fast in (False, True):
        api_base = provider.add(**reply)
        backend = LiteLLMBackend(timeout_seconds=30, fast_path=fast)
        arguments = {**ROUTE, "api_base": api_base, "api_key": "sk-test-key", "messages": HISTORY, **llm_input}
        call = backend.provider_arguments({**arguments, "stream": True})
        assert backend._fast is None or backend._fast.accepts(call)
        chunks: list[dict[str, Any]] = []
        ending: Any = "complete"
        try:
            async for chunk in await backend.stream(arguments):
                chunks.append(chunk)
        except ProxyError as error:
            ending = _outcome(error)
        finally:
            await backend.aclose()
        name = api_base.split("/")[3]
        requests = [
            (path.removeprefix(f"/{name}"), {key: value for key, value in headers.items() if key in READ_HEADERS})
            for path, headers in provider.requests[name]
        ]
        results.append(((provider.received[name], requests), (_stable(chunks), ending)))
    return results


def _stable(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chunks with ``created`` checked and set aside: litellm's wrapper stamps its own clock's second."""
    for chunk in chunks:
        assert isinstance(chunk.get("created"), int)
    return [{**chunk, "created": "*"} for chunk in chunks]


def _assert_same(results: list[tuple[Any, Any]]) -> None:
    (slow_sent, slow_outcome), (fast_sent, fast_outcome) = results
    assert json.dumps(fast_sent) == json.dumps(slow_sent)  # key order too: the cassettes pin the bytes
    assert fast_outcome == slow_outcome


CASES = {
    "text": ({"chunks": TEXT_END}, {}),
    "text-usage": ({"chunks": [*TEXT_END, USAGE]}, {"stream_options": {"include_usage": True}}),
    "text-usage-unasked": ({"chunks": [*TEXT_END, USAGE]}, {}),  # a provider that sends usage anyway
    "tool-call": ({"chunks": TOOL_CALL}, {"tools": TOOLS, "tool_choice": "auto", "max_tokens": 50}),
    "tool-call-usage": ({"chunks": [*TOOL_CALL, USAGE]}, {"tools": TOOLS, "stream_options": {"include_usage": True}}),
    "sampling": ({"chunks": TEXT_END}, {"temperature": 0.2, "stop": "END", "seed": 7}),
    "length": ({"chunks": [*TEXT, _chunk({}, "length")]}, {"max_completion_tokens": 3, "user": "u1"}),
    "no-usage-option": ({"chunks": TEXT_END}, {"stream_options": {"include_usage": False}}),
}


@pytest.mark.parametrize(("reply", "llm_input"), CASES.values(), ids=CASES)
async def test_same_request_and_chunks(provider: Any, reply: dict[str, Any], llm_input: dict[str, Any]) -> None:
    results = await _both(provider, reply, **llm_input)
    _assert_same(results)
    (sent, _), (chunks, ending) = results[1]
    assert sent[0]["stream"] is True and ending == "complete" and chunks
    if llm_input.get("stream_options", {}).get("include_usage"):
        assert chunks[-1]["usage"]["total_tokens"] == 15  # the usage chunk reaches the client


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422, 429, 500, 503])
async def test_same_error_for_every_status(provider: Any, status: int) -> None:
    body = {"error": {"message": f"refused with {status}", "type": "invalid_request_error", "code": "x"}}
    _assert_same(await _both(provider, {"status": status, "body": body, "chunks": None}))


async def test_an_overflow_is_still_a_context_overflow(provider: Any) -> None:
    body = {
        "error": {
            "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in "
            "9000 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    results = await _both(provider, {"status": 400, "body": body, "chunks": None})
    _assert_same(results)
    assert results[1][1][1][0] == "ContextOverflow"


@pytest.mark.parametrize(
    "chunks",
    [
        [{"error": {"message": "The server had an error while processing your request.", "type": "server_error"}}],
        [*TEXT, {"error": {"message": "overloaded mid-stream", "type": "server_error", "code": "overloaded"}}],
        [],  # nothing but [DONE]
        [_chunk({})],  # an empty delta only
        TEXT,  # no finish_reason: the stream broke off
    ],
    ids=["error-first", "error-mid-stream", "empty", "empty-delta", "no-finish"],
)
async def test_same_outcome_for_streams_that_are_not_answers(provider: Any, chunks: list[Any]) -> None:
    results = await _both(provider, {"chunks": chunks})
    _assert_same(results)
    assert results[1][1][1] != "complete"


async def test_same_outcome_for_a_stream_that_is_not_sse(provider: Any) -> None:
    _assert_same(await _both(provider, {"body": "<html>bad gateway</html>", "content_type": "text/html"}))


async def test_same_outcome_when_the_provider_is_late(provider: Any) -> None:
    _assert_same(await _both(provider, {"chunks": TEXT_END, "delay": 1.5}, timeout=0.5))


async def test_same_outcome_when_nobody_listens() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    outcomes = []
    for fast in (False, True):
        backend = LiteLLMBackend(timeout_seconds=5, fast_path=fast)
        arguments = {**ROUTE, "api_base": f"http://127.0.0.1:{port}/v1", "api_key": "k", "messages": HISTORY}
        try:
            await backend.stream(arguments)
        except ProxyError as error:
            outcomes.append(_outcome(error))
        finally:
            await backend.aclose()
    assert len(outcomes) == 2 and outcomes[0] == outcomes[1]


def test_which_streams_take_the_fast_path() -> None:
    """``openai/`` streams do, with or without ``stream_options``; Azure's and Anthropic's do not."""
    backend = LiteLLMBackend(timeout_seconds=5)
    assert backend._fast is not None
    messages = [{"role": "user", "content": "hi"}]
    openai_call = {"model": "openai/test", "api_base": "http://h/v1", "api_key": "k", "messages": messages}
    azure_call = {**openai_call, "model": "azure/test-deployment", "api_version": "2024-10-21"}
    anthropic_call = {**openai_call, "model": "anthropic/claude-3-5-sonnet-20240620"}
    accepts = backend._fast.accepts
    assert accepts(backend.provider_arguments({**openai_call, "stream": True}))
    assert accepts(backend.provider_arguments({**openai_call, "stream": True, "stream_options": {"include_usage": 1}}))
    assert not accepts(backend.provider_arguments({**openai_call, "stream": True, "stream_options": "usage"}))
    assert not accepts(backend.provider_arguments({**openai_call, "stream_options": {"include_usage": True}}))
    assert not accepts(backend.provider_arguments({**openai_call, "stream": "yes"}))
    assert not accepts(backend.provider_arguments({**azure_call, "stream": True}))
    assert not accepts(backend.provider_arguments({**anthropic_call, "stream": True}))
    assert accepts(backend.provider_arguments(azure_call)) and accepts(backend.provider_arguments(anthropic_call))


# What litellm's stream wrapper and its chunk builder read or call on the logging object, as of the
# litellm this was written against; ``StreamLog`` stands in for all of it.
WRAPPER_READS = {
    "_deferred_stream_complete_args",  # written, only when the object has ``_on_deferred_stream_complete``
    "async_success_handler",
    "call_type",
    "completion_start_time",
    "dispatch_attempt_failure_handlers",
    "dispatch_success_handlers",
    "failure_handler",
    "is_sync_litellm_request",
    "llm_caching_handler",
    "model_call_details",
    "optional_params",
    "record_failure_after_earlier_rounds",
    "record_native_bedrock_guardrail",
    "response_cost_calculator",
    "success_handler",
    "update_completion_start_time",
}
WRAPPER_MODULES = (
    "litellm.litellm_core_utils.streaming_handler",
    "litellm.litellm_core_utils.streaming_chunk_builder_utils",
)


def test_litellm_still_streams_the_way_the_fast_path_relies_on() -> None:
    """Fails when a litellm upgrade changes the wrapper's constructor, the OpenAI handler's stream options,
    or what the wrapper reads of its logging object (then extend ``StreamLog``, or leave streams to
    acompletion)."""
    parts = load()
    wrapper = set(inspect.signature(parts["CustomStreamWrapper"].__init__).parameters)
    assert {"completion_stream", "model", "logging_obj", "custom_llm_provider", "stream_options"} <= wrapper
    assert "_response_headers" in wrapper
    options = inspect.signature(parts["OpenAIChatCompletion"].get_stream_options).parameters
    assert {"stream_options", "api_base"} <= set(options)
    stream = inspect.signature(openai.AsyncStream.__init__).parameters
    assert {"cast_to", "response", "client"} <= set(stream)
    read: set[str] = set()
    for module in WRAPPER_MODULES:
        read |= set(re.findall(r"logging_obj\.(\w+)", inspect.getsource(importlib.import_module(module))))
    assert read == WRAPPER_READS
    log = StreamLog("test", "openai", [], {}, None)
    assert all(hasattr(log, name) for name in WRAPPER_READS - {"_deferred_stream_complete_args"})
    assert not hasattr(log, "_on_deferred_stream_complete")
    # the end-of-stream step the fast path runs in its own task (``built_inline``): litellm's, word for word
    # but for the thread it runs the builder on
    step = inspect.getsource(parts["CustomStreamWrapper"]._async_build_complete_streaming_response)
    inline = inspect.getsource(built_inline(parts["CustomStreamWrapper"])._async_build_complete_streaming_response)
    litellms = _body_words(step).replace("asyncify(litellm.stream_chunk_builder)(", "BUILDER(")
    assert litellms == _body_words(inline).replace("_litellm().stream_chunk_builder(", "BUILDER(")


def _body_words(source: str) -> str:
    """A method's body without its signature, comments, blank space and return annotations."""
    body = source.split(":\n", 1)[1]
    body = re.sub(r"#.*", "", body)
    return re.sub(r"\s+", "", body).replace("returnawait", "return").replace(",)", ")")
