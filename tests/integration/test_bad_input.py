"""Bad input gets a 4xx OpenAI-shaped error naming the problem, nothing is stored, and serving goes on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

SCHEMAS = json.loads((Path(__file__).parents[1] / "data" / "openai-chat-schemas.json").read_text())
ERROR_SCHEMA = jsonschema.Draft202012Validator(SCHEMAS["schemas"]["ErrorResponse"])

GOOD = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
}


def _json(body: Any) -> bytes:
    return json.dumps(body).encode()


BAD_BODIES = [
    pytest.param(b'{"model": "test-model", "messages": [', 400, "not valid JSON", id="malformed-json"),
    pytest.param(b"\xff\xfe{}", 400, "UTF-8", id="non-utf8"),
    pytest.param(_json([1, 2]), 400, "JSON object", id="not-an-object"),
    pytest.param(_json({"messages": GOOD["messages"]}), 400, "model", id="missing-model"),
    pytest.param(_json({"model": "test-model"}), 400, "messages", id="missing-messages"),
    pytest.param(_json({"model": "test-model", "messages": []}), 400, "messages", id="empty-messages"),
    pytest.param(
        _json({"model": "test-model", "messages": [{"role": "wizard", "content": "x"}]}),
        400,
        "messages.0",
        id="unknown-role",
    ),
    pytest.param(
        _json(
            {
                "model": "test-model",
                "messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c9", "content": "r"}],
            }
        ),
        400,
        "does not answer a tool call",
        id="orphan-tool-result",
    ),
    pytest.param(
        _json(
            {
                "model": "test-model",
                "messages": [{"role": "user", "content": "x"}, CALL, {"role": "user", "content": "next"}],
            }
        ),
        400,
        "not answered",
        id="call-without-result",
    ),
    pytest.param(
        _json({"model": "test-model", "messages": [{"role": "user", "content": "x"}, CALL]}),
        400,
        "not answered",
        id="trailing-call-without-result",
    ),
    pytest.param(
        _json({"model": "no-such-model", "messages": GOOD["messages"]}), 404, "no-such-model", id="unknown-model"
    ),
    pytest.param(_json({**GOOD, "max_tokens": -5}), 400, "max_tokens", id="negative-max-tokens"),
]


def _assert_error(response: httpx.Response, status: int, words: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    ERROR_SCHEMA.validate(body)
    assert words in body["error"]["message"]
    return body


def _stored_sessions(data_dir: Path) -> int:
    import sqlite3

    database = data_dir / "sessions.sqlite3"
    if not database.exists():
        return 0
    with sqlite3.connect(database) as connection:
        return int(connection.execute("SELECT count(*) FROM sessions").fetchone()[0])


@pytest.mark.parametrize(("raw", "status", "words"), BAD_BODIES)
def test_bad_request_is_refused_and_nothing_is_stored(legacy_proxy, provider, raw, status, words):
    with httpx.Client(base_url=legacy_proxy.url) as http:
        response = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        _assert_error(response, status, words)
        assert _stored_sessions(legacy_proxy.settings.data_dir) == 0
        assert provider.history == []
        assert http.post("/v1/chat/completions", json=GOOD).status_code == 200  # still serving


def test_oversized_body_gets_413(start_proxy, provider):
    proxy = start_proxy(mode="legacy", max_request_bytes=2_000)
    body = {"model": "test-model", "messages": [{"role": "user", "content": "x" * 5_000}]}
    with httpx.Client(base_url=proxy.url) as http:
        _assert_error(http.post("/v1/chat/completions", json=body), 413, "exceeds the limit")
        chunked = http.post("/v1/chat/completions", content=iter([json.dumps(body).encode()]))  # no content-length
        _assert_error(chunked, 413, "exceeds the limit")
    assert _stored_sessions(proxy.settings.data_dir) == 0


def test_bad_scope_header_is_refused(legacy_proxy):
    with httpx.Client(base_url=legacy_proxy.url) as http:
        response = http.post("/v1/chat/completions", json=GOOD, headers={"x-agent-scope": "admin"})
    _assert_error(response, 400, "x-agent-scope")


def test_master_key_guards_v1_but_not_health(start_proxy):
    proxy = start_proxy(mode="legacy", master_key="sk-master")
    with httpx.Client(base_url=proxy.url) as http:
        _assert_error(http.post("/v1/chat/completions", json=GOOD), 401, "API key")
        _assert_error(http.get("/v1/models", headers={"authorization": "Bearer wrong"}), 401, "API key")
        assert http.get("/health/liveliness").status_code == 200
        assert http.get("/health/readiness").status_code == 200
        ok = http.post("/v1/chat/completions", json=GOOD, headers={"authorization": "Bearer sk-master"})
        assert ok.status_code == 200
        models = http.get("/v1/models", headers={"authorization": "Bearer sk-master"}).json()
    assert [m["id"] for m in models["data"]] == ["test-model"]
    jsonschema.Draft202012Validator(SCHEMAS["schemas"]["ListModelsResponse"]).validate(models)


def test_unknown_route_and_method_get_openai_shaped_errors(legacy_proxy):
    with httpx.Client(base_url=legacy_proxy.url) as http:
        _assert_error(http.get("/v1/embeddings"), 404, "/v1/embeddings")
        _assert_error(http.get("/v1/chat/completions"), 405, "/v1/chat/completions")


USER = {"role": "user", "content": "Index the peaks."}
SCHEMA_VIOLATIONS = [
    pytest.param({"messages": [{"role": "user", "content": [{"type": "imagex"}]}]}, "messages.0.content.0", id="user-unknown-part"),  # noqa: E501
    pytest.param({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages.0.content.0.image_url", id="user-part-missing-field"),  # noqa: E501
    pytest.param({"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}, USER]}, "messages.0.content.0", id="system-image-part"),  # noqa: E501
    pytest.param({"messages": [{"role": "developer", "content": [{"type": "input_audio", "input_audio": {}}]}, USER]}, "messages.0.content.0", id="developer-audio-part"),  # noqa: E501
    pytest.param({"messages": [USER, {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}, USER]}, "messages.1.content.0", id="assistant-image-part"),  # noqa: E501
    pytest.param({"messages": [USER, {**CALL}, {"role": "tool", "tool_call_id": "c1", "content": [{"type": "file", "file": {}}]}]}, "messages.2.content.0", id="tool-file-part"),  # noqa: E501
    pytest.param({"messages": [USER, {**CALL, "tool_calls": {"id": "c1"}}]}, "messages.1.tool_calls", id="tool-calls-not-a-list"),  # noqa: E501
    pytest.param({"temperature": 2.5}, "temperature", id="temperature-above-2"),
    pytest.param({"temperature": -0.1}, "temperature", id="temperature-negative"),
    pytest.param({"temperature": "0.5"}, "temperature", id="temperature-a-string"),
    pytest.param({"top_p": 1.5}, "top_p", id="top-p-above-1"),
    pytest.param({"presence_penalty": -2.5}, "presence_penalty", id="presence-penalty-below-2"),
    pytest.param({"frequency_penalty": 3}, "frequency_penalty", id="frequency-penalty-above-2"),
    pytest.param({"n": 0}, "n", id="n-zero"),
    pytest.param({"top_logprobs": 21}, "top_logprobs", id="top-logprobs-above-20"),
    pytest.param({"max_completion_tokens": 1.5}, "max_completion_tokens", id="max-completion-tokens-a-float"),
    pytest.param({"stream": "yes"}, "stream", id="stream-a-string"),
    pytest.param({"seed": "7"}, "seed", id="seed-a-string"),
    pytest.param({"user": 42}, "user", id="user-a-number"),
    pytest.param({"stop": [1, 2]}, "stop.0", id="stop-numbers"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "param"), SCHEMA_VIOLATIONS)
def test_a_schema_violation_is_a_400_naming_it_and_the_session_goes_on(legacy_proxy, provider, fields, param):
    session = {"x-session-id": "schema-violation"}
    with httpx.Client(base_url=legacy_proxy.url) as http:
        response = http.post("/v1/chat/completions", json={**GOOD, **fields}, headers=session)
        body = _assert_error(response, 400, param)
        assert body["error"]["param"] == param
        assert body["error"]["type"] == "invalid_request_error"
        assert provider.history == []
        assert http.post("/v1/chat/completions", json=GOOD, headers=session).status_code == 200


def test_a_model_whose_window_the_output_reserve_fills_gets_a_400_naming_both(start_proxy, provider):
    # No model list: the window of a client-named model is known only when it is asked for (litellm's
    # model map; for an unknown model, the 128,000-token fallback), so the check happens per request.
    proxy = start_proxy(mode="dynamic", models=(), output_reserve_tokens=200_000)
    body = {"model": "openai/scripted", "messages": [{"role": "user", "content": "hello"}]}
    with httpx.Client(base_url=proxy.url) as http:
        response = http.post("/v1/chat/completions", json=body, headers={"x-session-id": "reserve"})
    _assert_error(response, 400, "OUTPUT_RESERVE_TOKENS=200000")
    error = response.json()["error"]
    assert error["code"] == "output_reserve_exceeds_window"
    assert "128000 tokens" in error["message"] and "'openai/scripted'" in error["message"]
    assert provider.history == []
    assert _stored_sessions(proxy.settings.data_dir) == 0
