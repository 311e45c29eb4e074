"""The native transport's failures: a request the provider refuses reaches the client in the provider's own
words (its message, param and code), streamed or not, and an overflow is still an overflow."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from proxy.kernel.errors import ContextOverflow, ProxyError
from proxy.provider.litellm_backend import LiteLLMBackend
from proxy.provider.scripted import serve_in_thread
from proxy.provider.scripted_anthropic import DEFAULT_API_KEY as ANTHROPIC_KEY
from proxy.provider.scripted_anthropic import MessageReply, ScriptedAnthropic, Text
from proxy.provider.scripted_responses import DEFAULT_API_KEY as RESPONSES_KEY
from proxy.provider.scripted_responses import Message, ResponseReply, ScriptedResponses

OVERFLOW = {
    "type": "error",
    "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"},
}


def _anthropic(body: dict[str, Any]) -> MessageReply:
    if body["messages"][0]["content"] == "overflow":
        return MessageReply(error_status=400, error_body=OVERFLOW)
    return MessageReply((Text("ok"),))


@pytest.fixture(scope="module")
def providers() -> Iterator[dict[str, str]]:
    anthropic, responses = (
        ScriptedAnthropic(_anthropic),
        ScriptedResponses(lambda body: ResponseReply((Message("ok"),))),
    )
    with serve_in_thread(anthropic.app()) as anthropic_url, serve_in_thread(responses.app()) as responses_url:
        yield {"messages": anthropic_url, "responses": f"{responses_url}/v1"}


async def _refusal(api: Any, body: dict[str, Any], route: dict[str, Any], *, stream: bool) -> ProxyError:
    backend = LiteLLMBackend(30)
    try:
        with pytest.raises(ProxyError) as refused:
            if stream:
                await backend.stream_native(api, {**body, "stream": True}, {}, route)
            else:
                await backend.complete_native(api, body, {}, route)
    finally:
        await backend.aclose()
    return refused.value


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_refused_responses_request_keeps_the_providers_message_param_and_code(providers, stream):
    route = {"model": "openai/gpt-5.5", "api_base": providers["responses"], "api_key": RESPONSES_KEY}
    body = {"model": "gpt-5.5", "input": "hi", "frobnicate": True}
    error = await _refusal("responses", body, route, stream=stream)
    assert error.status == 400
    assert error.body()["error"] == {
        "message": "Unknown parameter: 'frobnicate'.",
        "type": "invalid_request_error",
        "param": "frobnicate",
        "code": "unknown_parameter",
    }


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_refused_messages_request_keeps_the_providers_message(providers, stream):
    route = {"model": "anthropic/claude-sonnet-4-5", "api_base": providers["messages"], "api_key": ANTHROPIC_KEY}
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 2000,
        "thinking": {"type": "enabled", "budget_tokens": 4000},
        "messages": [{"role": "user", "content": "hi"}],
    }
    error = await _refusal("messages", body, route, stream=stream)
    assert error.status == 400 and error.body()["error"]["type"] == "invalid_request_error"
    assert error.body()["error"]["message"].startswith("`max_tokens` must be greater than `thinking.budget_tokens`.")


async def test_an_overflow_the_provider_states_is_an_overflow_with_its_limit(providers):
    route = {"model": "anthropic/claude-sonnet-4-5", "api_base": providers["messages"], "api_key": ANTHROPIC_KEY}
    body = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": "overflow"}]}
    error = await _refusal("messages", body, route, stream=False)
    assert isinstance(error, ContextOverflow) and error.limit == 200_000
    assert error.body()["error"]["message"].endswith("prompt is too long: 210000 tokens > 200000 maximum")
