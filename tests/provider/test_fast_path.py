"""The provider fast path against ``litellm.acompletion``, side by side over loopback, for each route
(``openai/``, ``azure/``, ``anthropic/``): for every call the fast path accepts, the provider receives the
same body at the same path with the same credentials on both paths, and the proxy sees the same answer
or the same translated error (every overflow dataset entry, every status, time-outs, refused
connections, answers that are not answers). And the rule: what it does not accept goes to acompletion.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import re
import socket
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.kernel.errors import ContextOverflow, ProxyError
from proxy.provider.fast import LITELLM_SURFACE
from proxy.provider.fast.azure import SDK_BODY_ORDER
from proxy.provider.fast.surface import load
from proxy.provider.litellm_backend import LiteLLMBackend

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
ANTHROPIC_ANSWER = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-3-5-sonnet-20240620",
    "content": [
        {"type": "text", "text": "Measuring."},
        {"type": "tool_use", "id": "c2", "name": "measure", "input": {}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 12, "output_tokens": 3, "cache_read_input_tokens": 2},
}
# Each route's arguments besides api_base/api_key, and a good answer in its provider's shape.
ROUTES: dict[str, dict[str, Any]] = {
    "openai": {"model": "openai/test"},
    "azure": {"model": "azure/test-deployment", "api_version": "2024-10-21"},
    "anthropic": {"model": "anthropic/claude-3-5-sonnet-20240620"},
}
ANSWERS = {"openai": ANSWER, "azure": ANSWER, "anthropic": ANTHROPIC_ANSWER}
# What a provider reads from the request's headers: its credentials, version and body type.
READ_HEADERS = ("api-key", "authorization", "x-api-key", "anthropic-version", "anthropic-beta", "content-type")


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


async def _both(provider: Any, reply: dict[str, Any], route: str = "openai", **llm_input: Any) -> list[tuple[Any, Any]]:
    """(what the provider received, the answer or the translated error) on each path, acompletion first."""
    results = []
    for fast in (False, True):
        api_base = provider.add(**reply)
        backend = LiteLLMBackend(timeout_seconds=30, fast_path=fast)
        arguments = {**ROUTES[route], "api_base": api_base, "api_key": "sk-test-key", **llm_input}
        assert backend._fast is None or backend._fast.accepts(backend.provider_arguments(arguments))
        try:
            outcome: Any = await backend.complete(arguments)
        except ProxyError as error:
            outcome = _outcome(error)
        finally:
            await backend.aclose()
        name = api_base.split("/")[3]
        requests = [  # the path below the call's own prefix, the headers a provider reads
            (path.removeprefix(f"/{name}"), {key: value for key, value in headers.items() if key in READ_HEADERS})
            for path, headers in provider.requests[name]
        ]
        results.append(((provider.received[name], requests), _stable(outcome, route)))
    return results


def _stable(outcome: Any, route: str) -> Any:
    """The answer without what litellm makes up per call for Anthropic's (its own id, the time)."""
    if route != "anthropic" or not isinstance(outcome, dict):
        return outcome
    assert outcome["id"].startswith("chatcmpl-") and isinstance(outcome["created"], int)
    return {**outcome, "id": "*", "created": "*"}


def _assert_same(results: list[tuple[Any, Any]]) -> None:
    (slow_sent, slow_outcome), (fast_sent, fast_outcome) = results
    assert fast_sent == slow_sent
    assert json.dumps(fast_sent) == json.dumps(slow_sent)  # key order too: the cassettes pin the bytes
    assert fast_outcome == slow_outcome


SAMPLING = {"temperature": 0.2, "max_tokens": 50, "stop": "END", "user": "u1"}
CASES = [
    ("openai", {}),
    ("openai", {**SAMPLING, "seed": 7}),
    ("openai", {"tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": False}),
    ("openai", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "measure"}}}),
    ("openai", {"response_format": {"type": "json_object"}, "max_completion_tokens": 99, "n": 1, "top_p": 0.5}),
    ("openai", {"logprobs": True, "top_logprobs": 2, "presence_penalty": 0.1, "frequency_penalty": 0.2}),
    ("openai", {"timeout": 12.5}),
    ("openai", {"stream": False}),  # what many clients send for a whole answer
    ("azure", {}),
    ("azure", {**SAMPLING, "seed": 7}),
    ("azure", {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}),
    ("azure", {"response_format": {"type": "json_object"}, "max_completion_tokens": 99, "n": 1, "top_p": 0.5}),
    ("azure", {"logprobs": True, "top_logprobs": 2, "presence_penalty": 0.1, "frequency_penalty": 0.2}),
    ("azure", {"api_version": "2023-05-15", **SAMPLING}),  # an older version's mapping
    ("azure", {"stream": False}),
    ("anthropic", {}),
    ("anthropic", {**SAMPLING, "stop": ["END", "STOP"], "top_p": 0.5}),
    ("anthropic", {"tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": False}),
    ("anthropic", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "measure"}}}),
    ("anthropic", {"tools": TOOLS, "tool_choice": "required", "max_completion_tokens": 99, "timeout": 12.5}),
    ("anthropic", {"stream": False}),
]


@pytest.mark.parametrize(("route", "params"), CASES, ids=[f"{route}-{i}" for i, (route, _) in enumerate(CASES)])
async def test_same_request_and_answer(provider: Any, route: str, params: dict[str, Any]) -> None:
    results = await _both(provider, {"body": ANSWERS[route]}, route, messages=HISTORY, **params)
    _assert_same(results)
    assert results[1][1]["choices"][0]["message"]["tool_calls"][0]["id"] == "c2"


# What litellm's request transformation decides by the route (its provider and api_base): whether
# cache_control marks survive, and how a tool schema whose pattern Python cannot compile is sanitized.
MARKED = [
    {"role": "system", "content": [{"type": "text", "text": "Be careful.", "cache_control": {"type": "ephemeral"}}]},
    {"role": "user", "content": [{"type": "text", "text": "Measure A.", "cache_control": {"type": "ephemeral"}}]},
]
PATTERNED = [
    {
        "type": "function",
        "function": {
            "name": "measure",
            "parameters": {"type": "object", "properties": {"sample": {"type": "string", "pattern": "(?<id>[A-Z])"}}},
        },
    }
]


@pytest.mark.parametrize("route", ["openai", "azure", "anthropic"])
async def test_same_request_for_cache_marks_and_schema_patterns(provider: Any, route: str) -> None:
    results = await _both(provider, {"body": ANSWERS[route]}, route, messages=MARKED, tools=PATTERNED, max_tokens=9)
    _assert_same(results)


@pytest.mark.parametrize("route", ["openai", "azure"])
async def test_remembered_tool_schemas_send_what_litellm_sends_on_every_call(provider: Any, route: str) -> None:
    """The fast route remembers litellm's sanitizing of a tool list (``fast/tool_schemas.py``): one backend's
    later calls with the same tools, and with other tools in between, still send acompletion's bytes."""
    slow = await _both(provider, {"body": ANSWERS[route]}, route, messages=HISTORY, tools=PATTERNED, max_tokens=9)
    ((slow_body,), _), _ = slow[0]
    expected = json.dumps(slow_body)
    backend = LiteLLMBackend(timeout_seconds=30, fast_path=True)
    api_base = provider.add(body=ANSWERS[route])  # one route: the memo is keyed by the api_base too
    arguments = {**ROUTES[route], "api_base": api_base, "api_key": "sk-test-key"}
    try:
        for tools in (PATTERNED, TOOLS, PATTERNED, PATTERNED):
            await backend.complete({**arguments, "messages": HISTORY, "tools": tools, "max_tokens": 9})
            sent = provider.received[api_base.split("/")[3]][-1]
            if tools is PATTERNED:
                assert json.dumps(sent) == expected
                assert "pattern" not in json.dumps(sent["tools"])  # litellm dropped it, the memo too
            else:
                assert sent["tools"] == TOOLS
    finally:
        await backend.aclose()


async def test_the_providers_get_their_own_requests(provider: Any) -> None:
    azure = await _both(provider, {"body": ANSWER}, "azure", messages=HISTORY)
    path, headers = azure[1][0][1][0]
    assert path.endswith("/openai/deployments/test-deployment/chat/completions?api-version=2024-10-21")
    assert headers["api-key"] == "sk-test-key" and "authorization" not in headers
    anthropic = await _both(provider, {"body": ANTHROPIC_ANSWER}, "anthropic", messages=HISTORY)
    (body,), ((path, headers),) = anthropic[1][0]
    assert path.endswith("/v1/messages") and headers["x-api-key"] == "sk-test-key"
    assert body["system"] == [{"type": "text", "text": "You are careful."}]
    assert anthropic[1][1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 2


async def test_same_error_for_a_request_litellm_cannot_build(provider: Any) -> None:
    # Azure's tool_choice needs API version 2023-12-01-preview or later: litellm refuses before sending
    params = {"api_version": "2023-05-15", "tools": TOOLS, "tool_choice": "auto"}
    results = await _both(provider, {"body": ANSWER}, "azure", messages=HISTORY, **params)
    _assert_same(results)
    assert results[1][1][:2] == ("ProviderError", 400)
    assert results[1][0] == ([], [])  # nothing was sent


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("index", range(len(ENTRIES)))
async def test_same_error_for_every_dataset_entry(provider: Any, index: int, route: str) -> None:
    entry = ENTRIES[index]
    body, status = entry["body"], entry["status"] or 400
    content_type = (
        ("text/event-stream" if body.startswith("event:") else "text/plain") if isinstance(body, str) else None
    )
    headers = {"retry-after": "7"} if status == 429 else {}
    reply = {"status": status, "body": body, "content_type": content_type, "headers": headers}
    results = await _both(provider, reply, route, messages=HISTORY)
    _assert_same(results)
    assert (results[1][1][0] == "ContextOverflow") is entry["is_overflow"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("index", [3, 7, 14, 20, 21, 22, 24])
async def test_same_outcome_for_errors_inside_a_200(provider: Any, index: int, route: str) -> None:
    _assert_same(await _both(provider, {"body": ENTRIES[index]["body"]}, route, messages=HISTORY))


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("status", [401, 403, 404, 408, 409, 413, 422, 429, 500, 502, 503, 504, 529])
async def test_same_error_for_every_status(provider: Any, status: int, route: str) -> None:
    body = {"error": {"message": f"upstream said {status}", "type": "x", "code": f"code_{status}", "param": "p"}}
    reply = {"status": status, "body": body, "headers": {"retry-after": "11"}}
    _assert_same(await _both(provider, reply, route, messages=HISTORY))


@pytest.mark.parametrize("route", ROUTES)
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
async def test_same_outcome_for_odd_answers(provider: Any, reply: dict[str, Any], route: str) -> None:
    _assert_same(await _both(provider, reply, route, messages=HISTORY))


@pytest.mark.parametrize("route", ROUTES)
async def test_same_outcome_when_the_provider_is_late(provider: Any, route: str) -> None:
    results = await _both(provider, {"body": ANSWERS[route], "delay": 1.0}, route, messages=HISTORY, timeout=0.2)
    _assert_same(results)
    assert results[1][1][1:4] == (504, "timeout_error", "timeout")


@pytest.mark.parametrize("route", ROUTES)
async def test_same_outcome_when_nobody_listens(route: str) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    outcomes = []
    for fast in (False, True):
        backend = LiteLLMBackend(timeout_seconds=5, fast_path=fast)
        arguments = {**ROUTES[route], "api_base": f"http://127.0.0.1:{port}/v1", "api_key": "sk-x"}
        with pytest.raises(ProxyError) as raised:
            await backend.complete({**arguments, "messages": HISTORY})
        await backend.aclose()
        outcomes.append(_outcome(raised.value))
    assert outcomes[0] == outcomes[1]  # word for word: both paths connect through litellm's transport
    assert outcomes[1][1:4] == (502, "api_error", "provider_unreachable")


@pytest.mark.parametrize("route", ROUTES)
async def test_an_overflow_is_still_a_context_overflow(provider: Any, route: str) -> None:
    body = {
        "error": {"message": "This model's maximum context length is 8192 tokens.", "code": "context_length_exceeded"}
    }
    if route == "anthropic":
        body = {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "prompt is too long: 8200 tokens > 8192 maximum"},
        }
    results = await _both(provider, {"status": 400, "body": body}, route, messages=HISTORY)
    _assert_same(results)
    assert results[1][1][0] == ContextOverflow.__name__ and results[1][1][-1] == 8192


AZURE = {"model": "azure/test-deployment", "api_base": "http://h", "api_key": "k", "api_version": "2024-10-21"}
ANTHROPIC = {"model": "anthropic/claude-3-5-sonnet-20240620", "api_base": "http://h", "api_key": "k"}
LEFT_TO_ACOMPLETION: dict[str, dict[str, Any]] = {
    "another-provider": {"model": "gemini/gemini-1.5-pro", "api_base": "http://h/v1", "api_key": "k"},
    "no-api-base": {"model": "openai/test", "api_key": "k"},  # litellm's own endpoint resolution
    "extra-headers": {"model": "openai/test", "api_base": "http://h/v1", "api_key": "k", "extra_headers": {"x": "1"}},
    "stream-options-unstreamed": {
        "model": "openai/test",
        "api_base": "http://h/v1",
        "api_key": "k",
        "stream_options": {"include_usage": True},
    },  # a stream takes the fast path (test_fast_stream.py); its options without a stream do not
    "stream-options-unstreamed-false": {
        "model": "openai/test",
        "api_base": "http://h/v1",
        "api_key": "k",
        "stream": False,
        "stream_options": {"include_usage": True},
    },
    "stream-not-a-bool": {"model": "openai/test", "api_base": "http://h/v1", "api_key": "k", "stream": 0},
    "reasoning": {"model": "openai/test", "api_base": "http://h/v1", "api_key": "k", "reasoning_effort": "low"},
    "image": {
        "model": "openai/test",
        "api_base": "http://h/v1",
        "api_key": "k",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://i"}}]}],
    },
    "tool-extras": {
        "model": "openai/test",
        "api_base": "http://h/v1",
        "api_key": "k",
        "tools": [{"type": "function", "function": {"name": "f"}, "cache_control": {"type": "ephemeral"}}],
    },
    "developer": {
        "model": "openai/test",
        "api_base": "http://h/v1",
        "api_key": "k",
        "messages": [{"role": "developer", "content": "d"}],
    },
    "timeout": {"model": "openai/test", "api_base": "http://h/v1", "api_key": "k", "timeout": "30"},
    "azure-no-api-version": {key: value for key, value in AZURE.items() if key != "api_version"},
    "azure-v1-api": {**AZURE, "api_version": "v1"},  # litellm's plain OpenAI client on /openai/v1
    "azure-o-series": {**AZURE, "model": "azure/o3-mini"},  # its own config and handler
    "azure-gpt-5": {**AZURE, "model": "azure/gpt-5"},
    "azure-deployment-url": {**AZURE, "api_base": "http://h/openai/deployments/test-deployment"},
    "azure-ad-token": {**AZURE, "azure_ad_token": "t"},
    "azure-no-api-key": {key: value for key, value in AZURE.items() if key != "api_key"},
    "azure-quoted-deployment": {**AZURE, "model": "azure/my deployment"},
    "anthropic-no-api-base": {key: value for key, value in ANTHROPIC.items() if key != "api_base"},
    "anthropic-n": {**ANTHROPIC, "n": 2},  # a parameter Anthropic does not map
    "anthropic-json-mode": {**ANTHROPIC, "response_format": {"type": "json_object"}},
    "anthropic-thinking": {**ANTHROPIC, "thinking": {"type": "enabled", "budget_tokens": 1024}},
}
ACCEPTED = {
    "openai": {"model": "openai/test", "api_base": "http://h/v1", "api_key": "k"},
    "azure": AZURE,
    "anthropic": ANTHROPIC,
}


@pytest.mark.parametrize("llm_input", LEFT_TO_ACOMPLETION.values(), ids=LEFT_TO_ACOMPLETION)
def test_what_the_fast_path_leaves_to_acompletion(llm_input: dict[str, Any]) -> None:
    backend = LiteLLMBackend(timeout_seconds=5)
    assert backend._fast is not None
    # as the backend hands a call over: with its time-out and no-retry arguments
    assert not backend._fast.accepts(
        backend.provider_arguments({"messages": [{"role": "user", "content": "hi"}], **llm_input})
    )
    for plain in ACCEPTED.values():
        assert backend._fast.accepts(backend.provider_arguments({**plain, "messages": HISTORY, "tools": TOOLS}))


@pytest.mark.parametrize(
    ("route", "variable"),
    [("azure", "AZURE_AD_TOKEN"), ("azure", "AZURE_USERNAME"), ("anthropic", "LITELLM_ANTHROPIC_DISABLE_URL_SUFFIX")],
)
def test_what_the_environment_leaves_to_acompletion(monkeypatch: pytest.MonkeyPatch, route: str, variable: str) -> None:
    """An Entra ID credential (litellm sends a Bearer token), a disabled ``/v1/messages`` suffix."""
    backend = LiteLLMBackend(timeout_seconds=5)
    assert backend._fast is not None
    arguments = backend.provider_arguments({**ACCEPTED[route], "messages": HISTORY})
    assert backend._fast.accepts(arguments)
    monkeypatch.setenv(variable, "1")
    assert not backend._fast.accepts(arguments)


def test_litellm_still_has_what_the_fast_path_uses() -> None:
    """Fails loudly when a litellm upgrade moves or renames a piece of its transformation layer the fast
    path calls (then adapt proxy/provider/fast/, or route everything through acompletion)."""
    for module, names in LITELLM_SURFACE.items():
        loaded = importlib.import_module(module)
        for name in names:
            assert hasattr(loaded, name), f"litellm moved {module}.{name}"
    parts = load()
    configs = {
        provider: parts["ProviderConfigManager"].get_provider_chat_config(
            model=model, provider=parts["LlmProviders"](provider)
        )
        for provider, model in (("openai", "test"), ("azure", "test"), ("anthropic", "claude-3-5-sonnet-20240620"))
    }
    assert type(configs["azure"]) is parts["AzureOpenAIConfig"]
    assert type(configs["anthropic"]) is parts["AnthropicConfig"]
    request = {"model", "messages", "optional_params", "litellm_params", "headers"}
    environment = {"headers", "model", "messages", "optional_params", "litellm_params", "api_key"}
    calls = {
        "openai": {
            "transform_request": request,
            "get_complete_url": {"api_base", "api_key", "model", "optional_params", "litellm_params", "stream"},
            "validate_environment": environment,
        },
        "azure": {"transform_request": request},
        "anthropic": {
            "async_transform_request": request,
            "validate_environment": environment | {"api_base"},
            "transform_response": {
                "model",
                "raw_response",
                "model_response",
                "logging_obj",
                "request_data",
                "messages",
                "optional_params",
                "litellm_params",
                "encoding",
                "api_key",
                "json_mode",
            },
        },
    }
    for provider, methods in calls.items():
        config = configs[provider]
        methods["translate_developer_role_to_system_role"] = {
            "messages",
            "model",
            "custom_llm_provider",
            "api_base",
            "model_info",
        }
        for method, parameters in methods.items():
            assert parameters <= set(inspect.signature(getattr(config, method)).parameters), (provider, method)
    # the step the openai route remembers per tool list (fast/tool_schemas.py)
    step = inspect.signature(configs["openai"]._sanitized_tools_update_for_openai).parameters
    assert set(step) == {"optional_params", "litellm_params"}
    optional = set(inspect.signature(parts["get_optional_params"]).parameters)
    assert {"model", "custom_llm_provider", "messages", "stream", "max_retries", "tools", "api_version"} <= optional
    # the Azure route writes the body in the order the openai SDK's create() does, for the same keys
    create = inspect.signature(openai.resources.chat.completions.AsyncCompletions.create).parameters
    assert set(SDK_BODY_ORDER) <= set(create)


async def test_a_fast_call_leaves_no_cycle_holding_the_request_body(provider) -> None:
    # httpx's response and its stream refer to each other; post_json breaks that cycle, so the request (a
    # megabyte body on a long history) is freed when the response goes, not at the next collection.
    import httpx

    from proxy.provider.fast.base import post_json
    from proxy.provider.pool import litellm_client
    from tests.garbage import collector_finds

    async with litellm_client(load()) as client:
        url = provider.add(body=ANSWER) + "/chat/completions"
        body = {"model": "scripted", "messages": [{"role": "user", "content": "x" * 100_000}]}
        await post_json(client, url, body, {}, 10.0)  # the pool's connection exists from now on
        with collector_finds(httpx.Request, httpx.Response) as found:
            response = await post_json(client, url, body, {}, 10.0)
            assert response.status_code == 200 and response.json()["choices"]
            del response
        assert not found


@pytest.mark.parametrize("fast", [False, True], ids=["acompletion", "fast"])
@pytest.mark.parametrize("route", ["openai", "azure", "anthropic"])
@pytest.mark.parametrize("systems", [1, 2])  # two system messages in a row take litellm's own message steps
async def test_the_sessions_messages_come_back_unchanged(provider: Any, fast: bool, route: str, systems: int) -> None:
    """The assembly hands the provider adapter the history's own message dicts (not copies); litellm's
    message steps write into what they get (``validate_and_fix_openai_messages`` puts a new tool-call list
    into each message), so the adapter must hand litellm copies: every message, and every value in it,
    is the very object it was."""
    messages = [{"role": "system", "content": "Two in a row."}] * (systems - 1) + [{**m} for m in HISTORY]
    before = [(message, dict(message), copy.deepcopy(message)) for message in messages]
    backend = LiteLLMBackend(timeout_seconds=30, fast_path=fast)
    api_base = provider.add(body=ANSWERS[route])
    arguments = {**ROUTES[route], "api_base": api_base, "api_key": "sk-test-key", "messages": messages}
    assert backend._fast is None or backend._fast.accepts(backend.provider_arguments(arguments))
    try:
        await backend.complete(arguments)
    finally:
        await backend.aclose()
    assert len(provider.received[api_base.split("/")[3]]) == 1  # the call was made
    for message, (same, fields, deep) in zip(messages, before, strict=True):
        assert message is same and message == deep
        assert list(message) == list(fields) and all(message[key] is value for key, value in fields.items())


IMAGE_PART = {"type": "image_url", "image_url": {"url": "http://i/x.png"}}  # declined by the fast path
STREAMED = [
    {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, **choice}]}
    for choice in (
        {"delta": {"role": "assistant", "content": "o"}},
        {"delta": {"content": "k"}, "finish_reason": "stop"},
    )
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("route", ["openai", "azure"])
async def test_an_sdk_route_call_leaves_no_cycle_holding_the_request_body(
    provider: Any, route: str, stream: bool
) -> None:
    """What the fast path declines goes through acompletion, whose OpenAI and Azure routes send over the
    proxy's ``PerLoopSdkClient``: httpx's response and its stream refer to each other there too, and the
    request (the provider body) must go with the response, not wait for a collection."""
    import httpx

    from tests.garbage import collector_finds

    backend = LiteLLMBackend(timeout_seconds=30)
    messages = [{"role": "user", "content": [{"type": "text", "text": "x" * 100_000}, IMAGE_PART]}]
    api_base = provider.add(body=ANSWER, chunks=STREAMED)
    arguments = {**ROUTES[route], "api_base": api_base, "api_key": "sk-test-key", "messages": messages}

    async def call() -> str:
        if not stream:
            return str((await backend.complete(arguments))["choices"][0]["message"]["tool_calls"][0]["id"])
        chunks = [chunk async for chunk in await backend.stream(arguments)]
        return "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks)

    try:
        assert backend._fast is not None and not backend._fast.accepts(backend.provider_arguments(arguments))
        await call()  # litellm's SDK client and the loop's connection exist from now on
        with collector_finds(httpx.Request, httpx.Response) as found:
            assert await call() == ("ok" if stream else "c2")
        assert not found
    finally:
        await backend.aclose()
