"""``proxy/kernel/native.py``: a message's native parts are sent while its chat form is unchanged, judged by
its exact bytes first and by its canonical hash when they differ, so a cosmetic change keeps them and a
real one does not, for sidecars made now and for those stored before the exact digest existed."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import orjson

from proxy.kernel.canonical import message_hash
from proxy.kernel.native import NATIVE, native_parts, with_native

BLOCKS = [{"type": "thinking", "thinking": "Let me look.", "signature": "SIG"}, {"type": "text", "text": "x."}]


def _message() -> dict[str, Any]:
    return with_native({"role": "assistant", "content": "x."}, "messages", copy.deepcopy(BLOCKS))


def test_an_unchanged_message_keeps_its_parts_also_after_a_round_trip_through_json() -> None:
    message = _message()
    assert native_parts(message, "messages") == BLOCKS
    assert native_parts(orjson.loads(orjson.dumps(message)), "messages") == BLOCKS  # as the store gives it back
    assert native_parts(message, "responses") is None  # another API's parts are not these


def test_a_cosmetic_change_keeps_the_parts_and_a_real_one_does_not() -> None:
    cosmetic = {**_message(), "tool_calls": []}  # no tool calls, said another way: the same message
    assert native_parts(cosmetic, "messages") == BLOCKS
    changed = {**_message(), "content": "[preview of x.]"}
    assert native_parts(changed, "messages") is None


def test_a_sidecar_stored_without_the_exact_digest_is_judged_by_its_canonical_hash() -> None:
    stored = _message()
    del stored[NATIVE]["exact"]
    assert native_parts(stored, "messages") == BLOCKS
    assert native_parts({**stored, "content": "other"}, "messages") is None


def test_a_forged_exact_digest_does_not_pass_a_changed_message() -> None:
    message = _message()
    changed = {**message, "content": "other", NATIVE: {**message[NATIVE], "exact": "00"}}
    assert native_parts(changed, "messages") is None


def test_an_unchanged_message_is_judged_without_canonical_hashing(monkeypatch) -> None:
    import proxy.kernel.native as native

    message, hashed = _message(), []
    monkeypatch.setattr(native, "message_hash", lambda chat: hashed.append(chat) or message_hash(chat))
    assert native_parts(message, "messages") == BLOCKS and hashed == []


def test_a_resent_message_is_canonicalized_once_whichever_request_sends_it(monkeypatch) -> None:
    import proxy.kernel.native as native

    hashed: list[Any] = []
    monkeypatch.setattr(native, "message_hash", lambda chat: hashed.append(chat) or message_hash(chat))
    text = f"resent {uuid.uuid4()}"  # a chat form no other test made
    first = with_native({"role": "user", "content": text}, "responses", [{"type": "message"}])
    again = with_native({"role": "user", "content": text}, "responses", [{"type": "message"}])
    assert first == again and len(hashed) == 1
    cosmetic = {**again, "tool_calls": []}  # judged by its canonical hash: once, then remembered too
    assert native_parts(cosmetic, "responses") == native_parts(cosmetic, "responses") == [{"type": "message"}]
    assert len(hashed) == 2
