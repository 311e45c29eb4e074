"""Request body bytes to a JSON object: the one place a client's JSON is decoded.

Everything a client can send that is legal JSON but poison further on is settled here, before
anything is stored, counted or validated:

- nesting deeper than ``MAX_DEPTH`` is refused with a check that is not recursive, before either
  decoder runs, so no input reaches Python's recursion limit anywhere downstream;
- ``NaN``, ``Infinity``, ``-Infinity`` and numbers too large for a float are refused (a provider
  would reject them, and JSON encoders downstream would emit them as invalid JSON);
- lone UTF-16 surrogates (``"\\ud800"``, which Python agents produce from ``surrogateescape`` file
  names) become U+FFFD: they cannot be encoded as UTF-8, so a store, an estimator or a trace would
  fail on them in every later turn of the session.

Two decoders, one result. The fast one is orjson (``proxy.kernel.jsonio``), strict JSON several times faster
than the standard library: it refuses ``NaN``/``Infinity``/overflowing numbers itself, the lone
surrogates it refuses are rewritten to ``\\ufffd`` in the raw bytes before it reads them again, and
the nesting of what it decoded is checked with a walk of the result (cheaper than the byte scan).
Anything it cannot settle goes to the standard library's path, which is the reference: it names the
problem of a bad body (in the same words as always), and it reads integers beyond 64 bits exactly,
which orjson turns into floats (so a body holding a float that large is read again there).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Iterable
from typing import Any

from proxy.kernel import jsonio
from proxy.kernel.errors import InvalidRequest

MAX_DEPTH = 64  # arrays and objects; an OpenAI chat request needs about 8
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')  # deleted before counting brackets
_BRACKETS_IN_STRING = re.compile(rb'"[^"]*"')
_INNERMOST_PAIR = re.compile(rb"\[\]|\{\}")  # one scan per pass: a pair it uncovers waits for the next
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# A \u escape of a surrogate, with the low half after a high one (a pair). Whether its backslash really
# starts an escape (an even run of backslashes before it) is decided in ``_surrogate_replacement``: a
# pattern that counted the run itself would be tried at every byte of a megabyte body.
_ESCAPED_SURROGATE = re.compile(
    rb"\\u[dD](?:[89abAB][0-9a-fA-F]{2}(\\u[dD][c-fC-F][0-9a-fA-F]{2})?"  # a high half, then maybe its low one
    rb"|[c-fC-F][0-9a-fA-F]{2})"  # a low half on its own
)
_WIDE = 2.0**63  # orjson reads integers beyond 64 bits as floats at least this large


def decode_body(raw: bytes, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """The body as a JSON object; ``InvalidRequest`` (400) naming the problem for anything else."""
    try:
        body = jsonio.loads(raw)  # nests at most 1,024 deep, or refuses: it never recurses in Python
    except jsonio.JSONDecodeError:
        body = None  # bad UTF-8 or JSON, a non-finite number, a lone surrogate
        if _SURROGATE_ESCAPE.search(raw):
            with contextlib.suppress(jsonio.JSONDecodeError):  # bad for another reason as well
                body = jsonio.loads(_replace_surrogate_escapes(raw))
    if isinstance(body, dict) and _plain(body, max_depth):
        return body
    return _decode_reference(raw, max_depth)  # names the problem, or reads what orjson would not keep exact


def _plain(body: dict[str, Any], max_depth: int) -> bool:
    """Whether ``body`` nests at most ``max_depth`` deep and holds no float that may be a widened integer.

    orjson reads an integer beyond 64 bits as a float (the standard library keeps it exact), so a float
    of that size sends the body to the reference path. Walked without recursion, like the check there.
    """
    pending: list[tuple[dict[str, Any] | list[Any], int]] = [(body, 1)]
    while pending:
        container, depth = pending.pop()
        # Exact type checks: orjson makes only these types, and a megabyte body has tens of thousands
        # of values, for which isinstance against a union is the larger part of this walk.
        values: Iterable[Any] = container.values() if type(container) is dict else container
        for value in values:
            kind = type(value)
            if kind is dict or kind is list:
                if depth >= max_depth:
                    return False
                pending.append((value, depth + 1))
            elif kind is float and not -_WIDE < value < _WIDE:
                return False
    return True


def _replace_surrogate_escapes(raw: bytes) -> bytes:
    """``raw`` with every escaped lone surrogate written as ``\\ufffd`` (orjson refuses them)."""
    return _ESCAPED_SURROGATE.sub(_surrogate_replacement, raw)


def _surrogate_replacement(match: re.Match[bytes]) -> bytes:
    start = run = match.start()
    while run > 0 and match.string[run - 1] == 0x5C:  # the backslashes right before this one
        run -= 1
    low = match.group(1)  # the low half after a high one, if any: always a real escape
    if (start - run) % 2:  # an escaped backslash, then the text "ud8xx": only the low half is an escape
        return match.group(0)[:6] + (rb"\ufffd" if low else b"")
    if low:  # a pair: one character, legal
        return match.group(0)
    return rb"\ufffd"


def _decode_reference(raw: bytes, max_depth: int) -> dict[str, Any]:
    """The standard library's decode: the reference for what a body means and what is wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid UTF-8 (byte {exc.start}).") from None
    problem = _depth_problem(raw, max_depth)
    if problem is not None:
        raise InvalidRequest(problem)
    try:
        body: Any = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except InvalidRequest:
        raise
    except json.JSONDecodeError as exc:
        raise InvalidRequest(
            f"The request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}."
        ) from None
    except ValueError as exc:  # an integer with more digits than Python converts (sys.get_int_max_str_digits)
        raise InvalidRequest(f"The request body holds a number that cannot be read: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"The request body must be a JSON object, not {_json_kind(body)}.")
    if _SURROGATE_ESCAPE.search(raw):  # lone surrogates only arise from \u escapes: strict UTF-8 had none
        return _replace_surrogates(body)
    return body


def _depth_problem(raw: bytes, max_depth: int) -> str | None:
    """Why the nesting is refused (deeper than ``max_depth``), checked without recursing (and without a
    per-character loop); ``None`` when it is not.

    Works on the UTF-8 bytes, where no multi-byte character contains a quote, a backslash or a
    bracket: escaped backslashes and quotes go first, then everything but quotes and brackets, then
    the strings (now quotes around brackets only). Each pass then removes every innermost pair, so
    the number of passes is the nesting depth. Unbalanced brackets are left to the decoder, unless
    there are so many that the decoder itself would recurse too far.
    """
    structure = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    brackets = _BRACKETS_IN_STRING.sub(b"", structure)
    for _ in range(max_depth):
        if not brackets:
            return None
        shorter = _INNERMOST_PAIR.sub(b"", brackets)
        if len(shorter) == len(brackets):  # unbalanced: the decoder names the syntax error
            if brackets.count(b"[") + brackets.count(b"{") <= max_depth:
                return None
            return "The request body is not valid JSON: its brackets do not balance."
        brackets = shorter
    if brackets:
        return f"The request body nests arrays and objects deeper than {max_depth} levels."
    return None


def _refuse_constant(name: str) -> Any:
    raise InvalidRequest(f"The request body holds {name}, which is not a JSON number.")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise InvalidRequest(f"The request body holds the number {literal[:40]}, which is too large for a float.")
    return value


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


def _replace_surrogates(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with every lone surrogate in keys and strings replaced by U+FFFD, walked without recursion."""
    pending: list[dict[str, Any] | list[Any]] = [body]
    while pending:
        container = pending.pop()
        if isinstance(container, list):
            for index, item in enumerate(container):
                if isinstance(item, str):
                    container[index] = _SURROGATE.sub("\ufffd", item)
                elif isinstance(item, dict | list):
                    pending.append(item)
            continue
        for key in list(container):
            value = container[key]
            if isinstance(value, str):
                value = _SURROGATE.sub("\ufffd", value)
            elif isinstance(value, dict | list):
                pending.append(value)
            clean = _SURROGATE.sub("\ufffd", key)
            if clean != key:
                del container[key]
            container[clean] = value
    return body
