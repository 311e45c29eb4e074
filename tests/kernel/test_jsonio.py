"""``proxy.kernel.jsonio``: answers encode to JSON equivalent to what the standard library wrote, whatever they hold."""

from __future__ import annotations

import json

import pytest

from proxy.kernel.jsonio import dumps, loads_text


def test_an_ordinary_answer_is_compact_utf8_json_meaning_what_it_held():
    answer = {"id": "c1", "choices": [{"message": {"content": "Grüße 😀", "tool_calls": None}}], "n": [1, 0.5]}
    encoded = dumps(answer)
    assert encoded.decode("utf-8") == json.dumps(answer, ensure_ascii=False, separators=(",", ":"))
    assert json.loads(encoded) == answer


@pytest.mark.parametrize(
    "answer",
    [{"content": "a\ud800b"}, {"seed": 2**70}, {1: "a non-string key"}],
    ids=["lone-surrogate-from-upstream", "integer-beyond-64-bits", "integer-key"],
)
def test_what_orjson_refuses_is_written_by_the_standard_library_as_valid_json(answer):
    encoded = dumps(answer)
    assert encoded.isascii()  # the lone surrogate as an escape, so the bytes are valid UTF-8 too
    assert json.loads(encoded) == json.loads(json.dumps(answer))


@pytest.mark.parametrize(
    "text",
    [
        '{"sample": "A", "volume": 1.5, "ids": [1, -0.0, 2e-7], "note": "caf\u00e9 \\u2713"}',
        "[1e400]",  # the standard library reads infinity
        '{"a": NaN, "b": -Infinity}',
        '{"a": "\\ud800"}',  # a lone surrogate escape
        "123456789012345678901234567890",  # beyond 64 bits: exact, not a float
        '{"n": 1.00000000000000000000001}',
        '{"a": 1, "a": 2}',
        "  [true, null]  ",
    ],
)
def test_loads_text_returns_what_the_standard_library_returns(text: str) -> None:
    assert repr(loads_text(text)) == repr(json.loads(text))


@pytest.mark.parametrize("text", ["", "nope", "{", '{"a": 1} trailing'])
def test_loads_text_refuses_what_the_standard_library_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        loads_text(text)
