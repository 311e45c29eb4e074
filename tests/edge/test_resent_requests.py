"""``proxy.edge.resent_requests``: a chat body that resends a recent request's messages is decoded without
decoding them again, to exactly what ``decode_body`` makes of it, and anything else is decoded whole."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.edge.known_messages import KnownMessages
from proxy.edge.request_body import decode_body
from proxy.edge.resent_requests import ORJSON_TRAILING_CONTENT, DecodedBody, ResentRequests
from proxy.ingress.chat.wire import check_chat_request
from proxy.kernel.canonical import exact_digest
from proxy.kernel.errors import InvalidRequest

CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
}
FORMATS: dict[str, dict[str, Any]] = {
    "json.dumps": {},
    "compact": {"separators": (",", ":")},
    "utf-8": {"ensure_ascii": False},
    "indented": {"indent": 2},
}


def _history(n: int) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"step {i} ü 你好"} for i in range(n)]


def _raw(messages: list[Any], fmt: str = "json.dumps", **other: Any) -> bytes:
    body = {"model": "m", "messages": messages, "tools": [{"type": "function", "function": {"name": "f"}}], **other}
    return json.dumps(body, **FORMATS[fmt]).encode()


def _turn(memo: ResentRequests, known: KnownMessages, raw: bytes, answered: bool = True) -> DecodedBody:
    """What the chat edge does with a body (``ingress/chat/adapter._parse``): decode, validate, remember;
    then, once the answer is sent (``answered``), what follows it (``make_spares``)."""
    decoded = memo.decode(raw)
    _, digests = check_chat_request(decoded.body, known, decoded.resent, decoded.resent_digests)
    assert digests is not None
    assert digests == [exact_digest(m) for m in decoded.body["messages"]]
    memo.remember(decoded, digests)
    if answered:
        memo.make_spares()
    return decoded


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_resent_history_is_taken_from_the_request_it_repeats_and_decodes_as_the_whole_body(fmt: str) -> None:
    memo, known = ResentRequests(), KnownMessages()
    history = _history(30)
    assert _turn(memo, known, _raw(history, fmt)).resent == 0
    longer = [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
    raw = _raw(longer, fmt)
    decoded = _turn(memo, known, raw)
    assert decoded.resent == 30
    assert decoded.body == decode_body(raw)
    assert orjson.dumps(decoded.body) == orjson.dumps(decode_body(raw))  # types and key order too
    # The same request again (a retry) repeats all of it, and the next turn repeats this one.
    assert _turn(memo, known, raw).resent == 32
    assert _turn(memo, known, _raw([*longer, {"role": "assistant", "content": "done"}], fmt)).resent == 32


@pytest.mark.parametrize(
    ("position", "changed"),
    [
        (3, {"role": "assistant", "content": "step 3 ü 你好", "n": 1.0}),  # was 1: equal in Python, not in JSON
        (3, {"content": "step 3 ü 你好", "role": "assistant"}),  # the same fields in another order
        (0, {"role": "user", "content": "step 0 ü 你好 "}),
        (9, {"role": "assistant", "content": "step 9 ü 你好", "name": "x"}),  # the last message grew
    ],
)
def test_a_prefix_that_differs_in_any_byte_is_decoded_whole(position: int, changed: dict[str, Any]) -> None:
    memo, known = ResentRequests(), KnownMessages()
    history = _history(10)
    history[3] = {"role": "assistant", "content": "step 3 ü 你好", "n": 1}
    _turn(memo, known, _raw(history))
    resent = [*history, {"role": "user", "content": "more"}]
    resent[position] = changed
    raw = _raw(resent)
    decoded = _turn(memo, known, raw)
    assert decoded.resent == 0
    assert orjson.dumps(decoded.body) == orjson.dumps(decode_body(raw))


def test_what_comes_before_the_messages_must_be_the_same_bytes() -> None:
    memo, known = ResentRequests(), KnownMessages()
    history = _history(10)
    _turn(memo, known, json.dumps({"model": "m", "messages": history}).encode())
    raw = json.dumps({"model": "other", "messages": [*history, {"role": "user", "content": "?"}]}).encode()
    decoded = _turn(memo, known, raw)
    assert decoded.resent == 0 and decoded.body["model"] == "other"


@pytest.mark.parametrize(
    "tail",
    [
        b', "messages": [{"role": "user", "content": "shadow"}]}',  # a later duplicate key wins in every decoder
        b', "messages": "not a list"}',
        b', "messag\\u0065s": [{"role": "user", "content": "escaped"}]}',  # the same key, spelled with an escape
    ],
)
def test_a_body_whose_messages_are_shadowed_by_a_duplicate_key_decodes_as_the_whole_body(tail: bytes) -> None:
    memo, known = ResentRequests(), KnownMessages()
    history = _history(10)
    _turn(memo, known, _raw(history))
    raw = _raw([*history, {"role": "user", "content": "?"}])
    raw = raw[: raw.rindex(b"}")] + tail
    decoded = memo.decode(raw)
    assert decoded.resent == 0
    assert orjson.dumps(decoded.body) == orjson.dumps(decode_body(raw))


def test_a_messages_key_inside_an_earlier_member_is_not_taken_for_the_body_s_own() -> None:
    memo, known = ResentRequests(), KnownMessages()
    history = _history(10)
    earlier = {"metadata": {"messages": ["x"], "note": '"messages": ['}}

    def raw_of(messages: list[Any]) -> bytes:
        return json.dumps({**earlier, "model": "m", "messages": messages}).encode()

    _turn(memo, known, raw_of(history))
    raw = raw_of([*history, {"role": "user", "content": "?"}])
    decoded = _turn(memo, known, raw)
    assert decoded.resent == 10 and decoded.body == decode_body(raw)


def test_new_messages_orjson_refuses_are_decoded_with_the_whole_body() -> None:
    memo, known = ResentRequests(), KnownMessages()
    history = _history(10)
    _turn(memo, known, _raw(history))
    raw = _raw([*history, {"role": "user", "content": "PLACEHOLDER"}]).replace(b"PLACEHOLDER", rb"bad \ud800 name")
    decoded = _turn(memo, known, raw)
    assert decoded.resent == 0
    assert decoded.body["messages"][-1]["content"] == "bad \ufffd name"
    assert orjson.dumps(decoded.body) == orjson.dumps(decode_body(raw))
    big = _raw([*decoded.body["messages"], {"role": "user", "content": "PLACEHOLDER"}]).replace(
        b'"PLACEHOLDER"', b'"x", "n": 123456789012345678901234567890'
    )  # beyond 64 bits: the reference decode keeps it exact
    assert memo.decode(big).body["messages"][-1]["n"] == 123456789012345678901234567890


def test_orjson_still_says_where_a_value_ends_as_the_memo_reads_it() -> None:
    with pytest.raises(orjson.JSONDecodeError) as raised:
        orjson.loads(b'[1, "\xc3\xbc"] , "x"')
    # the position of what follows, in characters (the comma is byte 10: "ü" is two bytes)
    assert raised.value.msg.startswith(ORJSON_TRAILING_CONTENT) and raised.value.pos == 9


@pytest.mark.parametrize(
    "after",
    [
        rb'"tools": [{"type": "function", "function": {"name": "bad \udc00 name"}}]',  # orjson refuses it
        b'"user": "caf\xc3"',  # bad UTF-8 after the messages: orjson reports it at the start
        b'"stop": ["]", "],"]',
    ],
)
def test_what_follows_the_new_messages_is_decoded_as_the_whole_body_decodes_it(after: bytes) -> None:
    memo, known = ResentRequests(), KnownMessages()
    history = _history(10)
    head = json.dumps({"model": "m", "messages": history})
    _turn(memo, known, (head[:-1] + ', "n": 1}').encode())
    raw = json.dumps({"model": "m", "messages": [*history, {"role": "user", "content": "?"}]}).encode()
    raw = raw[:-1] + b", " + after + b"}"
    try:
        whole = decode_body(raw)
    except InvalidRequest as refused:
        with pytest.raises(InvalidRequest) as here:
            memo.decode(raw)
        assert here.value.message == refused.message
        return
    decoded = memo.decode(raw)
    assert decoded.resent == 10  # the new message and what follows it decoded on their own
    assert json.dumps(decoded.body) == json.dumps(whole)


@pytest.mark.parametrize(
    "tail",
    [
        b', {"role": "user", "content": "unterminated}], "model": "m"}',
        b', ], "model": "m"}',  # a trailing comma in the array
        b', {"role": "user", "content": "x"}]',  # the body never closes
        b', {"role": "user", "content": "x", "n": NaN}]}',
    ],
)
def test_a_malformed_continuation_is_refused_as_the_whole_body_is(tail: bytes) -> None:
    memo, known = ResentRequests(), KnownMessages()
    history = _history(10)
    head = json.dumps({"model": "m", "messages": history})
    _turn(memo, known, head.encode())
    raw = head[: head.rindex("]")].encode() + tail
    with pytest.raises(InvalidRequest) as whole:
        decode_body(raw)
    with pytest.raises(InvalidRequest) as here:
        memo.decode(raw)
    assert here.value.message == whole.value.message


def test_what_a_turn_does_to_its_messages_does_not_reach_the_next_turn() -> None:
    memo, known = ResentRequests(), KnownMessages()
    history = [*_history(9), CALL, {"role": "tool", "tool_call_id": "c1", "content": "result"}]
    _turn(memo, known, _raw(history))
    raw = _raw([*history, {"role": "user", "content": "next"}])
    first = _turn(memo, known, raw)
    assert first.resent == 11
    for message in first.body["messages"]:  # what litellm does to a call it is given, and worse
        message["content"] = "changed"
        for call in message.get("tool_calls", []):
            call["function"]["arguments"] = "changed"
    again = memo.decode(raw)
    assert again.resent == 12 and again.body == decode_body(raw)  # a retry: all of it resent
    assert orjson.dumps(again.body) == orjson.dumps(decode_body(raw))  # keys in their order too
    # A call that came as a new message is copied whole on its next resend too.
    longer = [
        *history,
        {"role": "user", "content": "next"},
        CALL,
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]
    _turn(memo, known, _raw(longer))
    resent = memo.decode(_raw(longer, user="u"))
    assert resent.resent == 14
    resent.body["messages"][12]["tool_calls"][0]["function"]["name"] = "changed"
    assert memo.decode(_raw(longer)).body["messages"][12] == CALL


def test_a_copy_made_between_turns_is_taken_once_by_the_next_turn_and_never_shared() -> None:
    memo, known = ResentRequests(), KnownMessages()
    history = [*_history(9), CALL, {"role": "tool", "tool_call_id": "c1", "content": "result"}]
    _turn(memo, known, _raw(history), answered=False)
    assert memo.wants_spares and memo.ready_spares == 0 and len(memo) == 0  # placed once its answer is sent
    assert memo.decode(_raw([*history, {"role": "user", "content": "too soon"}])).resent == 0  # decoded whole
    memo.make_spares()
    assert not memo.wants_spares and memo.ready_spares == 1 and len(memo) == 1
    raw = _raw([*history, {"role": "user", "content": "next"}])
    first = memo.decode(raw)
    assert first.resent == 11 and memo.ready_spares == 0  # taken: the next decode copies again
    assert orjson.dumps(first.body) == orjson.dumps(decode_body(raw))  # keys in their order too
    for message in first.body["messages"]:
        message["content"] = "changed"
        for call in message.get("tool_calls", []):
            call["function"]["arguments"] = "changed"
    again = memo.decode(raw)
    assert orjson.dumps(again.body) == orjson.dumps(decode_body(raw))
    assert not any(a is b for a, b in zip(first.body["messages"], again.body["messages"], strict=True))
    memo.make_spares()  # nothing remembered since: nothing to copy
    assert memo.ready_spares == 0


def test_a_full_memo_still_makes_spares_and_a_spare_goes_with_its_request() -> None:
    known = KnownMessages()
    sessions = [[{"role": "user", "content": f"session {s} " + "x" * 600}, *_history(9)] for s in range(3)]
    size = len(_raw(sessions[0]))
    full = ResentRequests(max_bytes=3 * size)  # exactly one request: no room left over
    _turn(full, known, _raw(sessions[0]))
    full.make_spares()
    assert len(full) == 1 and full.ready_spares == 1  # outside the bound: it pushes nothing out
    memo = ResentRequests(max_bytes=2 * 3 * size + size // 2)  # two requests, a little room left over
    for history in sessions[:2]:
        _turn(memo, known, _raw(history), answered=False)
    memo.make_spares()
    assert len(memo) == 2 and memo.ready_spares == 2
    _turn(memo, known, _raw(sessions[2]), answered=False)
    assert len(memo) == 2 and memo.ready_spares == 2  # placed once its answer is sent
    memo.make_spares()  # the first session's request goes, and its spare with it
    assert len(memo) == 2 and memo.ready_spares == 2
    assert memo.decode(_raw([*sessions[0], {"role": "user", "content": "?"}])).resent == 0


def test_a_refused_request_is_not_remembered() -> None:
    memo, known = ResentRequests(), KnownMessages()
    bad = [*_history(10), {"role": "wizard", "content": "hi"}]
    with pytest.raises(InvalidRequest):
        _turn(memo, known, _raw(bad))
    assert len(memo) == 0
    assert memo.decode(_raw([*bad, {"role": "user", "content": "now?"}])).resent == 0


def test_after_a_resent_prefix_the_pairing_is_checked_as_over_the_whole_request() -> None:
    memo, known = ResentRequests(), KnownMessages()
    history = [*_history(9), CALL, {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    _turn(memo, known, _raw(history))
    orphan = _raw([*history, {"role": "tool", "tool_call_id": "c1", "content": "again"}])
    decoded = memo.decode(orphan)
    assert decoded.resent == 11
    with pytest.raises(InvalidRequest) as raised:
        check_chat_request(decoded.body, known, decoded.resent, decoded.resent_digests)
    assert raised.value.param == "messages.11.tool_call_id"


def test_requests_are_kept_within_their_byte_bound_and_short_ones_are_not_kept() -> None:
    sessions = [[{"role": "user", "content": f"session {s} " + "x" * 600}, *_history(9)] for s in range(5)]
    size = len(_raw(sessions[0]))
    memo, known = ResentRequests(max_bytes=2 * 3 * size + size), KnownMessages()  # room for two
    for history in sessions:
        _turn(memo, known, _raw(history))
    assert len(memo) == 2
    assert memo.decode(_raw([*sessions[0], {"role": "user", "content": "?"}])).resent == 0
    assert memo.decode(_raw([*sessions[4], {"role": "user", "content": "?"}])).resent == 10
    # A session's next turn replaces its previous request.
    _turn(memo, known, _raw([*sessions[4], {"role": "user", "content": "?"}]))
    assert len(memo) == 2
    _turn(memo, known, _raw(_history(3)))  # decoded in microseconds anyway
    assert len(memo) == 2
    huge = [{"role": "user", "content": "y" * (4 * size)}, *_history(9)]
    _turn(memo, known, _raw(huge))
    assert memo.decode(_raw([*huge, {"role": "user", "content": "?"}])).resent == 0


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]), "content": _TEXT},
    optional={"name": _TEXT, "n": st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)},
)


@settings(max_examples=60, deadline=None)
@given(
    first=st.lists(_MESSAGE, min_size=8, max_size=14),
    extra=st.lists(_MESSAGE, max_size=3),
    fmt=st.sampled_from(list(FORMATS)),
    after=st.dictionaries(st.sampled_from(["temperature", "user", "stop"]), _TEXT, max_size=2),
)
def test_any_continuation_decodes_as_the_whole_body(
    first: list[dict[str, Any]], extra: list[dict[str, Any]], fmt: str, after: dict[str, Any]
) -> None:
    memo = ResentRequests()
    raw = _raw(first, fmt, **after)
    decoded = memo.decode(raw)
    memo.remember(decoded, [exact_digest(m) for m in decoded.body["messages"]])
    memo.make_spares()  # its answer sent
    raw = _raw([*first, *extra], fmt, **after)
    again = memo.decode(raw)
    assert json.dumps(again.body) == json.dumps(decode_body(raw))  # types and key order too
    assert again.resent == len(first)  # the same client's next turn is always recognized
    assert list(again.resent_digests) == [exact_digest(m) for m in again.body["messages"][: len(first)]]


def test_a_long_body_with_a_message_that_is_not_an_object_decodes_for_the_checks_to_refuse() -> None:
    # Long enough to be laid out for remembering: the copy of its messages met a string and raised.
    messages = [{"role": "user", "content": f"m{i}"} for i in range(8)] + ["not an object", 7]
    chat = ResentRequests().decode(json.dumps({"model": "m", "messages": messages}).encode())
    assert chat.body["messages"] == messages and chat.resent == 0


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_body_whose_messages_are_outweighed_by_the_rest_of_it_is_not_remembered(where: str) -> None:
    # A continuation decodes the body around its new messages again: with a system prompt and tools larger
    # than the history, it would pay more than it saves. The history that outgrows them is remembered.
    memo, known = ResentRequests(), KnownMessages()
    prompt = "You are an agent. " * 200

    def raw(messages: list[Any]) -> bytes:
        if where == "before":  # the Messages API's system prompt, before the messages
            return json.dumps({"model": "m", "system": prompt, "messages": messages}).encode()
        return json.dumps({"model": "m", "messages": messages, "system": prompt}).encode()

    short = _history(10)
    _turn(memo, known, raw(short))
    assert len(memo) == 0 and memo.decode(raw([*short, {"role": "user", "content": "?"}])).resent == 0
    long = [{"role": "user", "content": "step " * 200 + str(n)} for n in range(10)]
    _turn(memo, known, raw(long))
    assert len(memo) == 1
    assert memo.decode(raw([*long, {"role": "user", "content": "?"}])).resent == 10


def test_requests_waiting_for_an_answer_to_be_placed_are_kept_within_the_bounds_too() -> None:
    # A request is placed once its answer is sent; if answers fail for long, what waits stays bounded.
    sessions = [[{"role": "user", "content": f"session {s} " + "x" * 600}, *_history(9)] for s in range(6)]
    size = len(_raw(sessions[0]))
    memo, known = ResentRequests(max_bytes=3 * size, max_requests=4), KnownMessages()
    for history in sessions:
        _turn(memo, known, _raw(history), answered=False)
    assert len(memo._unplaced) == 3 and memo._unplaced_bytes == 3 * size  # the oldest waiting ones went
    memo.make_spares()
    assert len(memo) == 1  # the room for one request, and the newest waiting one took it
    assert memo.decode(_raw([*sessions[5], {"role": "user", "content": "?"}])).resent == 10
    assert memo.decode(_raw([*sessions[2], {"role": "user", "content": "?"}])).resent == 0
    waiting = ResentRequests(max_requests=2)
    for history in sessions:
        _turn(waiting, known, _raw(history), answered=False)
    assert len(waiting._unplaced) == 2
    waiting.make_spares()
    assert len(waiting) == 2 and waiting.decode(_raw([*sessions[3], {"role": "user", "content": "?"}])).resent == 0
