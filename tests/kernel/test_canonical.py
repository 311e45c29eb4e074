"""Canonical hashes and message digests: equal digests only for messages with equal canonical forms."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.kernel.canonical import exact_digest, message_digest, message_hash

variants = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"])},
    optional={
        "content": st.one_of(
            st.none(),
            st.sampled_from(["", "x", "y", "\ud800"]),
            st.just([{"type": "text", "text": "x"}]),
            st.just([{"type": "text", "text": "y"}]),
        ),
        "tool_call_id": st.sampled_from(["a", "b"]),
        "name": st.sampled_from(["n", None, "a"]),
        "refusal": st.none(),
        "function_call": st.sampled_from([None, {"name": "f", "arguments": "{}"}]),
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {"id": st.sampled_from(["c1", "c2"]), "type": st.just("function")},
                optional={
                    "function": st.fixed_dictionaries(
                        {"name": st.just("f"), "arguments": st.sampled_from(["{}", '{"a":1}', {"a": 1}])}
                    )
                },
            ),
            max_size=2,
        ),
    },
)


@settings(max_examples=300, deadline=None)
@given(variants, variants)
def test_equal_digests_only_for_equal_canonical_messages(a: dict, b: dict) -> None:  # type: ignore[type-arg]
    if message_digest(a) == message_digest(b):
        assert message_hash(a) == message_hash(b)


def test_fields_cannot_run_into_each_other() -> None:
    # Without length prefixes "ab" + "c" and "a" + "bc" would feed the same bytes.
    assert message_digest({"role": "ab", "content": "c"}) != message_digest({"role": "a", "content": "bc"})
    assert message_digest({"role": "user", "content": "x"}) != message_digest({"role": "user", "name": "x"})
    assert message_digest({"role": "user", "content": "1"}) != message_digest({"role": "user", "content": 1})


def test_a_digest_has_the_same_small_size_whatever_the_message() -> None:
    small = message_digest({"role": "user", "content": "hi"})
    large = message_digest({"role": "tool", "tool_call_id": "c", "content": "x" * 4_000_000})
    odd = message_digest({"role": "user", "content": [{"type": "text", "text": "x" * 100_000}]})
    malformed = message_digest({"role": "assistant", "tool_calls": [{"id": "c1"}]})  # no function: canonical path
    assert {len(small), len(large), len(odd), len(malformed)} == {17}
    assert message_digest({"role": "user", "content": "hi", "refusal": None}) == small


def test_exact_digests_tell_apart_every_value_orjson_can_and_cannot_encode() -> None:
    values: list[Any] = [
        {"role": "user", "content": "a"},
        {"content": "a", "role": "user"},  # the same fields in another order: another message as sent
        {"role": "user", "content": "a", "refusal": None},
        {"role": "user", "content": "\ud800"},  # orjson refuses a lone surrogate
        {"role": "user", "content": "\ufffd"},
        10**30,  # beyond 64 bits
        float(10**30),
        {1: "a"},  # a non-string key
        {"1": "a"},
        "not a message",
        None,
    ]
    digests = [exact_digest(value) for value in values]
    assert len(set(digests)) == len(values) and {len(d) for d in digests} == {17}
    assert [exact_digest(copy.deepcopy(value)) for value in values] == digests


def test_a_cache_mark_is_not_part_of_a_messages_identity() -> None:
    """Clients move their cache mark to the newest message every turn: the message it left stays the same one."""
    from proxy.kernel.canonical import chain_hashes, message_hash

    marked = {"role": "user", "content": [{"type": "text", "text": "go", "cache_control": {"type": "ephemeral"}}]}
    plain = {"role": "user", "content": [{"type": "text", "text": "go"}]}
    assert message_hash(marked) == message_hash(plain)
    assert chain_hashes([plain, marked]) == chain_hashes([marked, plain])
    assert message_hash(plain) != message_hash({"role": "user", "content": [{"type": "text", "text": "stop"}]})


def test_one_plain_text_part_is_the_text_it_holds() -> None:
    """A client turns a message into one text part to mark it: it is still the same message."""
    from proxy.kernel.canonical import message_hash

    assert message_hash({"role": "user", "content": [{"type": "text", "text": "go"}]}) == message_hash(
        {"role": "user", "content": "go"}
    )
    two = {"role": "user", "content": [{"type": "text", "text": "g"}, {"type": "text", "text": "o"}]}
    assert message_hash(two) != message_hash({"role": "user", "content": "go"})  # parts stay parts
