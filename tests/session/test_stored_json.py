"""How the store writes JSON (``proxy/session/reconcile.json_text``): orjson's text where it is the standard
library's value, the standard library's where orjson would write something else, and a refusal for what JSON
cannot hold (a failed write leaves a session as it was: ``tests/session/test_store.py``)."""

from __future__ import annotations

import json

import pytest

from proxy.session.reconcile import json_text


@pytest.mark.parametrize(
    "value",
    [
        {"role": "tool", "tool_call_id": "c1", "content": "log é ✓ " * 50},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"arguments": "{}"}}]},
        {"role": "user", "content": "lone \ud800 surrogate"},
        {"samples": [1.0, 1e16, 0.1 + 0.2, 2**70]},
    ],
)
def test_stored_json_reads_back_as_the_value_it_was(value: dict) -> None:
    """``json_text`` writes with orjson where it can and with the standard library where orjson would differ
    (a ``null``, which may have been a NaN; a lone surrogate; a >64-bit integer): the text reads back equal."""
    assert json.loads(json_text(value)) == value


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {1, 2}, object()])
def test_what_json_cannot_hold_is_refused_for_storage(bad: object) -> None:
    with pytest.raises(ValueError):
        json_text({"role": "user", "content": bad})
