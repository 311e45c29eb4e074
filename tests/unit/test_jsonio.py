"""``proxy.jsonio``: answers encode to JSON equivalent to what the standard library wrote, whatever they hold."""

from __future__ import annotations

import json

import pytest

from proxy.jsonio import dumps


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
