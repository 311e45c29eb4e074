"""The backend tells the overflow recognizer what it knows beside the error: whether the server is local."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.kernel.errors import ContextOverflow, ProviderError
from proxy.provider.litellm_backend import LiteLLMBackend, overflow_hints

# llama.cpp's words when its KV cache is full: they point at the window without saying it overflowed.
KV_FULL = {"error": {"code": 500, "message": "failed to find free space in the KV cache", "type": "server_error"}}
MESSAGES = [{"role": "user", "content": "hi"}]
pytestmark = pytest.mark.filterwarnings("ignore:Items? .* `ReadOnly` qualifier:UserWarning")


@pytest.mark.parametrize(
    ("llm_input", "local"),
    [
        ({"model": "openai/m", "api_base": "http://127.0.0.1:8080/v1"}, True),
        ({"model": "openai/m", "api_base": "http://localhost:11434"}, True),
        ({"model": "openai/m", "api_base": "http://[::1]:8000/v1"}, True),
        ({"model": "openai/m", "api_base": "http://192.168.1.20:8000/v1"}, True),
        ({"model": "openai/m", "api_base": "http://vllm:8000/v1"}, True),  # a compose service name
        ({"model": "openai/m", "api_base": "http://gpu-box.local:5001/v1"}, True),
        ({"model": "ollama/llama3"}, True),  # litellm calls localhost when no api_base is given
        ({"model": "openai/m", "api_base": "https://api.openai.com/v1"}, False),
        ({"model": "openai/m", "api_base": "https://8.8.8.8/v1"}, False),
        ({"model": "anthropic/claude-sonnet-4"}, False),
    ],
)
def test_overflow_hints_say_whether_the_server_is_local(llm_input: dict[str, Any], local: bool) -> None:
    hints = overflow_hints(llm_input)
    assert (hints.local, hints.fill) == (local, None)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_local_servers_500_with_weak_words_is_an_overflow(provider: Any, stream: bool) -> None:
    api_base = provider.add(status=500, body=KV_FULL)
    backend = LiteLLMBackend(timeout_seconds=5, fast_path=False)
    llm_input = {
        "model": "openai/test",
        "api_base": api_base,
        "api_key": "sk-test",
        "messages": [{"role": "user", "content": "hi"}],
    }
    try:
        with pytest.raises(ContextOverflow) as raised:
            if stream:
                await backend.stream(llm_input)
            else:
                await backend.complete(llm_input)
    finally:
        await backend.aclose()
    assert "KV cache" in raised.value.message


async def test_the_same_words_in_a_400_are_the_providers_own_error(provider: Any) -> None:
    api_base = provider.add(status=400, body=KV_FULL)
    backend = LiteLLMBackend(timeout_seconds=5, fast_path=False)
    llm_input = {
        "model": "openai/test",
        "api_base": api_base,
        "api_key": "sk-test",
        "messages": [{"role": "user", "content": "hi"}],
    }
    try:
        with pytest.raises(ProviderError) as raised:
            await backend.complete(llm_input)
    finally:
        await backend.aclose()
    assert raised.value.status == 400
