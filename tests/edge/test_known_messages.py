"""``proxy.edge.known_messages`` and ``wire.check_chat_request``: a resent history's messages are validated
once, and a request is refused exactly as full validation refuses it, naming the same position."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.edge.known_messages import KnownMessages
from proxy.ingress.chat.wire import check_chat_request, parse_chat_request
from proxy.kernel.canonical import chain_hashes, exact_digest
from proxy.kernel.errors import InvalidRequest
from proxy.session.reconcile import ChainMemo

CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
}


def _history(n: int) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"step {i}"} for i in range(n)]


def _refusal(body: dict[str, Any], known: KnownMessages | None) -> tuple[str, str | None]:
    with pytest.raises(InvalidRequest) as raised:
        if known is None:
            parse_chat_request(body)
        else:
            check_chat_request(body, known)
    return raised.value.message, raised.value.param


def test_a_resent_history_is_validated_once_and_only_its_new_messages_after() -> None:
    known = KnownMessages()
    history = _history(40)
    _, digests = check_chat_request({"model": "m", "messages": history}, known)
    assert digests == [exact_digest(m) for m in history] and len(known) == 40
    longer = [*history, {"role": "user", "content": "and now?"}]
    assert known.unknown([exact_digest(m) for m in longer]) == [40]
    check_chat_request({"model": "m", "messages": longer}, known)
    assert len(known) == 41


@pytest.mark.parametrize(
    "bad",
    [
        {"role": "user", "content": 7},
        {"role": "wizard", "content": "hi"},
        {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]},
        "not a message",
    ],
)
def test_a_new_bad_message_after_a_known_prefix_is_refused_as_full_validation_refuses_it(bad: Any) -> None:
    known = KnownMessages()
    history = _history(30)
    check_chat_request({"model": "m", "messages": history}, known)
    body = {"model": "m", "messages": [*history[:20], bad, *history[20:]]}
    assert _refusal(body, known) == _refusal(body, None)
    assert _refusal(body, known)[1].startswith("messages.20")  # type: ignore[union-attr]
    assert len(known) == 30  # nothing of a refused request is remembered
    assert _refusal(body, known) == _refusal(body, None)  # and it is refused again


def test_cross_message_rules_still_see_every_message() -> None:
    known = KnownMessages()
    call = CALL
    result = {"role": "tool", "tool_call_id": "c1", "content": "ok"}
    check_chat_request({"model": "m", "messages": [{"role": "user", "content": "go"}, call, result]}, known)
    orphan = {"model": "m", "messages": [{"role": "user", "content": "go"}, result]}  # every message known
    assert _refusal(orphan, known) == _refusal(orphan, None)


def test_the_oldest_digests_are_forgotten_first() -> None:
    known = KnownMessages(max_entries=10)
    first, second = _history(10), [{"role": "user", "content": f"other {i}"} for i in range(5)]
    known.remember([exact_digest(m) for m in first])
    known.remember([exact_digest(m) for m in first[:3]])  # used again: kept
    known.remember([exact_digest(m) for m in second])
    assert len(known) == 10
    assert known.unknown([exact_digest(m) for m in first]) == [3, 4, 5, 6, 7]


def test_the_chain_memo_takes_the_edges_digests_and_names_prefixes_the_same() -> None:
    history = _history(25)
    _, digests = check_chat_request({"model": "m", "messages": history}, KnownMessages())
    assert ChainMemo().hashes("ctx", history, digests) == chain_hashes(history)
    with pytest.raises(ValueError):
        ChainMemo().hashes("ctx", history, digests[:-1])
