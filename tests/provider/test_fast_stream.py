"""Streams on the fast path (``proxy/provider/fast/streaming.py``) against ``litellm.acompletion``, side by side
over loopback, on every route (``openai/``, ``azure/``, ``anthropic/``): the provider receives the same body
bytes at the same path with the same credentials, and the proxy relays the same chunks (usage chunk
included) or raises the same translated error, before the first chunk and inside the stream. Both paths
run litellm's own ``CustomStreamWrapper`` (and, for Anthropic, its own SSE reader), so the fields litellm
makes up per call are compared for their shape only: ``created`` (its wrapper's clock, not the
provider's) everywhere, and on Anthropic's route the chunks' ``id`` (a ``chatcmpl-`` id its SSE reader
draws per stream; Anthropic's message id is not passed on), as on the one-chunk stream litellm makes of
an output-limit 400. And the rule: every route's streams take the fast path; and a litellm upgrade that
changes what the wrapper reads of its logging object, or what the handlers hand it, fails here.
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

from proxy.kernel.errors import EmptyStream, ProxyError
from proxy.provider.fast.streaming import StreamLog, built_inline
from proxy.provider.fast.surface import load
from proxy.provider.litellm_backend import LiteLLMBackend
from tests.acompletion_calls import count_stream_builds
from tests.provider.test_fast_path import HISTORY, READ_HEADERS, ROUTES, TOOLS, _outcome


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


async def _both(
    provider: Any, reply: dict[str, Any], route: str = "openai", *, usage_to_caller: bool = True, **llm_input: Any
) -> list[tuple[Any, Any]]:
    """(what the provider received, the chunks and how the stream ended) on each path, acompletion first;
    ``usage_to_caller`` is what the fast path's stream is told (acompletion's cannot be)."""
    results = []
    for fast in (False, True):
        api_base = provider.add(**reply)
        backend = LiteLLMBackend(timeout_seconds=30, fast_path=fast)
        arguments = {**ROUTES[route], "api_base": api_base, "api_key": "sk-test-key", "messages": HISTORY, **llm_input}
        call = backend.provider_arguments({**arguments, "stream": True})
        assert backend._fast is None or backend._fast.accepts(call)
        chunks: list[dict[str, Any]] = []
        ending: Any = "complete"
        try:
            async for chunk in await backend.stream(arguments, usage_to_caller=usage_to_caller or not fast):
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
        bodies = [body.decode("utf-8") for body in provider.bodies[name]]  # the bytes, not only what they parse to
        results.append(((provider.received[name], requests, bodies), (_stable(chunks, route), ending)))
    return results


def _stable(chunks: list[dict[str, Any]], route: str) -> list[dict[str, Any]]:
    """The chunks with what litellm makes up per call checked and set aside: ``created`` (its wrapper stamps
    its own clock's second), and on Anthropic's route the one ``chatcmpl-`` id its SSE reader draws per
    stream."""
    for chunk in chunks:
        assert isinstance(chunk.get("created"), int)
    made_up = {"created": "*"}
    if route == "anthropic" and chunks:
        assert len({chunk["id"] for chunk in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
        made_up["id"] = "*"
    return [{**chunk, **made_up} for chunk in chunks]


def _assert_same(results: list[tuple[Any, Any]]) -> None:
    (slow_sent, slow_outcome), (fast_sent, fast_outcome) = results
    assert json.dumps(fast_sent) == json.dumps(slow_sent)  # key order and bytes too: the cassettes pin them
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
# Azure's first chunk carries its prompt filter's verdict and no choice; each answer chunk its own verdict.
FILTERED = {
    "id": "",
    "object": "",
    "created": 0,
    "model": "",
    "choices": [],
    "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {"hate": {"filtered": False}}}],
}
AZURE_CASES = {
    "content-filter": ({"chunks": [FILTERED, *TEXT_END, USAGE]}, {"stream_options": {"include_usage": True}}),
    "older-api-version": ({"chunks": TEXT_END}, {"api_version": "2023-05-15", "temperature": 0.2, "max_tokens": 9}),
}
STREAM_CASES = [
    *((route, name, *case) for route in ("openai", "azure") for name, case in CASES.items()),
    *(("azure", name, *case) for name, case in AZURE_CASES.items()),
]


@pytest.mark.parametrize(
    ("route", "reply", "llm_input"),
    [(route, reply, llm_input) for route, _, reply, llm_input in STREAM_CASES],
    ids=[f"{route}-{name}" for route, name, *_ in STREAM_CASES],
)
async def test_same_request_and_chunks(
    provider: Any, route: str, reply: dict[str, Any], llm_input: dict[str, Any]
) -> None:
    results = await _both(provider, reply, route, **llm_input)
    _assert_same(results)
    ((sent, *_), (chunks, ending)) = results[1]
    assert sent[0]["stream"] is True and ending == "complete" and chunks
    if llm_input.get("stream_options", {}).get("include_usage"):
        assert chunks[-1]["usage"]["total_tokens"] == 15  # the usage chunk reaches the client


def _event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, **fields}


def _block_delta(index: int, **delta: Any) -> dict[str, Any]:
    return _event("content_block_delta", index=index, delta=delta)


MESSAGE_START = _event(
    "message_start",
    message={
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-3-5-sonnet-20240620",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 1, "cache_read_input_tokens": 2},
    },
)
ANTHROPIC_TEXT = [
    MESSAGE_START,
    _event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
    _event("ping"),
    _block_delta(0, type="text_delta", text="Measur"),
    _block_delta(0, type="text_delta", text="ing. \u00e9"),
    _event("content_block_stop", index=0),
]


def _message_end(reason: str, output_tokens: int = 3) -> list[dict[str, Any]]:
    return [
        _event(
            "message_delta",
            delta={"stop_reason": reason, "stop_sequence": None},
            usage={"output_tokens": output_tokens},
        ),
        _event("message_stop"),
    ]


ANTHROPIC_TOOL_USE = [
    *ANTHROPIC_TEXT,
    _event(
        "content_block_start", index=1, content_block={"type": "tool_use", "id": "c2", "name": "measure", "input": {}}
    ),
    _block_delta(1, type="input_json_delta", partial_json=""),
    _block_delta(1, type="input_json_delta", partial_json='{"sam'),
    _block_delta(1, type="input_json_delta", partial_json='ple": "B"}'),
    _event("content_block_stop", index=1),
    *_message_end("tool_use"),
]
OVERLOADED = _event("error", error={"type": "overloaded_error", "message": "Overloaded"})
ANTHROPIC_CASES = {
    "text": ({"events": [*ANTHROPIC_TEXT, *_message_end("end_turn")]}, {}),
    "text-usage": (
        {"events": [*ANTHROPIC_TEXT, *_message_end("end_turn")]},
        {"stream_options": {"include_usage": True}},
    ),
    "tool-use": ({"events": ANTHROPIC_TOOL_USE}, {"tools": TOOLS, "tool_choice": "auto", "max_tokens": 50}),
    "tool-use-usage": (
        {"events": ANTHROPIC_TOOL_USE},
        {
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "measure"}},
            "stream_options": {"include_usage": True},
        },
    ),
    "sampling": (
        {"events": [*ANTHROPIC_TEXT, *_message_end("stop_sequence")]},
        {"temperature": 0.2, "top_p": 0.5, "stop": ["END", "STOP"], "user": "u1"},
    ),
    "length": ({"events": [*ANTHROPIC_TEXT, *_message_end("max_tokens")]}, {"max_completion_tokens": 3}),
}


@pytest.mark.parametrize(("reply", "llm_input"), ANTHROPIC_CASES.values(), ids=ANTHROPIC_CASES)
async def test_same_request_and_chunks_on_anthropic(
    provider: Any, reply: dict[str, Any], llm_input: dict[str, Any]
) -> None:
    results = await _both(provider, reply, "anthropic", **llm_input)
    _assert_same(results)
    ((sent, requests, bodies), (chunks, ending)) = results[1]
    assert sent[0]["stream"] is True and ending == "complete" and chunks
    assert requests[0][0].endswith("/v1/messages") and requests[0][1]["x-api-key"] == "sk-test-key"
    assert "\\u00e9" in bodies[0]  # the standard library's json.dumps (ASCII), as litellm's handler sends it
    if llm_input.get("stream_options", {}).get("include_usage"):
        assert chunks[-1]["usage"]["prompt_tokens"] == 14  # the usage chunk reaches the client (cache reads too)


async def test_a_renamed_tool_comes_back_under_its_own_name_on_anthropic(provider: Any) -> None:
    """Anthropic refuses ``/`` in a tool name: litellm sends ``lab_measure`` and its stream reader names the
    call back ``lab/measure`` from the map the request transformation made."""
    tools = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "name": "lab/measure"}}]
    start = _event(
        "content_block_start",
        index=0,
        content_block={"type": "tool_use", "id": "c2", "name": "lab_measure", "input": {}},
    )
    events = [
        MESSAGE_START,
        start,
        _block_delta(0, type="input_json_delta", partial_json="{}"),
        *_message_end("tool_use"),
    ]
    results = await _both(provider, {"events": events}, "anthropic", tools=tools)
    _assert_same(results)
    ((sent, *_), (chunks, _)) = results[1]
    assert sent[0]["tools"][0]["name"] == "lab_measure"
    names = [
        call["function"]["name"] for chunk in chunks for call in chunk["choices"][0]["delta"].get("tool_calls") or []
    ]
    assert "lab/measure" in names


ROUTE_ERRORS = {
    "openai": lambda status: {
        "error": {"message": f"refused with {status}", "type": "invalid_request_error", "code": "x"}
    },
    "azure": lambda status: {
        "error": {"message": f"refused with {status}", "type": "invalid_request_error", "code": "x"}
    },
    "anthropic": lambda status: {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": f"refused with {status}"},
    },
}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422, 429, 500, 503, 529])
async def test_same_error_for_every_status(provider: Any, status: int, route: str) -> None:
    reply = {"status": status, "body": ROUTE_ERRORS[route](status), "chunks": None, "headers": {"retry-after": "11"}}
    _assert_same(await _both(provider, reply, route))


@pytest.mark.parametrize("route", ROUTES)
async def test_an_overflow_is_still_a_context_overflow(provider: Any, route: str) -> None:
    body: dict[str, Any] = {
        "error": {
            "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in "
            "9000 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    if route == "anthropic":
        body = {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "prompt is too long: 8200 tokens > 8192 maximum"},
        }
    results = await _both(provider, {"status": 400, "body": body, "chunks": None}, route)
    _assert_same(results)
    assert results[1][1][1][0] == "ContextOverflow"


@pytest.mark.parametrize("route", ["openai", "azure"])
async def test_an_output_limit_400_is_the_stream_litellm_makes_of_it(provider: Any, route: str) -> None:
    """OpenAI and Azure refuse with a 400 an output budget too small for one token; litellm answers with a
    one-chunk stream ending for ``length`` (its id is litellm's own, drawn per call)."""
    words = "Could not finish the message because max_tokens or model output limit was reached."
    body = {"error": {"message": words, "type": "invalid_request_error", "code": None}}
    results = await _both(provider, {"status": 400, "body": body, "chunks": None}, route, max_completion_tokens=1)
    for _, (chunks, _) in results:
        assert chunks and all(chunk["id"].startswith("chatcmpl-") for chunk in chunks)
        chunks[:] = [{**chunk, "id": "*"} for chunk in chunks]
    _assert_same(results)
    chunks, ending = results[1][1]
    assert ending == "complete" and chunks[-1]["choices"][0]["finish_reason"] == "length"


NOT_ANSWERS = {
    "error-first": [
        {"error": {"message": "The server had an error while processing your request.", "type": "server_error"}}
    ],
    "error-mid-stream": [
        *TEXT,
        {"error": {"message": "overloaded mid-stream", "type": "server_error", "code": "overloaded"}},
    ],
    "empty": [],  # nothing but [DONE]
    "empty-delta": [_chunk({})],  # an empty delta only
    "no-finish": TEXT,  # no finish_reason: the stream broke off
}
ANTHROPIC_NOT_ANSWERS = {
    "error-first": [OVERLOADED],
    "error-after-start": [MESSAGE_START, OVERLOADED],
    "error-mid-stream": [*ANTHROPIC_TEXT, OVERLOADED],
    "api-error-mid-stream": [
        *ANTHROPIC_TEXT,
        _event("error", error={"type": "api_error", "message": "Internal server error"}),
    ],
    "empty": [],
    "start-only": [MESSAGE_START],
    "no-stop": ANTHROPIC_TEXT,  # no message_delta: the stream broke off
}
NOT_ANSWER_CASES = [
    *((route, name, {"chunks": chunks}) for route in ("openai", "azure") for name, chunks in NOT_ANSWERS.items()),
    *(("anthropic", name, {"events": events}) for name, events in ANTHROPIC_NOT_ANSWERS.items()),
]


@pytest.mark.parametrize(
    ("route", "reply"),
    [(route, reply) for route, _, reply in NOT_ANSWER_CASES],
    ids=[f"{route}-{name}" for route, name, _ in NOT_ANSWER_CASES],
)
async def test_same_outcome_for_streams_that_are_not_answers(provider: Any, route: str, reply: dict[str, Any]) -> None:
    results = await _both(provider, reply, route)
    _assert_same(results)
    assert results[1][1][1] != "complete"


async def test_an_overloaded_event_is_the_same_error_on_anthropic(provider: Any) -> None:
    results = await _both(provider, {"events": [*ANTHROPIC_TEXT, OVERLOADED]}, "anthropic")
    _assert_same(results)
    chunks, ending = results[1][1]
    assert chunks and ending[0] != "complete" and "Overloaded" in ending[4]


@pytest.mark.parametrize("route", ROUTES)
async def test_same_outcome_for_a_stream_that_is_not_sse(provider: Any, route: str) -> None:
    _assert_same(await _both(provider, {"body": "<html>bad gateway</html>", "content_type": "text/html"}, route))


@pytest.mark.parametrize("route", ROUTES)
async def test_same_outcome_when_the_provider_is_late(provider: Any, route: str) -> None:
    reply = {"chunks": TEXT_END, "events": [*ANTHROPIC_TEXT, *_message_end("end_turn")], "delay": 1.5}
    results = await _both(provider, reply if route == "anthropic" else {**reply, "events": None}, route, timeout=0.5)
    _assert_same(results)
    assert results[1][1][1][1:4] == (504, "timeout_error", "timeout")


@pytest.mark.parametrize("route", ROUTES)
async def test_same_outcome_when_nobody_listens(route: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    outcomes = []
    for fast in (False, True):
        backend = LiteLLMBackend(timeout_seconds=5, fast_path=fast)
        arguments = {**ROUTES[route], "api_base": f"http://127.0.0.1:{port}/v1", "api_key": "k", "messages": HISTORY}
        try:
            await backend.stream(arguments)
        except ProxyError as error:
            outcomes.append(_outcome(error))
        finally:
            await backend.aclose()
    assert len(outcomes) == 2
    assert outcomes[0] == outcomes[1]  # word for word: both paths connect through litellm's transport


def test_which_streams_take_the_fast_path() -> None:
    """Every route's streams do (``openai/``, ``azure/``, ``anthropic/``), with or without ``stream_options``,
    on the same conditions as their whole answers."""
    backend = LiteLLMBackend(timeout_seconds=5)
    assert backend._fast is not None
    messages = [{"role": "user", "content": "hi"}]
    openai_call = {"model": "openai/test", "api_base": "http://h/v1", "api_key": "k", "messages": messages}
    azure_call = {**openai_call, "model": "azure/test-deployment", "api_version": "2024-10-21"}
    anthropic_call = {**openai_call, "model": "anthropic/claude-3-5-sonnet-20240620"}
    accepts = backend._fast.accepts
    for call in (openai_call, azure_call, anthropic_call):
        assert accepts(backend.provider_arguments(call))
        assert accepts(backend.provider_arguments({**call, "stream": True}))
        assert accepts(backend.provider_arguments({**call, "stream": True, "stream_options": {"include_usage": 1}}))
        assert not accepts(backend.provider_arguments({**call, "stream": True, "stream_options": "usage"}))
        assert not accepts(backend.provider_arguments({**call, "stream_options": {"include_usage": True}}))
        assert not accepts(backend.provider_arguments({**call, "stream": "yes"}))
    # what keeps a route's whole answers on acompletion keeps its streams there too
    assert not accepts(backend.provider_arguments({**azure_call, "stream": True, "api_version": "v1"}))
    assert not accepts(backend.provider_arguments({**azure_call, "stream": True, "model": "azure/o3-mini"}))
    assert not accepts(backend.provider_arguments({**anthropic_call, "stream": True, "n": 2}))
    assert not accepts(backend.provider_arguments({**azure_call, "stream": True, "model": "azure/gpt-5"}))


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


# What the handlers the fast path stands in for do with a stream, in their own words (source text: a
# litellm upgrade that changes one of them changes what the fast path must do). By handler: the lines
# it must still have, and words it must still not have.
HANDLER_PINS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # OpenAI: its stream options added to the body, the output-limit 400 made a one-chunk stream
    "litellm.llms.openai.openai:OpenAIChatCompletion.async_streaming": (
        ('data["stream"] = True', "self.get_stream_options(stream_options=stream_options, api_base=api_base)"),
        (),
    ),
    "litellm.llms.openai.openai:OpenAIChatCompletion.make_openai_chat_completion_request": (
        ("build_output_token_limit_response(",),
        (),
    ),
    # Azure: the config's request as it is (no stream options added), every failure an AzureOpenAIError
    # with the time-out's words, the output-limit 400 made a one-chunk stream
    "litellm.llms.azure.azure:AzureChatCompletion.async_streaming": (
        (
            'stream_options=data.get("stream_options", None)',
            "_response_headers=headers",
            'message: Final = getattr(e, "message", str(e))',
            "response=upstream_error_response(e)",
        ),
        ("get_stream_options",),
    ),
    "litellm.llms.azure.azure:AzureChatCompletion.make_azure_openai_chat_completion_request": (
        (
            'e.message += f" - timeout value={timeout}, time taken={time_delta} seconds"',
            "build_output_token_limit_response(",
        ),
        (),
    ),
    # Anthropic: ``stream`` added last, the body the standard library's JSON, the SSE read by its iterator,
    # the wrapper handed the processed headers and no stream options
    "litellm.llms.anthropic.chat.handler:AnthropicChatCompletion.acompletion_stream_function": (
        ('data["stream"] = True', "data=json.dumps(data)", "_response_headers=process_anthropic_headers(headers)"),
        ("stream_options",),
    ),
    "litellm.llms.anthropic.chat.handler:make_call": (
        (
            "stream=True",
            "message=await e.response.aread()",
            "for exception in litellm.LITELLM_EXCEPTION_TYPES:",
            "raise AnthropicError(status_code=500, message=str(e))",
            "streaming_response=aiter_sse_lines(response.aiter_text())",
        ),
        (),
    ),
}


def _source(name: str) -> str:
    module, qualified = name.split(":")
    found: Any = importlib.import_module(module)
    for part in qualified.split("."):
        found = getattr(found, part)
    return inspect.getsource(found)


def test_litellm_still_streams_the_way_the_fast_path_relies_on() -> None:
    """Fails when a litellm upgrade changes the wrapper's constructor, the OpenAI handler's stream options,
    Anthropic's SSE reader, what the wrapper reads of its logging object, or what a handler does with a
    stream (``HANDLER_PINS``); then adapt ``fast/`` (extend ``StreamLog``), or leave streams to acompletion."""
    parts = load()
    for name, (kept, absent) in HANDLER_PINS.items():
        source = _source(name)
        assert all(line in source for line in kept), name
        assert not any(word in source for word in absent), name
    reader = set(inspect.signature(parts["ModelResponseIterator"].__init__).parameters)
    assert {"streaming_response", "sync_stream", "json_mode", "speed", "tool_name_reverse_map"} <= reader
    assert {"response_format_schema", "response"} <= reader
    assert set(inspect.signature(parts["aiter_sse_lines"]).parameters) == {"text_chunks"}
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
    inline_wrapper = built_inline(parts["CustomStreamWrapper"], parts["stream_chunk_builder"])
    inline = inspect.getsource(inline_wrapper._async_build_complete_streaming_response)
    litellms = _body_words(step).replace("asyncify(litellm.stream_chunk_builder)(", "BUILDER(")
    assert litellms == _body_words(inline).replace("build(", "BUILDER(")


def _body_words(source: str) -> str:
    """A method's body without its signature, comments, blank space and return annotations."""
    body = source.split(":\n", 1)[1]
    body = re.sub(r"#.*", "", body)
    return re.sub(r"\s+", "", body).replace("returnawait", "return").replace(",)", ")")


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return count_stream_builds(monkeypatch)


async def test_the_answer_is_built_once_per_stream(provider: Any, builds: list[int]) -> None:
    """litellm's wrapper rebuilds the whole answer at the stream's end twice (the usage chunk, then its
    callbacks); the fast path builds it once (``built_once``) and still hands on acompletion's chunks."""
    reply, llm_input = CASES["text-usage"]
    results = await _both(provider, reply, "openai", **llm_input)
    _assert_same(results)
    assert results[1][1][1] == "complete" and results[1][1][0][-1]["usage"]["total_tokens"] == 15
    # acompletion's wrapper builds twice (its usage chunk, then its callbacks), the fast path's once; should
    # litellm build once itself, this fails and ``built_once`` has nothing left to save
    assert builds == [5, 5, 5]


@pytest.mark.parametrize("case", ["text", "no-usage-option", "text-usage-unasked"])
async def test_a_stream_without_a_usage_chunk_is_not_built_at_its_end(
    provider: Any, builds: list[int], case: str
) -> None:
    """A stream whose caller asked for no usage gets no usage chunk, so the fast path does not rebuild the
    answer at its end (acompletion does, for its callbacks; with no usage from the provider that counted the
    whole prompt with ``token_counter`` before the stream could end), and its chunks are still acompletion's."""
    reply, llm_input = CASES[case]
    results = await _both(provider, reply, "openai", **llm_input)
    _assert_same(results)
    assert results[1][1][1] == "complete"
    assert len(builds) == 1  # acompletion's own, for its callbacks; none on the fast path


@pytest.mark.parametrize("route", ["openai", "azure"])
@pytest.mark.parametrize("case", ["text-usage", "tool-call-usage"])
async def test_a_usage_only_the_proxy_asked_for_is_the_providers_own_not_rebuilt(
    provider: Any, builds: list[int], route: str, case: str
) -> None:
    """The usage the proxy asks for itself (a chat client that did not, in dynamic mode) reaches no client:
    the fast path's stream ends with the provider's own usage instead of the usage chunk litellm's wrapper
    builds by rebuilding the whole answer after the last chunk. The provider gets the same bytes; every
    other chunk is acompletion's, and so are the usage's figures."""
    reply, llm_input = CASES[case]
    results = await _both(provider, reply, route, usage_to_caller=False, **llm_input)
    (slow_sent, (slow_chunks, slow_ending)), (fast_sent, (fast_chunks, fast_ending)) = results
    assert json.dumps(fast_sent) == json.dumps(slow_sent)
    assert '"include_usage":true' in fast_sent[2][0].replace(" ", "")  # the provider was asked for its usage
    assert fast_ending == slow_ending == "complete"
    assert fast_chunks[:-1] == slow_chunks[:-1]
    # The stream's id and clock; its model the stream's chunks' (litellm names Azure's deployment in its own).
    assert fast_chunks[-1]["id"] == slow_chunks[-1]["id"] and fast_chunks[-1]["model"] == fast_chunks[0]["model"]
    assert fast_chunks[-1]["choices"] == [] and fast_chunks[-1]["usage"] == USAGE["usage"]
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert fast_chunks[-1]["usage"][key] == slow_chunks[-1]["usage"][key]
    assert len(builds) == 2  # acompletion's two (its usage chunk, its callbacks); none on the fast path


async def test_a_stream_with_nothing_but_the_proxys_usage_is_still_not_empty(provider: Any) -> None:
    """A provider stream that finishes with no content and then sends the usage the proxy asked for: still
    an answer of nothing, as when litellm's own usage chunk ended it (the usage was its substance), now
    ended by the provider's usage. Without any usage from the provider it is an empty stream, as in legacy
    mode: the usage litellm made up for it (its own count of the prompt) no longer passes it as an answer."""
    outcomes: dict[tuple[bool, bool], Any] = {}
    for sends_usage in (True, False):
        for usage_to_caller in (True, False):
            api_base = provider.add(chunks=[_chunk({}, "stop"), *([USAGE] if sends_usage else [])])
            backend = LiteLLMBackend(timeout_seconds=30, fast_path=True)
            arguments = {**ROUTES["openai"], "api_base": api_base, "api_key": "sk-test-key", "messages": HISTORY}
            arguments["stream_options"] = {"include_usage": True}
            try:
                stream = await backend.stream(arguments, usage_to_caller=usage_to_caller)
                outcomes[sends_usage, usage_to_caller] = [chunk["usage"] async for chunk in stream if "usage" in chunk]
            except EmptyStream:
                outcomes[sends_usage, usage_to_caller] = "empty"
            finally:
                await backend.aclose()
    assert outcomes[True, False] == [USAGE["usage"]]  # the provider's own figures
    built = outcomes[True, True]  # litellm's, built from the same chunk (it adds details the provider did not send)
    assert [{key: usage[key] for key in USAGE["usage"]} for usage in built] == [USAGE["usage"]]
    assert outcomes[False, False] == "empty"
    assert outcomes[False, True] != "empty"  # litellm's made-up usage: the old way, still the caller's ask
