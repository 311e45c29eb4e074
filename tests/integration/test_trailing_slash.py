"""A route path with a trailing slash is served as the route (it was an empty 307 the SDKs do not follow
for a POST, issue 39); a path that is no route stays a JSON 404 with or without the slash."""

from __future__ import annotations

import httpx
import pytest

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("path", ["/v1/chat/completions/", "/chat/completions/", "/v1/chat/completions//"])
def test_a_chat_path_with_a_trailing_slash_is_served(start_proxy, provider, path: str) -> None:
    proxy = start_proxy()
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        answer = http.post(path, json=CHAT, headers={"x-session-id": "slash"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "ok"
    assert len(provider.history) == 1


def test_other_routes_with_a_trailing_slash_are_served_in_their_api_shape(start_proxy, provider) -> None:
    proxy = start_proxy()
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        messages = http.post(
            "/v1/messages/", json={"model": "test-model", "max_tokens": 50, "messages": CHAT["messages"]}
        )
        assert messages.status_code == 200, messages.text
        assert messages.json()["type"] == "message"
        assert http.get("/health/readiness/").json()["status"] == "ready"
        assert http.get("/v1/models/").json()["data"][0]["id"] == "test-model"
        missing = http.post("/v1/nothing/", json=CHAT)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
