"""The chain-hash memo hashes only what is new and always agrees with hashing everything."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import proxy.session.reconcile as rc
from proxy.canonical import chain_hashes

MESSAGES = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.text(max_size=20)}),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(MESSAGES, min_size=1, max_size=5))
def test_memo_agrees_with_full_hashing_for_any_sequence_of_requests(requests):
    memo = rc.ChainMemo(max_sessions=2)
    for messages in requests:  # continuations, rewrites, forks and shrinks, in any order
        assert memo.hashes("s", messages) == chain_hashes(messages)


def test_a_continuation_hashes_only_the_new_suffix(monkeypatch):
    memo = rc.ChainMemo()
    history = [{"role": "user", "content": f"m{i}"} for i in range(50)]
    memo.hashes("s", history[:40])
    hashed: list[int] = []
    real = rc.chain_hashes
    monkeypatch.setattr(
        rc, "chain_hashes", lambda messages, start="": hashed.append(len(messages)) or real(messages, start)
    )
    assert memo.hashes("s", [dict(m) for m in history]) == chain_hashes(history)  # equal, not identical, dicts
    assert hashed == [10]
    edited = [*history[:5], {"role": "user", "content": "changed"}, *history[6:]]
    assert memo.hashes("s", edited) == chain_hashes(edited)
    assert hashed == [10, 45]  # from the first difference on
    assert memo.hashes("other", history) == chain_hashes(history)  # sessions do not share entries
