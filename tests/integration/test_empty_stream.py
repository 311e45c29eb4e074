"""A stream that ends empty (HTTP 200, no chunk, no usage, no error), as llama-cpp-python answers a streamed
prompt over its window: the one forced retry when the request filled the window, else a clear error.

The scripted provider plays the server here (the real one: tests/integration/local_model/test_overflow.py).
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from proxy.provider.science_script import is_summary_request
from proxy.provider.scripted import Reply
from tests.integration.conftest import MODEL, route_to

WINDOW = 1000


def _history(tool_words: int) -> list[dict]:
    """An old tool step with a long output (what a forced pass can preview), then a short recent one."""
    messages: list[dict] = [
        {"role": "system", "content": "You read logs."},
        {"role": "user", "content": "Read the logs, then tell me what they say."},
    ]
    for step, words in ((1, tool_words), (2, 5)):
        call = {"id": f"call_{step}", "type": "function", "function": {"name": "read_log", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{step}", "content": " ".join(f"line{i} ok" for i in range(words))},
        ]
    return [*messages, {"role": "user", "content": "Go on."}]


TOOLS = [{"type": "function", "function": {"name": "read_log", "parameters": {"type": "object", "properties": {}}}}]


def test_an_empty_stream_for_a_request_that_filled_the_window_gets_the_one_forced_retry(start_proxy, provider):
    streamed: list[int] = []

    def script(body: dict) -> Reply:
        if is_summary_request(body) or not body.get("stream"):
            return Reply(content="ok")
        streamed.append(len(body["messages"]))
        return Reply(body=[]) if len(streamed) == 1 else Reply(content="after the retry")

    provider.script(script)
    proxy = start_proxy(
        models=(route_to(provider.url, window=WINDOW, max_output=100),),
        estimator="tiktoken",
        pressure_percent=95,
        trace_enabled=True,
    )
    stream = proxy.client().chat.completions.create(
        model=MODEL, messages=_history(230), tools=TOOLS, stream=True, max_tokens=100
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "after the retry"
    assert len(streamed) == 2  # exactly one retry
    traces = {path.name: json.loads(path.read_text()) for path in proxy.settings.data_dir.glob("context-traces/*/*")}
    assert sorted(traces) == ["turn-0001-recovery-1.json", "turn-0001.json"]
    first, retry = traces["turn-0001.json"], traces["turn-0001-recovery-1.json"]
    assert first["providerError"]["code"] == "context_length_exceeded"
    assert "empty stream" in first["providerError"]["message"]
    assert retry["compaction"]["reason"] == "forced"
    assert "providerError" not in retry


def test_an_empty_stream_well_under_the_window_is_a_clear_error_not_an_overflow(start_proxy, provider):
    provider.script(lambda body: Reply(body=[]))
    proxy = start_proxy(models=(route_to(provider.url, window=WINDOW, max_output=100),), estimator="tiktoken")
    with pytest.raises(openai.APIStatusError) as raised:
        proxy.client().chat.completions.create(model=MODEL, messages=_history(20), tools=TOOLS, stream=True)
    assert raised.value.status_code == 502
    error = raised.value.body
    assert error["code"] == "empty_stream"
    assert "not taken for an overflow" in error["message"] and "n_ctx" in error["message"]
    assert len(provider.history) == 1  # no retry


def test_an_empty_stream_again_after_the_retry_is_a_context_overflow_naming_it(start_proxy, provider):
    provider.script(lambda body: Reply(content="ok") if is_summary_request(body) else Reply(body=[]))
    proxy = start_proxy(
        models=(route_to(provider.url, window=WINDOW, max_output=100),), estimator="tiktoken", pressure_percent=95
    )
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        response = http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": _history(230), "tools": TOOLS, "stream": True, "max_tokens": 100},
        )
    # Nothing more to compact: the retry fills the window as much, its empty stream is an overflow too, and
    # the client is told so (an overflow error its SDK recognizes), after exactly one retry.
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "after one forced compaction retry" in error["message"] and "empty stream" in error["message"]
    assert len([body for body in provider.history if not is_summary_request(body)]) == 2
