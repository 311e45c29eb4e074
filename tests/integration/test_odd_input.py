"""Odd but legal input through real HTTP: never a 5xx, and the session keeps working on the next turn."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import pytest

SCHEMAS = json.loads((Path(__file__).parents[1] / "data" / "openai-chat-schemas.json").read_text())
ERROR_SCHEMA = jsonschema.Draft202012Validator(SCHEMAS["schemas"]["ErrorResponse"])
HEADERS = {"content-type": "application/json", "x-session-id": "odd"}
FIRST = '{"role": "user", "content": "Summarise the files."}'


def _raw(messages: str, extra: str = "") -> bytes:
    return f'{{"model": "test-model", "messages": [{messages}]{extra}}}'.encode()


@pytest.mark.parametrize("mode", ["dynamic", "legacy"])
def test_lone_surrogates_become_replacement_characters_and_the_session_goes_on(start_proxy, provider, mode):
    proxy = start_proxy(mode=mode, trace_enabled=True)
    # What json.dumps writes for a file name read with surrogateescape: a lone surrogate, legal JSON.
    odd = '{"role": "user", "content": "Open data_\\udcff.csv and \\ud800 \\ud83d\\ude00", "name": "agent\\udc80"}'
    with httpx.Client(base_url=proxy.url) as http:
        first = http.post("/v1/chat/completions", content=_raw(f"{FIRST}, {odd}"), headers=HEADERS)
        assert first.status_code == 200, first.text
        follow_up = f'{FIRST}, {odd}, {{"role": "assistant", "content": "ok"}}, {{"role": "user", "content": "Next."}}'
        second = http.post("/v1/chat/completions", content=_raw(follow_up), headers=HEADERS)
    assert second.status_code == 200, second.text
    for sent in provider.history:
        received = [m for m in sent["messages"] if "data_" in json.dumps(m, ensure_ascii=False)]
        assert received, sent["messages"]
        assert "Open data_\ufffd.csv and \ufffd \U0001f600" in json.dumps(received, ensure_ascii=False)
    assert len(provider.history) == 2


REFUSED = [
    pytest.param(_raw(FIRST, ', "temperature": NaN'), "NaN", id="nan"),
    pytest.param(_raw(FIRST, ', "temperature": Infinity'), "Infinity", id="infinity"),
    pytest.param(_raw(FIRST, ', "temperature": -Infinity'), "-Infinity", id="minus-infinity"),
    pytest.param(_raw(FIRST, ', "temperature": 1e999'), "too large", id="float-overflow"),
    pytest.param(
        _raw('{"role": "user", "content": [{"type": "text", "text": "x", "v": NaN}]}'), "NaN", id="nan-in-part"
    ),
    pytest.param(_raw(FIRST, ', "metadata": {"x": ' + "[" * 1_000 + "]" * 1_000 + "}"), "deeper", id="depth-1000"),
    pytest.param(_raw(FIRST, ', "x": ' + "[" * 100_000 + "]" * 100_000), "deeper", id="depth-100000"),
    pytest.param(b"[" * 100_000, "balance", id="unclosed-100000"),
    pytest.param(b'[{"model": "test-model"}]', "JSON object", id="array"),
    pytest.param(b'"hello"', "JSON object", id="string"),
    pytest.param(b"42", "JSON object", id="number"),
    pytest.param(b"null", "JSON object", id="null"),
    pytest.param(_raw(FIRST, ', "seed": ' + "9" * 5_000), "number", id="huge-integer"),
]


@pytest.mark.parametrize(("raw", "words"), REFUSED)
def test_odd_json_is_a_400_and_the_session_goes_on(start_proxy, provider, raw, words):
    proxy = start_proxy(mode="dynamic")
    with httpx.Client(base_url=proxy.url) as http:
        refused = http.post("/v1/chat/completions", content=raw, headers=HEADERS)
        assert refused.status_code == 400, refused.text
        ERROR_SCHEMA.validate(refused.json())
        assert words in refused.json()["error"]["message"]
        assert provider.history == []
        fine = http.post("/v1/chat/completions", content=_raw(FIRST), headers=HEADERS)
    assert fine.status_code == 200, fine.text


def test_more_messages_than_the_cap_is_a_400_naming_the_setting(start_proxy, provider):
    proxy = start_proxy(mode="dynamic", max_request_messages=50)
    messages = ", ".join([FIRST] * 51)
    with httpx.Client(base_url=proxy.url) as http:
        refused = http.post("/v1/chat/completions", content=_raw(messages), headers=HEADERS)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert "CONTEXT_PROXY_MAX_REQUEST_MESSAGES" in error["message"] and "51" in error["message"]
        assert (error["code"], error["param"]) == ("too_many_messages", "messages")
        assert provider.history == []
        at_cap = http.post("/v1/chat/completions", content=_raw(", ".join([FIRST] * 50)), headers=HEADERS)
    assert at_cap.status_code == 200, at_cap.text


NO_USER_MESSAGE = [
    pytest.param([{"role": "system", "content": "Say hello."}], id="system-only"),
    pytest.param([{"role": "developer", "content": "Say hello."}], id="developer-only"),
    pytest.param([{"role": "system", "content": "Go on."}, {"role": "assistant", "content": "Once"}], id="prefill"),
]


@pytest.mark.parametrize("messages", NO_USER_MESSAGE)
def test_a_conversation_without_a_user_message_is_served_as_openai_serves_it(start_proxy, provider, messages):
    proxy = start_proxy(mode="dynamic")
    with httpx.Client(base_url=proxy.url) as http:
        first = http.post("/v1/chat/completions", json={"model": "test-model", "messages": messages}, headers=HEADERS)
        assert first.status_code == 200, first.text
        later = [*messages, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "Again."}]
        second = http.post("/v1/chat/completions", json={"model": "test-model", "messages": later}, headers=HEADERS)
    assert second.status_code == 200, second.text
    assert [m["content"] for m in provider.history[0]["messages"] if m["role"] != "system"] == [
        m["content"] for m in messages if m["role"] not in ("system", "developer")
    ]
