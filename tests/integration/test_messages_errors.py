"""Errors of ``/v1/messages`` in Anthropic's shape, as the official ``anthropic`` SDK raises them."""

from __future__ import annotations

import re
from typing import Any

import anthropic
import httpx
import pytest

from proxy.provider.scripted import Reply
from tests.integration.conftest import MODEL, ProxyHandle

USER = [{"role": "user", "content": "hi"}]


def sdk(proxy: ProxyHandle, key: str = "sk-client") -> anthropic.Anthropic:
    return proxy.anthropic_client(api_key=key)


def error_of(exc: anthropic.APIStatusError) -> dict[str, Any]:
    body = exc.body
    assert isinstance(body, dict) and body["type"] == "error", body
    return body["error"]


def test_bad_input_is_a_400_invalid_request_error_and_stores_nothing(start_proxy, provider):
    proxy = start_proxy()
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk(proxy).messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": [{"type": "bogus", "x": 1}]}]
        )
    assert caught.value.status_code == 400
    error = error_of(caught.value)
    assert error["type"] == "invalid_request_error"
    assert "bogus" in error["message"]
    assert provider.history == []
    assert not (proxy.settings.data_dir / "context-traces").exists()


def test_orphan_tool_result_is_refused_before_the_provider(start_proxy, provider):
    proxy = start_proxy()
    orphan = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "x"}]}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk(proxy).messages.create(model=MODEL, max_tokens=10, messages=orphan)
    assert error_of(caught.value)["type"] == "invalid_request_error"
    assert provider.history == []


def test_missing_max_tokens_and_non_json_are_400s(start_proxy):
    proxy = start_proxy()
    with httpx.Client(base_url=proxy.url) as http:
        missing = http.post("/v1/messages", json={"model": MODEL, "messages": USER})
        garbage = http.post("/v1/messages", content=b"{not json", headers={"content-type": "application/json"})
    for response in (missing, garbage):
        assert response.status_code == 400
        assert response.json()["type"] == "error"
        assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("header", ["x-api-key", "authorization"])
def test_bad_key_is_a_401_authentication_error(start_proxy, provider, header):
    proxy = start_proxy(master_key="master-secret")
    with pytest.raises(anthropic.AuthenticationError) as caught:
        if header == "x-api-key":
            sdk(proxy, key="wrong").messages.create(model=MODEL, max_tokens=10, messages=USER)
        else:
            proxy.anthropic_client(auth_token="wrong").messages.create(model=MODEL, max_tokens=10, messages=USER)
    assert caught.value.status_code == 401
    assert error_of(caught.value)["type"] == "authentication_error"
    assert provider.history == []


def test_master_key_as_x_api_key_or_bearer_token_is_accepted(start_proxy, provider):
    proxy = start_proxy(master_key="master-secret")
    by_key = sdk(proxy, key="master-secret").messages.create(model=MODEL, max_tokens=10, messages=USER)
    bearer = proxy.anthropic_client(auth_token="master-secret")
    by_token = bearer.messages.count_tokens(model=MODEL, messages=USER)
    assert by_key.content[0].text == "ok"  # type: ignore[union-attr]
    assert by_token.input_tokens > 0


def test_unknown_model_is_a_404_not_found_error(start_proxy, provider):
    """In Anthropic's shape, with the one text every ingress gives (the front door's route lookup)."""
    proxy = start_proxy()
    with pytest.raises(anthropic.NotFoundError) as caught:
        sdk(proxy).messages.create(model="no-such-model", max_tokens=10, messages=USER)
    message = "The model 'no-such-model' does not exist or you do not have access to it."
    assert error_of(caught.value) == {"type": "not_found_error", "message": message}
    with pytest.raises(anthropic.NotFoundError):
        sdk(proxy).messages.count_tokens(model="no-such-model", messages=USER)


def test_overflow_that_survives_the_retry_reads_as_prompt_is_too_long(start_proxy, provider):
    provider.script(lambda body: Reply(content="never"), context_window=5)
    proxy = start_proxy()
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk(proxy).messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x " * 200}])
    error = error_of(caught.value)
    assert error["type"] == "invalid_request_error"
    # Claude Code parses exactly this sentence for the two numbers.
    match = re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum", error["message"])
    assert match, error["message"]
    assert int(match.group(1)) > int(match.group(2)) == 5
    # The forced pass after the stated 5-token window either fails to assemble or overflows once more.
    assert 1 <= len(provider.history) <= 2


@pytest.mark.parametrize(
    ("status", "kind", "sdk_error"),
    [
        (529, "overloaded_error", anthropic.InternalServerError),
        (503, "overloaded_error", anthropic.InternalServerError),
        (429, "rate_limit_error", anthropic.RateLimitError),
        (500, "api_error", anthropic.InternalServerError),
    ],
)
def test_provider_failures_keep_anthropic_status_and_type(start_proxy, provider, status, kind, sdk_error):
    body = {"error": {"message": "upstream says no", "type": "server_error"}}
    provider.script(lambda _: Reply(error_status=status, error_body=body))
    proxy = start_proxy()
    with pytest.raises(sdk_error) as caught:
        sdk(proxy).messages.create(model=MODEL, max_tokens=10, messages=USER)
    assert caught.value.status_code == (529 if kind == "overloaded_error" else status)
    assert error_of(caught.value)["type"] == kind


def test_head_root_is_a_plain_404_and_the_proxy_keeps_serving(start_proxy, provider):
    proxy = start_proxy()
    with httpx.Client(base_url=proxy.url) as http:
        assert http.head("/").status_code == 404
    assert sdk(proxy).messages.create(model=MODEL, max_tokens=10, messages=USER).content


def test_a_bad_message_inside_a_history_the_proxy_already_translated_is_refused_naming_it(start_proxy, provider):
    """The ingress validates and translates a resent history once (``translations.py``); a history that
    resends it with one bad message inside is still refused at the socket, naming that message, before the
    provider or the store, and the good history after it is served as before."""
    proxy = start_proxy(trace_enabled=True)
    history: list[Any] = [
        {"role": "user", "content": "Measure sample A."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "measure", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "4.2 mg"}]},
    ]
    headers = {"x-session-id": "s-resent"}
    sdk(proxy).messages.create(model=MODEL, max_tokens=10, messages=history, extra_headers=headers)
    sent = len(provider.history)
    bad = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_2", "name": "", "input": {}}]}
    resent = [*history, {"role": "assistant", "content": "It weighs 4.2 mg."}, bad, *USER]
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk(proxy).messages.create(model=MODEL, max_tokens=10, messages=resent, extra_headers=headers)
    error = error_of(caught.value)
    assert error["type"] == "invalid_request_error" and error["message"].startswith("messages.4.content.0")
    assert len(provider.history) == sent
    traces = sorted((proxy.settings.data_dir / "context-traces" / "s-resent").glob("turn-*.json"))
    assert len(traces) == 1  # the refused turn stored nothing
    good = [*history, {"role": "assistant", "content": "It weighs 4.2 mg."}, *USER]
    sdk(proxy).messages.create(model=MODEL, max_tokens=10, messages=good, extra_headers=headers)
    assert provider.history[-1]["messages"][-1] == {"role": "user", "content": "hi"}
    assert len(provider.history) == sent + 1


def test_more_messages_than_the_cap_is_a_400_naming_the_setting(start_proxy, provider):
    """The request cap chat has (``CONTEXT_PROXY_MAX_REQUEST_MESSAGES``) holds here too, before anything of
    the messages is validated, translated, stored or sent."""
    proxy = start_proxy(trace_enabled=True, max_request_messages=3)
    turns: list[Any] = [{"role": "user", "content": "One."}, {"role": "assistant", "content": "Two."}, *USER]
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk(proxy).messages.create(model=MODEL, max_tokens=10, messages=[*turns, {"role": "assistant", "content": "!"}])
    error = error_of(caught.value)
    assert error["type"] == "invalid_request_error"
    assert "CONTEXT_PROXY_MAX_REQUEST_MESSAGES" in error["message"] and "4 messages" in error["message"]
    assert provider.history == []
    assert not (proxy.settings.data_dir / "context-traces").exists()
    sdk(proxy).messages.create(model=MODEL, max_tokens=10, messages=turns)  # at the cap: served
    assert len(provider.history) == 1
