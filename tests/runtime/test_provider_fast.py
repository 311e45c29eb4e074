"""The provider fast path against ``litellm.acompletion``, side by side over loopback: for every call the
fast path accepts, the provider receives the same body on both paths and the proxy sees the same answer
or the same translated error (every overflow dataset entry, every status, time-outs, refused
connections, answers that are not answers). And the rule: what it does not accept goes to acompletion.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from proxy.errors import ContextOverflow, ProxyError
from proxy.runtime.provider import LiteLLMBackend
from proxy.runtime.fast import LITELLM_SURFACE

ENTRIES: list[dict[str, Any]] = json.loads((Path(__file__).parent / "data" / "overflow_errors.json").read_text("utf-8"))
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "measure",
            "description": "Measure a sample.",
            "parameters": {"type": "object", "properties": {"sample": {"type": "string"}}},
        },
    }
]
HISTORY = [
    {"role": "system", "content": "You are careful."},
    {"role": "user", "content": [{"type": "text", "text": "Measure A."}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "measure", "arguments": '{"sample":"A"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "3.1 mg"},
    {"role": "user", "content": "And B? \u00e9\u2713"},
]
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "test",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "measure", "arguments": "{}"}}],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
}


def _outcome(error: ProxyError) -> tuple[Any, ...]:
    return (
        type(error).__name__,
        error.status,
        error.type,
        error.code,
        re.sub(r"time taken=[0-9.]+", "time taken=*", error.message),  # litellm's words: the time it took
        error.headers,
        getattr(error, "param", None),
        getattr(error, "limit", None),
    )


async def _both(provider: Any, reply: dict[str, Any], **llm_input: Any) -> list[tuple[Any, Any]]:
    """(what the provider received, the answer or the translated error) on each path, acompletion first."""
    results = []
    for fast in (False, True):
        api_base = provider.add(**reply)
        backend = LiteLLMBackend(timeout_seconds=30, fast_path=fast)
        arguments = {"model": "openai/test", "api_base": api_base, "api_key": "sk-test-key", **llm_input}
        assert backend._fast is None or backend._fast.accepts(backend.provider_arguments(arguments))
        try:
            outcome: Any = await backend.complete(arguments)
        except ProxyError as error:
            outcome = _outcome(error)
        finally:
            await backend.aclose()
        results.append((provider.received[api_base.split("/")[3]], outcome))
    return results


def _assert_same(results: list[tuple[Any, Any]]) -> None:
    (slow_sent, slow_outcome), (fast_sent, fast_outcome) = results
    assert fast_sent == slow_sent
    assert json.dumps(fast_sent) == json.dumps(slow_sent)  # key order too: the cassettes pin the bytes
    assert fast_outcome == slow_outcome


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"temperature": 0.2, "max_tokens": 50, "stop": "END", "seed": 7, "user": "u1"},
        {"tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": False},
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "measure"}}},
        {"response_format": {"type": "json_object"}, "max_completion_tokens": 99, "n": 1, "top_p": 0.5},
        {"logprobs": True, "top_logprobs": 2, "presence_penalty": 0.1, "frequency_penalty": 0.2},
        {"timeout": 12.5},
    ],
    ids=["plain", "sampling", "tools", "named-tool", "json-mode", "logprobs", "route-timeout"],
)
async def test_same_request_and_answer(provider: Any, params: dict[str, Any]) -> None:
    results = await _both(provider, {"body": ANSWER}, messages=HISTORY, **params)
    _assert_same(results)
    assert results[1][1]["choices"][0]["message"]["tool_calls"][0]["id"] == "c2"


@pytest.mark.parametrize("index", range(len(ENTRIES)))
async def test_same_error_for_every_dataset_entry(provider: Any, index: int) -> None:
    entry = ENTRIES[index]
    body, status = entry["body"], entry["status"] or 400
    content_type = (
        ("text/event-stream" if body.startswith("event:") else "text/plain") if isinstance(body, str) else None
    )
    headers = {"retry-after": "7"} if status == 429 else {}
    reply = {"status": status, "body": body, "content_type": content_type, "headers": headers}
    results = await _both(provider, reply, messages=HISTORY)
    _assert_same(results)
    assert (results[1][1][0] == "ContextOverflow") is entry["is_overflow"]


@pytest.mark.parametrize("index", [3, 7, 14, 20, 21, 22, 24])
async def test_same_outcome_for_errors_inside_a_200(provider: Any, index: int) -> None:
    _assert_same(await _both(provider, {"body": ENTRIES[index]["body"]}, messages=HISTORY))


@pytest.mark.parametrize("status", [401, 403, 404, 408, 409, 413, 422, 429, 500, 502, 503, 504, 529])
async def test_same_error_for_every_status(provider: Any, status: int) -> None:
    body = {"error": {"message": f"upstream said {status}", "type": "x", "code": f"code_{status}", "param": "p"}}
    _assert_same(
        await _both(provider, {"status": status, "body": body, "headers": {"retry-after": "11"}}, messages=HISTORY)
    )


@pytest.mark.parametrize(
    "reply",
    [
        {"body": "not json at all"},
        {"body": [1, 2]},
        {"body": {"choices": []}},
        {"body": {}},
        {"status": 400, "body": "model 'x' is not loaded"},
        {"status": 401, "body": {"error": {"message": "Incorrect API key provided: sk-test-key"}}},
    ],
    ids=["text", "list", "no-choices", "empty", "plain-text-400", "echoed-key"],
)
async def test_same_outcome_for_odd_answers(provider: Any, reply: dict[str, Any]) -> None:
    _assert_same(await _both(provider, reply, messages=HISTORY))


async def test_same_outcome_when_the_provider_is_late(provider: Any) -> None:
    results = await _both(provider, {"body": ANSWER, "delay": 1.0}, messages=HISTORY, timeout=0.2)
    _assert_same(results)
    assert results[1][1][1:4] == (504, "timeout_error", "timeout")


async def test_same_outcome_when_nobody_listens() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    outcomes = []
    for fast in (False, True):
        backend = LiteLLMBackend(timeout_seconds=5, fast_path=fast)
        arguments = {"model": "openai/test", "api_base": f"http://127.0.0.1:{port}/v1", "api_key": "sk-x"}
        with pytest.raises(ProxyError) as raised:
            await backend.complete({**arguments, "messages": HISTORY})
        await backend.aclose()
        outcomes.append(_outcome(raised.value))
    assert outcomes[0] == outcomes[1]
    assert outcomes[1][1:4] == (502, "api_error", "provider_unreachable")


async def test_an_overflow_is_still_a_context_overflow(provider: Any) -> None:
    body = {
        "error": {"message": "This model's maximum context length is 8192 tokens.", "code": "context_length_exceeded"}
    }
    results = await _both(provider, {"status": 400, "body": body}, messages=HISTORY)
    _assert_same(results)
    assert results[1][1][0] == ContextOverflow.__name__ and results[1][1][-1] == 8192


@pytest.mark.parametrize(
    "llm_input",
    [
        {"model": "anthropic/claude-3-5-sonnet-20240620", "api_key": "k"},  # another provider
        {"model": "openai/test", "api_key": "k"},  # no api_base: litellm's own endpoint resolution
        {"model": "openai/test", "api_base": "http://h/v1", "api_key": "k", "extra_headers": {"x": "1"}},
        {"model": "openai/test", "api_base": "http://h/v1", "api_key": "k", "stream": True},
        {"model": "openai/test", "api_base": "http://h/v1", "api_key": "k", "reasoning_effort": "low"},
        {
            "model": "openai/test",
            "api_base": "http://h/v1",
            "api_key": "k",
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://i"}}]}],
        },
        {
            "model": "openai/test",
            "api_base": "http://h/v1",
            "api_key": "k",
            "tools": [{"type": "function", "function": {"name": "f"}, "cache_control": {"type": "ephemeral"}}],
        },
        {
            "model": "openai/test",
            "api_base": "http://h/v1",
            "api_key": "k",
            "messages": [{"role": "developer", "content": "d"}],
        },
        {"model": "openai/test", "api_base": "http://h/v1", "api_key": "k", "timeout": "30"},
    ],
    ids=[
        "anthropic",
        "no-api-base",
        "extra-headers",
        "stream",
        "reasoning",
        "image",
        "tool-extras",
        "developer",
        "timeout",
    ],
)
def test_what_the_fast_path_leaves_to_acompletion(llm_input: dict[str, Any]) -> None:
    backend = LiteLLMBackend(timeout_seconds=5)
    assert backend._fast is not None
    # as the backend hands a call over: with its time-out and no-retry arguments
    assert not backend._fast.accepts(
        backend.provider_arguments({"messages": [{"role": "user", "content": "hi"}], **llm_input})
    )
    plain = {"model": "openai/test", "api_base": "http://h/v1", "api_key": "k", "messages": HISTORY, "tools": TOOLS}
    assert backend._fast.accepts(backend.provider_arguments(plain))


def test_litellm_still_has_what_the_fast_path_uses() -> None:
    """Fails loudly when a litellm upgrade moves or renames a piece of its transformation layer the fast
    path calls (then adapt provider_fast.py, or route everything through acompletion)."""
    for module, names in LITELLM_SURFACE.items():
        loaded = importlib.import_module(module)
        for name in names:
            assert hasattr(loaded, name), f"litellm moved {module}.{name}"
    utils = importlib.import_module("litellm.utils")
    config = utils.ProviderConfigManager.get_provider_chat_config(
        model="test", provider=importlib.import_module("litellm.types.utils").LlmProviders("openai")
    )
    for method, parameters in {
        "transform_request": {"model", "messages", "optional_params", "litellm_params", "headers"},
        "get_complete_url": {"api_base", "api_key", "model", "optional_params", "litellm_params", "stream"},
        "validate_environment": {"headers", "model", "messages", "optional_params", "litellm_params", "api_key"},
        "translate_developer_role_to_system_role": {
            "messages",
            "model",
            "custom_llm_provider",
            "api_base",
            "model_info",
        },
    }.items():
        assert parameters <= set(inspect.signature(getattr(config, method)).parameters), method
    optional = set(inspect.signature(utils.get_optional_params).parameters)
    assert {"model", "custom_llm_provider", "messages", "stream", "max_retries", "tools", "tool_choice"} <= optional
