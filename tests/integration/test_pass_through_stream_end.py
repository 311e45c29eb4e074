"""A stream ends with its last chunk: no rebuild of the whole answer after it, in any mode.

litellm's stream wrapper rebuilds the whole answer after the provider's last chunk to make its usage
chunk, and the client's end of stream waits for it (1.5 ms for an agent's three-chunk answer; with no
usage from the provider it also counts the whole prompt, 15 ms for an agent's). A client that asks for no
usage gets no usage chunk, so nothing needs that rebuild: legacy and shadow send the client's own request
(no usage asked for), and dynamic mode asks the provider for usage on its own behalf (calibration learns
from it) and reads the provider's own figures. Shown at both sockets: what the scripted provider received
and counted, what the official openai SDK parsed, and what the trace recorded; the fast path's chunks
against acompletion's are compared in ``tests/provider/test_fast_stream.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.provider.scripted import Reply
from tests.acompletion_calls import count_stream_builds

MESSAGES = [
    {"role": "system", "content": "You are a careful lab assistant."},
    {"role": "user", "content": "Summarize the assay results."},
]


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return count_stream_builds(monkeypatch)  # before the proxy starts: its fast path takes the builder then


@pytest.mark.parametrize(("mode", "asks_usage"), [("legacy", False), ("shadow", False), ("dynamic", True)])
def test_a_stream_without_usage_is_not_rebuilt_after_its_last_chunk(
    start_proxy: Any, provider: Any, builds: list[int], mode: str, asks_usage: bool
) -> None:
    provider.script(lambda body: Reply(content="The assay shows a clear dose response."))
    proxy = start_proxy(mode=mode, trace_enabled=True)
    stream = proxy.client().chat.completions.create(
        model="test-model", messages=MESSAGES, stream=True, extra_headers={"x-session-id": f"end-{mode}"}
    )
    chunks = list(stream)

    # The client's socket: the answer whole, ended by its finish chunk, and no usage it did not ask for.
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "The assay shows a clear dose response."
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert all(c.usage is None for c in chunks)
    # The provider's socket: legacy and shadow send the client's own request (no usage asked for); the
    # dynamic mode asks for usage itself, and reads it from the provider's own usage chunk.
    sent = provider.history[-1]
    assert sent["messages"][-1]["content"] == MESSAGES[-1]["content"]
    assert bool((sent.get("stream_options") or {}).get("include_usage")) is asks_usage
    assert builds == []
    # What the proxy learnt: the provider's own count of the prompt (its usage chunk), where it asked.
    (trace,) = [json.loads(p.read_text()) for p in Path(proxy.settings.data_dir, "context-traces").rglob("*.json")]
    if asks_usage:
        assert trace["usage"]["promptTokens"] == provider.provider.prompt_tokens[-1]
        assert trace["calibration"]["source"] == "usage"
        assert trace["calibration"]["providerTokens"] == provider.provider.prompt_tokens[-1]
    else:
        assert trace.get("usage") is None
