"""``proxy.known_messages`` and ``wire.check_chat_request``: a resent history's messages are validated
once, and a request is refused exactly as full validation refuses it, naming the same position."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.canonical import chain_hashes, exact_digest
from proxy.errors import InvalidRequest
from proxy.known_messages import KnownMessages
from proxy.session.reconcile import ChainMemo
from proxy.wire import check_chat_request, parse_chat_request

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


def _continued(history: list[dict[str, Any]], *extra: dict[str, Any]) -> list[dict[str, Any]]:
    # A client's next turn: its history decoded afresh (new objects), the answer and a user message added.
    return [dict(m) for m in history] + [*extra]


def test_a_request_that_repeats_a_validated_one_takes_its_digests_and_digests_only_the_rest() -> None:
    known = KnownMessages()
    history = _history(30)
    check_chat_request({"model": "m", "messages": history}, known)
    longer = _continued(history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"})
    digested = known.digest(longer)
    assert digested.resent == 30
    assert digested.digests == [exact_digest(m) for m in longer]
    _, digests = check_chat_request({"model": "m", "messages": longer}, known)
    assert digests == digested.digests
    # The same request again (a retry) repeats all of it.
    assert known.digest(_continued(longer)).resent == 32


@pytest.mark.parametrize(
    ("position", "changed"),
    [
        (3, {"role": "assistant", "content": "step 3", "n": 1.0}),  # was 1: equal in Python, not the same JSON
        (3, {"content": "step 3", "role": "assistant"}),  # the same fields in another order
        (0, {"role": "user", "content": "step 0 "}),
    ],
)
def test_a_prefix_that_differs_in_any_byte_is_digested_again(position: int, changed: dict[str, Any]) -> None:
    known = KnownMessages()
    history = _history(10)
    history[3] = {"role": "assistant", "content": "step 3", "n": 1} if "n" in changed else history[3]
    check_chat_request({"model": "m", "messages": history}, known)
    resent = _continued(history, {"role": "user", "content": "more"})
    resent[position] = changed
    digested = known.digest(resent)
    assert digested.resent == 0
    assert digested.digests == [exact_digest(m) for m in resent]


def test_a_refused_request_is_not_remembered_so_its_prefix_is_not_taken_as_validated() -> None:
    known = KnownMessages()
    history = _history(10)
    bad = [*history, {"role": "wizard", "content": "hi"}]
    _refusal({"model": "m", "messages": bad}, known)
    again = _continued(bad, {"role": "user", "content": "now?"})
    assert known.digest(again).resent == 0
    assert _refusal({"model": "m", "messages": again}, known) == _refusal({"model": "m", "messages": again}, None)


def test_recent_requests_are_kept_within_their_byte_bound_and_a_repeated_one_is_replaced() -> None:
    known = KnownMessages(max_request_bytes=2_500)
    sessions = [[{"role": "user", "content": f"session {s} " + "x" * 600}] for s in range(5)]
    for history in sessions:
        check_chat_request({"model": "m", "messages": history}, known)
    # Each request is about 700 bytes: the oldest went, the newest are kept.
    assert known.digest(_continued(sessions[0], {"role": "user", "content": "?"})).resent == 0
    assert known.digest(_continued(sessions[4], {"role": "user", "content": "?"})).resent == 1
    # A session's next turn replaces its previous request: the bound holds one entry per session.
    step = _continued(sessions[4], {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"})
    check_chat_request({"model": "m", "messages": step}, known)
    assert known.digest(_continued(sessions[4], {"role": "user", "content": "?"})).resent == 0
    assert known.digest(_continued(step, {"role": "user", "content": "?"})).resent == 3
    # A request larger than the whole bound is not kept at all.
    huge = [{"role": "user", "content": "y" * 3_000}]
    check_chat_request({"model": "m", "messages": huge}, known)
    assert known.digest(_continued(huge, {"role": "user", "content": "?"})).resent == 0


def test_a_request_orjson_cannot_encode_is_digested_one_by_one() -> None:
    known = KnownMessages()
    history = [{"role": "user", "content": "big", "n": 2**70}]  # the reference decode keeps it exact
    digested = known.digest(history)
    assert digested.encoded is None and digested.digests == [exact_digest(history[0])]


def test_after_a_resent_prefix_the_pairing_is_checked_as_over_the_whole_request() -> None:
    known = KnownMessages()
    call = CALL
    history = [{"role": "user", "content": "go"}, call, {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    check_chat_request({"model": "m", "messages": history}, known)
    orphan = {
        "model": "m",
        "messages": [*_continued(history), {"role": "tool", "tool_call_id": "c1", "content": "again"}],
    }
    assert known.digest(orphan["messages"]).resent == 3
    assert _refusal(orphan, known) == _refusal(orphan, None)
    assert _refusal(orphan, known)[1] == "messages.3.tool_call_id"
    unanswered = {
        "model": "m",
        "messages": [*_continued(history), {**call, "tool_calls": [{**call["tool_calls"][0], "id": "c2"}]}],
    }
    assert _refusal(unanswered, known) == _refusal(unanswered, None)
