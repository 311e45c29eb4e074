"""Provider faults through real HTTP: mapped errors, and the exactly-once overflow retry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from proxy.provider.science_script import is_summary_request
from proxy.provider.scripted import Reply

SCHEMAS = json.loads((Path(__file__).parents[1] / "data" / "openai-chat-schemas.json").read_text())
ERROR_SCHEMA = jsonschema.Draft202012Validator(SCHEMAS["schemas"]["ErrorResponse"])
MESSAGES = [{"role": "user", "content": "Analyse the spectra."}]
OVERFLOW = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens. However, your messages "
        "resulted in 9000 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}


# About 8,100 tiktoken tokens over ten turns, about 10,100 as a fresh route's calibrated estimate counts
# them (tiktoken x the 1.25 start margin; compaction can drop the old ones): more than the 8,192
# OVERFLOW states, well inside the route's 16,000.
LARGE = [
    MESSAGES[0],
    *(
        message
        for turn in range(10)
        for message in (
            {"role": "assistant", "content": f"Notes on spectrum {turn}: " + "peak " * 800},
            {"role": "user", "content": f"Go on with spectrum {turn + 1}."},
        )
    ),
]


def _post(url: str, session: str = "faults", **extra: Any) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=30) as http:
        return http.post(
            "/v1/chat/completions",
            json={"model": "test-model", "messages": MESSAGES, **extra},
            headers={"x-session-id": session},
        )


def _overflow_first(times: int):
    calls = {"n": 0}

    def script(body: dict[str, Any]) -> Reply:
        calls["n"] += 1
        if calls["n"] <= times:
            return Reply(error_status=400, error_body=OVERFLOW)
        return Reply(content="fits now")

    return script


def test_rate_limit_keeps_status_and_retry_after(legacy_proxy, provider):
    provider.script(
        lambda body: Reply(
            error_status=429,
            headers={"retry-after": "7"},
            error_body={
                "error": {
                    "message": "Rate limit reached for requests",
                    "type": "requests",
                    "code": "rate_limit_exceeded",
                }
            },
        )
    )
    response = _post(legacy_proxy.url)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    ERROR_SCHEMA.validate(response.json())
    assert "Rate limit reached" in response.json()["error"]["message"]


@pytest.mark.parametrize("status", [500, 503])
def test_provider_server_errors_are_mapped_not_leaked(legacy_proxy, provider, status):
    provider.script(lambda body: Reply(error_status=status, error_body={"error": {"message": "upstream exploded"}}))
    response = _post(legacy_proxy.url)
    assert 500 <= response.status_code <= 504
    ERROR_SCHEMA.validate(response.json())
    assert "Traceback" not in response.text


def test_unreachable_provider_is_a_gateway_error(start_proxy, provider):
    from proxy.kernel.config import ModelRoute

    dead = ModelRoute("test-model", {"model": "openai/x", "api_base": "http://127.0.0.1:9/v1", "api_key": "k"})
    proxy = start_proxy(mode="legacy", models=(dead,))
    response = _post(proxy.url)
    assert response.status_code in (502, 503, 504)
    ERROR_SCHEMA.validate(response.json())


@pytest.mark.parametrize("mode", ["legacy", "shadow"])
def test_overflow_outside_dynamic_is_surfaced_without_retry(start_proxy, provider, mode):
    provider.script(_overflow_first(1))
    response = _post(start_proxy(mode=mode).url)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "context_length_exceeded" in error["message"]  # LangChain matches on the message text
    assert len(provider.history) == 1


def test_overflow_then_success_retries_exactly_once_in_dynamic(start_proxy, provider):
    proxy = start_proxy(mode="dynamic", trace_enabled=True)
    provider.script(_overflow_first(1))
    response = _post(proxy.url, messages=LARGE)  # a believable overflow of 8,192
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "fits now"
    assert len([body for body in provider.history if not is_summary_request(body)]) == 2  # the forced pass summarizes
    folder = proxy.settings.data_dir / "context-traces" / "faults"
    first = json.loads((folder / "turn-0001.json").read_text())
    retry = json.loads((folder / "turn-0001-recovery-1.json").read_text())
    assert first["providerError"]["code"] == "context_length_exceeded"
    assert retry["recovery"]["attempt"] == 1
    assert retry["budgets"]["modelMaxTokens"] == 8192  # the limit the provider stated is used for the retry


def test_overflow_twice_is_surfaced_after_exactly_two_attempts(start_proxy, provider):
    proxy = start_proxy(mode="dynamic")
    provider.script(_overflow_first(99))
    client = proxy.client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="test-model", messages=MESSAGES, extra_headers={"x-session-id": "twice"})
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.response.headers["x-context-id"] == "twice"
    assert caught.value.response.headers["x-context-mode"] == "dynamic"
    assert "forced compaction retry" in caught.value.message
    assert len(provider.history) == 2


def test_streamed_overflow_is_retried_before_the_stream_starts(start_proxy, provider):
    proxy = start_proxy(mode="dynamic")
    provider.script(_overflow_first(1))
    stream = proxy.client().chat.completions.create(model="test-model", messages=MESSAGES, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "fits now"
    assert len(provider.history) == 2


def _overflow_stating(limit: int, first_of: int = 1):
    body = {"error": {**OVERFLOW["error"], "message": f"This model's maximum context length is {limit} tokens."}}
    calls = {"n": 0}

    def script(request: dict[str, Any]) -> Reply:
        calls["n"] += 1
        return Reply(error_status=400, error_body=body) if calls["n"] <= first_of else Reply(content="fits now")

    return script


def _budgets(proxy, session: str) -> dict[str, Any]:
    folder = proxy.settings.data_dir / "context-traces" / session
    return json.loads(sorted(folder.glob("turn-*.json"))[-1].read_text())["budgets"]


def test_an_overflow_the_request_could_not_cause_teaches_no_limit(start_proxy, provider):
    proxy = start_proxy(mode="dynamic", trace_enabled=True)
    # A tiny window, stated after a request of a few hundred tokens: even the floor (4,000) would have
    # fit that request, so the statement is not about it.
    provider.script(_overflow_stating(64))
    assert _post(proxy.url, session="victim-0").status_code == 400  # its own retry believed 64: nothing fits
    assert _post(proxy.url, session="other").status_code == 200
    budgets = _budgets(proxy, "other")
    assert (budgets["modelMaxTokens"], budgets["source"]) == (16_000, "config")


def test_a_believable_overflow_is_learned_for_the_route_above_the_floor(start_proxy, provider):
    proxy = start_proxy(mode="dynamic", trace_enabled=True)
    provider.script(_overflow_stating(8192))
    assert _post(proxy.url, session="big", messages=LARGE).status_code == 200
    assert _post(proxy.url, session="other").status_code == 200
    assert _budgets(proxy, "other") == {**_budgets(proxy, "other"), "modelMaxTokens": 8192, "source": "provider_error"}


def test_a_believable_overflow_stating_a_tiny_window_is_learned_at_the_floor(start_proxy, provider):
    proxy = start_proxy(mode="dynamic", trace_enabled=True)
    provider.script(_overflow_stating(100))  # consistent with the request, but below the floor
    assert _post(proxy.url, session="big-2", messages=LARGE).status_code == 400  # nothing fits 100 for its retry
    assert _post(proxy.url, session="other-2").status_code == 200
    budgets = _budgets(proxy, "other-2")
    assert (budgets["modelMaxTokens"], budgets["source"]) == (4000, "provider_error")  # max(1,024, 16,000 / 4)


NO_CHOICES = {"id": "chatcmpl-x", "object": "chat.completion", "created": 1, "model": "scripted", "choices": []}


@pytest.mark.parametrize("mode", ["legacy", "dynamic"])
def test_an_answer_without_choices_is_a_502_and_the_session_goes_on(start_proxy, provider, mode):
    proxy = start_proxy(mode=mode)
    provider.script(lambda body: Reply(body=NO_CHOICES))
    response = _post(proxy.url)
    assert response.status_code == 502, response.text
    ERROR_SCHEMA.validate(response.json())
    assert "without any choice" in response.json()["error"]["message"]
    provider.script(lambda body: Reply(content="fine"))
    assert _post(proxy.url).json()["choices"][0]["message"]["content"] == "fine"


def test_an_answer_missing_choices_is_a_502(legacy_proxy, provider):
    provider.script(lambda body: Reply(body={k: v for k, v in NO_CHOICES.items() if k != "choices"}))
    response = _post(legacy_proxy.url)
    assert response.status_code == 502
    assert "choices" in response.json()["error"]["message"]


def test_a_stream_without_any_content_is_a_502_before_the_first_byte(start_proxy, provider):
    proxy = start_proxy(mode="dynamic")
    provider.script(lambda body: Reply(body=[]))  # the provider sends only [DONE]
    response = _post(proxy.url, stream=True)
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    # Far under the window: not taken for an overflow, and the error says what happened and what to check.
    assert error["code"] == "empty_stream"
    assert "ended the stream without any choice content" in error["message"]
    assert "not taken for an overflow" in error["message"]
    assert len(provider.history) == 1  # no retry


def test_a_stream_whose_last_chunk_only_carries_usage_is_relayed(legacy_proxy, provider):
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "scripted"}
    events = [
        {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None}]},
        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**chunk, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}},
    ]
    provider.script(lambda body: Reply(body=events))
    stream = legacy_proxy.client().chat.completions.create(
        model="test-model", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hi"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 4


@pytest.mark.parametrize("mode", ["legacy", "dynamic"])
def test_an_answer_cut_mid_body_says_it_broke_off(start_proxy, provider, mode):
    proxy = start_proxy(mode=mode)
    whole = {**NO_CHOICES, "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * 200}}]}
    provider.script(lambda body: Reply(body=whole, cut_after=60))
    response = _post(proxy.url)
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "provider_answer_incomplete"
    assert "broke off mid-body" in error["message"]
    assert "Could not reach" not in error["message"]
    provider.script(lambda body: Reply(content="fine"))
    assert _post(proxy.url).status_code == 200


def test_a_client_mistake_the_provider_rejects_is_a_400_naming_it(legacy_proxy, provider):
    rejection = {
        "error": {
            "message": "Invalid 'messages[0].content[0].image_url.url': expected a valid URL.",
            "type": "invalid_request_error",
            "param": "messages[0].content[0].image_url.url",
            "code": "invalid_value",
        }
    }
    provider.script(lambda body: Reply(error_status=400, error_body=rejection))
    response = _post(legacy_proxy.url)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "invalid_value",
        "messages[0].content[0].image_url.url",
    )
    assert "Could not reach" not in error["message"]
