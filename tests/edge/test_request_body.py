"""``decode_body``: the one JSON decode of a request body, safe for every legal or odd input."""

from __future__ import annotations

import json
import sys

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.edge.request_body import MAX_DEPTH, _decode_reference, _replace_surrogate_escapes, decode_body
from proxy.kernel.errors import InvalidRequest


def _nested(depth: int) -> bytes:
    """``{"a": [[...]]}`` with ``depth`` levels counting the outer object."""
    return b'{"a": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_depth_up_to_the_limit_is_accepted_and_one_more_is_refused():
    assert decode_body(_nested(MAX_DEPTH))["a"]
    with pytest.raises(InvalidRequest, match=f"deeper than {MAX_DEPTH}"):
        decode_body(_nested(MAX_DEPTH + 1))


@pytest.mark.parametrize("depth", [1_000, 100_000, 1_000_000])
def test_very_deep_input_is_refused_without_reaching_the_recursion_limit(depth):
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # the check must not recurse at all, let alone near the real limit
    try:
        with pytest.raises(InvalidRequest, match="deeper"):
            decode_body(_nested(depth))
        with pytest.raises(InvalidRequest, match="balance"):
            decode_body(b"{" * depth)
    finally:
        sys.setrecursionlimit(limit)


def test_brackets_inside_strings_and_escapes_do_not_count_as_nesting():
    text = "[[[[" * 40 + '\\"{{{' + "\\\\"
    body = {"a": text, "b": [["x\\"]], "c": '"]]]]"'}
    assert decode_body(json.dumps(body).encode()) == body


def test_lone_surrogates_become_u_fffd_in_values_and_keys_and_pairs_stay_whole():
    raw = b'{"k\\udc80": ["\\ud800", {"x": "a\\udfffb"}], "pair": "\\ud83d\\ude00"}'
    assert decode_body(raw) == {"k\ufffd": ["\ufffd", {"x": "a\ufffdb"}], "pair": "\U0001f600"}


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400"])
def test_non_finite_numbers_are_refused(literal):
    with pytest.raises(InvalidRequest):
        decode_body(b'{"temperature": ' + literal + b"}")


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=20,
    )
)
def test_any_json_object_within_the_depth_round_trips(value):
    body = {"v": value}
    raw = json.dumps(body).encode("utf-8", "surrogatepass")
    decoded = decode_body(raw)
    assert json.dumps(decoded, sort_keys=True) == json.dumps(_clean(body), sort_keys=True)


def _clean(value):
    if isinstance(value, str):
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    return value


# What orjson (the fast decoder) is handed: every odd input above must mean what the standard library says.
_ODD_TEXT = st.text(alphabet=st.sampled_from(["\\", '"', "u", "d", "8", "0", "c", "\U0001f600", "\ud800", "\udc00"]))


@given(st.lists(_ODD_TEXT, max_size=4), st.booleans())
def test_escaped_lone_surrogates_are_rewritten_before_orjson_reads_them(texts, ascii_only):
    body = {"texts": texts, **{text: 1 for text in texts}}
    raw = json.dumps(body, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    if not ascii_only and any(_has_surrogate(text) for text in texts):
        raw = json.dumps(body).encode()  # raw surrogates are not UTF-8 at all: only escapes reach a decoder
    expected = _decode_reference(raw, MAX_DEPTH)  # the standard library's reading, surrogates replaced after it
    assert orjson.loads(_replace_surrogate_escapes(raw)) == expected  # orjson itself accepts the rewrite
    assert decode_body(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"a": "\\\\ud800"}', {"a": "\\ud800"}),  # an escaped backslash, then text
        (b'{"a": "\\\\\\ud800"}', {"a": "\\\ufffd"}),  # an escaped backslash, then an escape
        (b'{"a": "\\\\ud800\\udc00"}', {"a": "\\ud800\ufffd"}),  # ... then text, then a lone low half
        (b'{"a": "\\udc00\\udc00"}', {"a": "\ufffd\ufffd"}),  # two lone low halves
        (b'{"a": "\\ud800\\ud83d\\ude00"}', {"a": "\ufffd\U0001f600"}),  # a lone high half, then a pair
    ],
)
def test_backslashes_before_a_surrogate_escape_decide_whether_it_is_one(raw, expected):
    assert orjson.loads(_replace_surrogate_escapes(raw)) == expected  # the rewrite alone, read by orjson
    assert decode_body(raw) == expected == _decode_reference(raw, MAX_DEPTH)


@pytest.mark.parametrize("number", [2**64, 2**70, -(2**63) - 1, 10**30, -(10**30)])
def test_integers_beyond_64_bits_stay_exact_integers(number):
    # orjson would read them as floats; the body goes to the standard library, which keeps them exact.
    body = decode_body(b'{"seed": %d, "n": [%d]}' % (number, number))
    assert body == {"seed": number, "n": [number]}
    assert isinstance(body["seed"], int)


def test_the_largest_64_bit_integers_and_ordinary_floats_decode_unchanged():
    raw = b'{"a": 18446744073709551615, "b": -9223372036854775808, "c": 0.1, "d": 1e300, "e": -0}'
    assert decode_body(raw) == json.loads(raw)


def _has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)
