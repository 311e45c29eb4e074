"""The real server's overflow: a route that claims more than the server's ``n_ctx``.

Non-streamed, llama-cpp-python answers 400 "This model's maximum context length is 1024 tokens. However, you
requested N tokens ...": the proxy recognizes it, makes exactly one forced-compaction retry below the window
the server stated, and the server accepts that. Streamed, the same server answers 200 with an empty stream:
well under the window the route claims, that is not taken for an overflow, and the client gets an error
that says what happened (the scripted tier, tests/integration/test_empty_stream.py, pins the other side).
"""

from __future__ import annotations

import openai
import pytest

from proxy.demo.local_run import MODEL, N_CTX, TOOLS, local_route, opening, step_messages
from tests.integration.local_model.conftest import server_tokens, traces

CLAIMED = 4 * N_CTX  # what the route says; the server has N_CTX


def _long_history() -> list[dict]:
    """Six notebook pages: over the server's window, well under the route's claim."""
    messages = opening()
    for page in range(1, 7):
        messages += step_messages(page, lines=12)
    return messages


def test_the_servers_overflow_error_gets_one_forced_retry_that_the_server_accepts(start_proxy, local_model):
    messages = _long_history()
    assert N_CTX < server_tokens(local_model, messages) < CLAIMED / 2
    proxy = start_proxy(
        models=(local_route(local_model, window=CLAIMED, answer_tokens=4),),
        trace_enabled=True,
        summary_max_attempts=1,
        summary_max_rounds=1,
        forced_percent=20,  # a shorter retry: the server reads it at a few dozen tokens a second
    )
    answer = proxy.client(timeout=600).chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    assert answer.choices[0].finish_reason in {"stop", "length"}

    written = traces(proxy.settings.data_dir)
    assert sorted(written) == ["turn-0001-recovery-1.json", "turn-0001.json"]  # exactly one retry
    first, retry = written["turn-0001.json"], written["turn-0001-recovery-1.json"]
    assert first["providerError"]["code"] == "context_length_exceeded"
    assert f"maximum context length is {N_CTX} tokens" in first["providerError"]["message"]
    assert retry["recovery"]["reason"] == "provider_context_overflow"
    assert (retry["budgets"]["modelMaxTokens"], retry["budgets"]["source"]) == (N_CTX, "provider_error")
    assert "providerError" not in retry
    assert retry["usage"]["promptTokens"] + retry["usage"]["completionTokens"] <= N_CTX  # what the server counted


def test_a_streamed_overflow_answered_with_an_empty_stream_is_a_clear_error(start_proxy, local_model):
    proxy = start_proxy(models=(local_route(local_model, window=CLAIMED, answer_tokens=4),), trace_enabled=True)
    with pytest.raises(openai.APIStatusError) as raised:
        proxy.client(timeout=600).chat.completions.create(
            model=MODEL, messages=_long_history(), tools=TOOLS, stream=True
        )
    assert raised.value.status_code == 502
    error = raised.value.body
    assert error["code"] == "empty_stream"
    assert "not taken for an overflow" in error["message"] and "n_ctx" in error["message"]
    assert sorted(traces(proxy.settings.data_dir)) == ["turn-0001.json"]  # no retry
