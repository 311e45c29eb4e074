"""``proxy/ingress/messages/translations.py`` through ``translate_request``, the function the Messages ingress
runs: a resent history is validated and translated once, and what the memo hands out is exactly what a
translation from scratch gives, for every kind of route; a request is refused exactly as full validation
refuses it, naming the same position, and a refused request leaves nothing remembered."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from proxy.ingress.chat.wire import parse_chat_request
from proxy.ingress.messages.request import Translation, to_chat, translate_request
from proxy.ingress.messages.translations import MessageTranslations
from proxy.ingress.messages.wire import parse_messages_request
from proxy.kernel.canonical import exact_digest
from proxy.kernel.config import ModelRoute
from proxy.kernel.errors import InvalidRequest
from tests.ingress.test_messages_native import request

ANTHROPIC = ModelRoute("claude", {"model": "anthropic/claude-sonnet-4-5", "api_key": "k"}, max_output_tokens=16_000)
NATIVE = ModelRoute(**{**ANTHROPIC.__dict__, "configured_api": "messages"})
OPENAI = ModelRoute("claude", {"model": "openai/local", "api_base": "http://127.0.0.1:1"})
ROUTES = {"anthropic in chat": ANTHROPIC, "anthropic natively": NATIVE, "openai-compatible": OPENAI}


def _translated(body: dict[str, Any], route: ModelRoute, memo: MessageTranslations) -> Translation:
    return translate_request(body, lambda model: route, {}, memo)[2]


def _from_scratch(body: dict[str, Any], route: ModelRoute) -> Translation:
    translation = to_chat(parse_messages_request(body), body, route, {}, native=route.api == "messages")
    parse_chat_request(translation.body)
    return translation


def _refusal(body: dict[str, Any], memo: MessageTranslations | None) -> tuple[str, str | None]:
    with pytest.raises(InvalidRequest) as raised:
        if memo is None:
            _from_scratch(body, ANTHROPIC)
        else:
            _translated(body, ANTHROPIC, memo)
    return raised.value.message, raised.value.param


def _next_turn(body: dict[str, Any], text: str) -> dict[str, Any]:
    """The agent's next call: the history resent, the model's answer and a new user message after it."""
    answer = {"role": "assistant", "content": [{"type": "text", "text": f"answer before {text}"}]}
    return {**body, "messages": [*copy.deepcopy(body["messages"]), answer, {"role": "user", "content": text}]}


@pytest.mark.parametrize("route", ROUTES.values(), ids=ROUTES.keys())
def test_a_resent_history_is_translated_once_into_what_a_translation_from_scratch_gives(route: ModelRoute) -> None:
    memo = MessageTranslations()
    first = request()
    assert _translated(first, route, memo).fresh == list(range(len(_from_scratch(first, route).body["messages"])))
    later = _next_turn(first, "and then?")
    translation = _translated(later, route, memo)
    scratch = _from_scratch(later, route)
    assert translation.body == scratch.body
    assert translation.notes == scratch.notes and translation.provider_fields == scratch.provider_fields
    assert translation.digests == [exact_digest(message) for message in scratch.body["messages"]]
    assert translation.fresh == [len(scratch.body["messages"]) - 2, len(scratch.body["messages"]) - 1]


def test_what_a_turn_does_to_its_messages_reaches_neither_the_memo_nor_the_clients_body() -> None:
    memo = MessageTranslations()
    body = request()
    sent = copy.deepcopy(body)
    first = _translated(body, NATIVE, memo)
    again = _translated(copy.deepcopy(body), NATIVE, memo)
    for translation in (first, again):
        for message in translation.body["messages"]:
            message["content"] = "changed by the turn"
            for part in message.get("native", {}).get("parts", []):
                if isinstance(part, dict):
                    part["text"] = "changed by rendering"
    assert body == sent
    assert _translated(copy.deepcopy(body), NATIVE, memo).body == _from_scratch(body, NATIVE).body


def test_a_message_remembered_for_one_kind_of_route_is_translated_anew_for_another() -> None:
    memo = MessageTranslations()
    body = request()
    _translated(body, OPENAI, memo)
    translation = _translated(copy.deepcopy(body), ANTHROPIC, memo)  # thinking blocks and marks kept here
    assert translation.body == _from_scratch(body, ANTHROPIC).body
    assert translation.fresh == list(range(len(translation.body["messages"])))
    assert _translated(copy.deepcopy(body), ANTHROPIC, memo).fresh == []


@pytest.mark.parametrize(
    ("bad", "param"),
    [
        ({"role": "wizard", "content": "hi"}, "messages.3.role"),
        ({"role": "user", "content": 7}, "messages.3.content.str"),
        ({"role": "user", "content": [{"type": "bogus"}]}, "messages.3.content.0.type"),
        ({"role": "assistant", "content": [{"type": "tool_use", "id": "", "name": "f", "input": {}}]}, None),
    ],
)
def test_a_bad_message_after_a_known_history_is_refused_as_full_validation_refuses_it(
    bad: dict[str, Any], param: str | None
) -> None:
    memo = MessageTranslations()
    body = request()
    _translated(body, ANTHROPIC, memo)
    remembered = len(memo)
    refused = {**body, "messages": [*body["messages"], bad, {"role": "user", "content": "and a good one after it"}]}
    assert _refusal(refused, memo) == _refusal(refused, None)
    if param is not None:
        assert _refusal(refused, memo)[1] == param
    assert len(memo) == remembered  # nothing of a refused request is remembered
    assert _refusal(refused, memo) == _refusal(refused, None)  # and it is refused again


def test_the_chat_paths_cross_message_rules_still_see_every_message() -> None:
    memo = MessageTranslations()
    body = request()
    _translated(body, ANTHROPIC, memo)
    call, result = body["messages"][1], body["messages"][2]
    orphan = {**body, "messages": [body["messages"][0], result]}  # every message remembered, the call missing
    assert _refusal(orphan, memo) == _refusal(orphan, None)
    unanswered = {**body, "messages": [body["messages"][0], call]}
    assert _refusal(unanswered, memo) == _refusal(unanswered, None)


def test_a_request_that_fails_the_chat_rules_remembers_nothing_it_translated() -> None:
    memo = MessageTranslations()
    body = request()
    orphan = {**body, "messages": [body["messages"][0], body["messages"][2]]}
    _refusal(orphan, memo)
    assert len(memo) == 0
    assert _translated(body, ANTHROPIC, memo).fresh == list(range(len(_from_scratch(body, ANTHROPIC).body["messages"])))


def test_the_least_recently_used_translations_go_first_when_the_bound_is_reached() -> None:
    def alone(text: str) -> dict[str, Any]:
        return {"model": "claude", "max_tokens": 10, "messages": [{"role": "user", "content": text * 100}]}

    each = 3 * len(orjson.dumps({"role": "user", "content": "a" * 100}))  # a message is counted three times
    memo = MessageTranslations(max_bytes=3 * each)
    for text in "abc":
        _translated(alone(text), OPENAI, memo)
    assert len(memo) == 3
    _translated(alone("a"), OPENAI, memo)  # used again: kept
    _translated(alone("d"), OPENAI, memo)
    assert len(memo) == 3
    assert _translated(alone("a"), OPENAI, memo).fresh == []
    assert _translated(alone("b"), OPENAI, memo).fresh == [0]  # the oldest, forgotten
