"""The session's ``prompt_cache_key``: on routes that speak Responses, one per session, the client's own kept."""

from __future__ import annotations

from proxy.kernel.config import ModelRoute
from proxy.runtime.cache_key import session_cache_key, with_session_cache_key

OPENAI = ModelRoute("gpt", {"model": "openai/gpt-4o"})  # OpenAI's own API: speaks Responses
VLLM = ModelRoute("local", {"model": "openai/qwen", "api_base": "http://127.0.0.1:8000/v1"})  # chat only
CLAUDE = ModelRoute("claude", {"model": "anthropic/claude-sonnet-4-5"})


def test_one_key_per_session_and_not_the_session_id() -> None:
    key = session_cache_key("run-42")
    assert key == session_cache_key("run-42") != session_cache_key("run-43")
    assert "run-42" not in key and len(key) <= 64  # OpenAI's limit on the field


def test_only_responses_routes_get_it_and_a_clients_key_stays() -> None:
    body = {"messages": []}
    assert with_session_cache_key(body, OPENAI, "run-42")["prompt_cache_key"] == session_cache_key("run-42")
    assert "prompt_cache_key" not in with_session_cache_key(body, VLLM, "run-42")
    assert "prompt_cache_key" not in with_session_cache_key(body, CLAUDE, "run-42")
    declared = ModelRoute(
        "proxy", {"model": "openai/x", "api_base": "http://127.0.0.1:1/v1"}, configured_api="responses"
    )
    assert "prompt_cache_key" in with_session_cache_key(body, declared, "run-42")
    given = {"messages": [], "prompt_cache_key": "codex-session"}
    assert with_session_cache_key(given, OPENAI, "run-42")["prompt_cache_key"] == "codex-session"
