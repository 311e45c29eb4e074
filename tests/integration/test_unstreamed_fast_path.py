"""A chat client that says ``stream: false`` is served as one that says nothing: on the fast path.

Many clients send ``"stream": false`` for a whole answer (the openai SDK does whenever it is given
``stream=False``). The fast path took only calls without the key, so every such turn went through
``litellm.acompletion``: several times the CPU, and the openai SDK's request body (megabytes for a long
history) kept by a cycle until an older-generation collection came (bench part 5 grew past 850 MiB)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.acompletion_calls import count_acompletion
from tests.integration.conftest import MODEL, ProviderHandle, ProxyHandle

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Measure sample A."}]


@pytest.mark.parametrize("stream", [False, None], ids=["stream-false", "no-stream-key"])
def test_a_whole_answer_takes_the_fast_path_whatever_the_client_says_of_streaming(
    start_proxy: Callable[..., ProxyHandle],
    provider: ProviderHandle,
    monkeypatch: pytest.MonkeyPatch,
    stream: bool | None,
) -> None:
    through_acompletion = count_acompletion(monkeypatch)
    client = start_proxy().client()
    extra = {} if stream is None else {"stream": stream}
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, **extra)  # type: ignore[call-overload]
    assert answer.choices[0].message.content == "ok"
    assert through_acompletion == []
    # what the provider was sent: litellm's OpenAI route leaves a ``stream: false`` out, as acompletion does
    (sent,) = provider.history
    assert "stream" not in sent
    assert sent["messages"][-1] == MESSAGES[-1]
