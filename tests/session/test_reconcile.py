"""The chain-hash memo hashes only what is new and always agrees with hashing everything."""

from __future__ import annotations

import math
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import proxy.session.reconcile as rc
from proxy.kernel.canonical import chain_hashes

MESSAGES = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.text(max_size=20)}),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(MESSAGES, min_size=1, max_size=5))
def test_memo_agrees_with_full_hashing_for_any_sequence_of_requests(requests):
    memo = rc.ChainMemo(max_bytes=2_000)
    for messages in requests:  # continuations, rewrites, forks and shrinks, in any order
        assert memo.hashes("s", messages) == chain_hashes(messages)


def test_a_continuation_hashes_only_the_new_suffix(monkeypatch):
    memo = rc.ChainMemo()
    history = [{"role": "user", "content": f"m{i}"} for i in range(50)]
    memo.hashes("s", history[:40])
    hashed: list[str] = []
    real = rc.message_hash
    monkeypatch.setattr(rc, "message_hash", lambda message: hashed.append(message["content"]) or real(message))
    assert memo.hashes("s", [dict(m) for m in history]) == chain_hashes(history)  # equal, not identical, dicts
    assert hashed == [f"m{i}" for i in range(40, 50)]
    edited = [*history[:5], {"role": "user", "content": "changed"}, *history[6:]]
    assert memo.hashes("s", edited) == chain_hashes(edited)
    # From the first difference on the chain is hashed again, but only the changed message canonicalized.
    assert hashed[10:] == ["changed"]
    assert memo.hashes("other", history) == chain_hashes(history)
    assert len(hashed) == 11  # another session's chain reuses every message's hash


def test_sessions_that_open_alike_canonicalize_their_shared_messages_once(monkeypatch):
    """An agent's system prompt opens every session: its canonical hash is made once, by exact digest, and
    what is remembered is bounded by count (least recently used first out)."""
    memo = rc.ChainMemo(max_message_hashes=3)
    system = {"role": "system", "content": "rules " * 10_000}
    hashed: list[str] = []
    real = rc.message_hash
    monkeypatch.setattr(rc, "message_hash", lambda message: hashed.append(message["content"][:5]) or real(message))
    for session in range(5):
        messages = [system, {"role": "user", "content": f"task {session}"}]
        assert memo.hashes(f"s{session}", messages) == chain_hashes(messages)
    assert hashed == ["rules"] + [f"task {session}"[:5] for session in range(5)]
    assert len(memo._message_hashes) == 3
    reordered = {"content": system["content"], "role": "system"}  # equal, but not exactly as sent: hashed anew
    assert memo.hashes("s9", [reordered]) == chain_hashes([reordered])
    assert len(hashed) == 7


def test_memo_memory_stays_within_its_byte_bound_under_many_large_distinct_sessions():
    # 300 sessions resending 40 messages with 50 KB tool results each: kept by reference, the memo would
    # hold about 300 MB of them; it keeps digests and hashes only, within max_bytes.
    memo = rc.ChainMemo(max_bytes=256 * 1024)
    body = "y" * 50_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for session in range(300):
            messages = [{"role": "user", "content": f"task {session}"}]
            for step in range(20):
                call = {"id": f"c{step}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                messages.append({"role": "tool", "tool_call_id": f"c{step}", "content": f"{session}/{step}{body}"})
            assert memo.hashes(f"session-{session}", messages) == chain_hashes(messages)
            del messages
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert retained < memo.max_bytes, f"{retained} bytes retained, bound {memo.max_bytes}"
    assert memo.size <= memo.max_bytes
    assert 10 < len(memo._last) < 300  # the most recent sessions stay, the oldest were dropped


def test_the_memo_size_estimate_covers_what_an_entry_really_costs():
    memo = rc.ChainMemo()
    messages = [{"role": "user", "content": f"m{i}"} for i in range(5_000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        memo.hashes("s", messages)
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert retained <= memo.size < 1.5 * retained


def test_a_session_larger_than_the_whole_budget_is_hashed_but_not_kept():
    memo = rc.ChainMemo(max_bytes=1_000)
    messages = [{"role": "user", "content": f"m{i}"} for i in range(100)]
    assert memo.hashes("big", messages) == chain_hashes(messages)
    assert len(memo._last) == 0 and memo.size <= memo.max_bytes  # what is kept: a few message hashes


@pytest.mark.parametrize("length", [0, 1, 2, 3, 7, 8, 9, 500, 998, 999, 1000])
def test_the_stored_prefix_is_found_with_a_logarithmic_number_of_lookups(length: int) -> None:
    hashes = [f"h{i}" for i in range(1000)]
    stored = set(hashes[:length])
    asked: list[str] = []

    def is_stored(chain_hash: str) -> bool:
        asked.append(chain_hash)
        return chain_hash in stored

    assert rc.stored_prefix_length(hashes, is_stored) == length == rc.known_count(hashes, stored)
    assert len(asked) <= 2 * math.ceil(math.log2(len(hashes))) + 2
    if length >= 998:  # a resent history that adds a message or two: a handful of lookups
        assert len(asked) <= 4


def test_an_empty_request_has_no_stored_prefix() -> None:
    assert rc.stored_prefix_length([], lambda chain_hash: True) == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=30), st.lists(st.integers(0, 3), max_size=30))
def test_common_messages_counts_the_leading_digests_two_requests_share(old: list[int], new: list[int]) -> None:
    from proxy.session.reconcile import _DIGEST_BYTES, _common_messages

    def digests(values: list[int]) -> bytes:
        return b"".join(bytes([v]) * _DIGEST_BYTES for v in values)

    shared = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
    assert _common_messages(digests(old), digests(new)) == shared
