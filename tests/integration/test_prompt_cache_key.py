"""The session's ``prompt_cache_key`` at the provider's socket: on a route that speaks Responses, every call of
a session carries one key (the client's own when it sent one), another session another key; shadow mode and
chat-only routes send the client's request as it came.

Providers are the strict Responses stand-in (it caches prefixes per ``prompt_cache_key`` like OpenAI and
reports ``cached_tokens``) and the scripted chat stand-in; clients are the official ``openai`` SDK.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from proxy.app import create_app
from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.scripted import Reply, serve_in_thread
from proxy.provider.scripted_responses import DEFAULT_API_KEY, FunctionCall, Message, ResponseReply, ScriptedResponses
from proxy.runtime.cache_key import session_cache_key
from tests.integration.conftest import route_to

INSTRUCTIONS = "You are a careful agent. " + "Keep to the house rules. " * 300  # ~2,000 tokens: cacheable
TOOLS = [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}]
STEPS = 3


def script(body: dict[str, Any]) -> ResponseReply:
    step = json.dumps(body["input"]).count('"function_call_output"')
    return ResponseReply((Message("Done."),) if step >= STEPS else (FunctionCall("shell", {"step": step + 1}),))


@pytest.fixture
def responses_stand_in() -> Iterator[tuple[ScriptedResponses, str]]:
    stand_in = ScriptedResponses(script)
    with serve_in_thread(stand_in.app()) as url:
        yield stand_in, url


def responses_route(url: str) -> ModelRoute:
    return ModelRoute(
        "agent",
        {"model": "openai/gpt-5", "api_base": f"{url}/v1", "api_key": DEFAULT_API_KEY},
        max_input_tokens=64_000,
        max_output_tokens=4_000,
        configured_api="responses",  # what OpenAI's own API (no api_base) speaks by default
    )


def run(sdk: openai.OpenAI, session: str, **extra: Any) -> list[Any]:
    """The Agents SDK's loop: the whole input each turn, no ``prompt_cache_key`` unless ``extra`` has one."""
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Calibrate the rig."}]
    answers = []
    headers = {"x-session-id": session, **extra.pop("headers", {})}
    for _ in range(STEPS + 1):
        answer = sdk.responses.create(
            model="agent",
            instructions=INSTRUCTIONS,
            input=items,
            tools=TOOLS,
            store=False,
            extra_headers=headers,
            **extra,
        )
        answers.append(answer)
        items += [item.model_dump(exclude_none=True) for item in answer.output]
        calls = [item for item in answer.output if item.type == "function_call"]
        if not calls:
            return answers
        items += [{"type": "function_call_output", "call_id": c.call_id, "output": "ok " * 200} for c in calls]
    raise AssertionError("the agent did not finish")


def test_each_session_reaches_the_provider_under_its_own_key(responses_stand_in, tmp_path) -> None:
    stand_in, url = responses_stand_in
    settings = Settings(data_dir=tmp_path / "data", models=(responses_route(url),), trace_enabled=True)
    with (
        serve_in_thread(create_app(settings)) as proxy,
        openai.OpenAI(base_url=f"{proxy}/v1", api_key="x", max_retries=0) as sdk,
    ):
        first = run(sdk, "agents-1")
        second = run(sdk, "agents-2")
        codex = run(sdk, "codex-1", prompt_cache_key="codex-own-key")
    keys = [r.body.get("prompt_cache_key") for r in stand_in.requests if r.path == "/v1/responses"]
    runs = len(first), len(second), len(codex)
    assert keys == (
        [session_cache_key("agents-1")] * runs[0]
        + [session_cache_key("agents-2")] * runs[1]
        + ["codex-own-key"] * runs[2]
    )
    # The provider's cache, keyed by session, reaches the client: every call after a session's first reads it.
    for answers in (first, second, codex):
        cached = [a.usage.input_tokens_details.cached_tokens for a in answers]
        assert cached[0] == 0 and all(c > 0 for c in cached[1:])
    # The trace shows the key the provider was sent.
    traces = [json.loads(p.read_text()) for p in (tmp_path / "data" / "context-traces" / "agents-1").glob("turn-*")]
    assert {t["llmInput"]["prompt_cache_key"] for t in traces} == {session_cache_key("agents-1")}


def test_shadow_mode_sends_the_clients_request_without_a_key(responses_stand_in, tmp_path) -> None:
    stand_in, url = responses_stand_in
    settings = Settings(data_dir=tmp_path / "data", models=(responses_route(url),), allow_mode_header=True)
    with (
        serve_in_thread(create_app(settings)) as proxy,
        openai.OpenAI(base_url=f"{proxy}/v1", api_key="x", max_retries=0) as sdk,
    ):
        run(sdk, "shadowed", headers={"x-context-mode": "shadow"})
    sent = [r.body for r in stand_in.requests if r.path == "/v1/responses"]
    assert sent and not any("prompt_cache_key" in body for body in sent)


def test_a_chat_client_on_a_responses_route_sends_the_key_and_a_chat_only_route_does_not(start_proxy, provider) -> None:
    """litellm carries the key on a chat call to a route that speaks Responses; a chat-only route (vLLM,
    llama.cpp: an ``api_base`` of their own) might refuse the field, so it never gets it."""
    provider.script(lambda body: Reply(content="ok"))
    declared = ModelRoute(
        "openai-like",
        route_to(provider.url).litellm_params,
        max_input_tokens=16_000,
        max_output_tokens=2_000,
        configured_api="responses",
    )
    proxy = start_proxy(models=(route_to(provider.url, "chat-only"), declared))
    client = proxy.client()
    for model in ("openai-like", "chat-only"):
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], extra_headers={"x-session-id": model}
        )
    on_responses, on_chat = provider.history
    assert on_responses["prompt_cache_key"] == session_cache_key("openai-like")
    assert "prompt_cache_key" not in on_chat
