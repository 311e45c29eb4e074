"""A pass-through stream (legacy and shadow send a chat client's own request) ends with its last chunk.

A client that asks for no usage gets no usage chunk, and a provider asked for none sends none; litellm's
stream wrapper used to rebuild the whole answer after the last chunk anyway, counting the whole prompt
(15 ms for an agent's), and the client's end of stream waited for it. Shown at both sockets: what the
scripted provider received, and what the official openai SDK parsed; the fast path's chunks against
acompletion's are compared in ``tests/provider/test_fast_stream.py``.
"""

from __future__ import annotations

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


@pytest.mark.parametrize(("mode", "rebuilt"), [("legacy", False), ("shadow", False), ("dynamic", True)])
def test_a_stream_without_usage_is_not_rebuilt_after_its_last_chunk(
    start_proxy: Any, provider: Any, builds: list[int], mode: str, rebuilt: bool
) -> None:
    provider.script(lambda body: Reply(content="The assay shows a clear dose response."))
    proxy = start_proxy(mode=mode)
    stream = proxy.client().chat.completions.create(model="test-model", messages=MESSAGES, stream=True)
    chunks = list(stream)

    # The client's socket: the answer whole, ended by its finish chunk, and no usage it did not ask for.
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "The assay shows a clear dose response."
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert all(c.usage is None for c in chunks)
    # The provider's socket: legacy and shadow send the client's own request (no usage asked for); the
    # dynamic mode asks for usage itself, so its wrapper builds the usage chunk it then keeps from the client.
    sent = provider.history[-1]
    assert sent["messages"][-1]["content"] == MESSAGES[-1]["content"]
    assert bool((sent.get("stream_options") or {}).get("include_usage")) is rebuilt
    assert bool(builds) is rebuilt
