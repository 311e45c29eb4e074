"""The proxy's JSON codec for what crosses its edge (request bodies in, answers and stream events out)
and for the JSON texts inside messages (tool-call arguments and results, read on every turn).

One home for the choice of encoder, so swapping it (or finding what uses it) is one file. orjson is
several times faster than the standard library on the bodies an agent sends (a 1,000-message history
is megabytes, parsed and re-encoded on every turn), but it is stricter in ways the edge must hide:

- it refuses lone UTF-16 surrogates both ways: ``request_body`` rewrites their escapes to ``\\ufffd``
  in the raw bytes and hands orjson those (only when orjson refused the body as sent, so a clean body
  pays no scan), and ``dumps`` falls back to the standard library's ASCII escapes (``"\\ud800"``,
  still valid JSON) for an answer that carries one from upstream;
- it refuses integers beyond 64 bits and non-string keys when encoding: the same fallback writes them
  as the standard library always did.

The output is compact UTF-8 (what Starlette's ``JSONResponse`` wrote), so clients receive JSON
equivalent to before; the only textual differences are float spellings (``1e16`` for ``1e+16``) and
``NaN``/``Infinity`` becoming ``null`` (which Starlette refused with a 500). The provider fast path
(``proxy/provider/fast/base.post_json``) encodes its request bodies here too; the cassettes pin those
bytes (acompletion's own calls are serialized by litellm and the openai SDK).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson
from starlette.background import BackgroundTask
from starlette.responses import Response

JSONDecodeError = orjson.JSONDecodeError  # a ValueError, like json.JSONDecodeError


def loads(data: bytes | str) -> Any:
    """Strict JSON (no ``NaN``/``Infinity``, no lone surrogates) to Python values."""
    return orjson.loads(data)


_WIDE = 2.0**63  # orjson reads an integer literal beyond 64 bits as a float at least this large


def loads_text(text: str) -> Any:
    """Exactly what ``json.loads(text)`` returns (or raises), with orjson doing the work where the two
    agree: anything orjson refuses (``NaN``, a lone surrogate escape) is left to the standard library, and
    so is a text whose value holds a float of 2**63 or more, which may be an integer literal orjson
    widened (the standard library keeps it exact). For texts inside messages (tool-call arguments, tool
    results) and the store's rows. The check walks the value, not the text: a regular expression for a
    run of 19 digits cost 16 us per kilobyte of text full of numbers, more than orjson's whole read."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
    return json.loads(text) if _holds_wide_float(value) else value


def _holds_wide_float(value: Any) -> bool:
    """Whether ``value`` holds a float orjson may have widened from an integer (``request_body._plain``
    checks a request body for the same, with its depth, in one walk). Walked without recursion."""
    pending = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is dict:
            pending.extend(item.values())
        elif kind is list:
            pending.extend(item)
        elif kind is float and not -_WIDE < item < _WIDE:
            return True
    return False


def dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON bytes; what orjson refuses is written by the standard library."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:  # a lone surrogate, a >64-bit integer, a non-string key
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("ascii")


class JSONAnswer(Response):
    """A JSON response encoded by ``dumps`` (Starlette's ``JSONResponse`` uses the standard library)."""

    media_type = "application/json"

    def __init__(
        self,
        content: Any,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        background: BackgroundTask | None = None,
    ) -> None:
        super().__init__(content, status_code, headers, self.media_type, background)

    def render(self, content: Any) -> bytes:
        return dumps(content)
