"""``read_tool_output``: the proxy-owned tool that reads a stored tool body back, bounded.

Three forms, exactly one per call, chosen by the model (the proxy never searches on its behalf):

- ``query``: a literal, case-sensitive substring; the matching lines with their 1-based numbers,
  capped in count and characters. On an over-wide line only a window around each hit is shown, with
  its character offsets, so the model can follow up with a character range.
- ``start_line``/``end_line``: 1-based, inclusive, at most ``max_lines`` lines.
- ``start_char``/``end_char``: 0-based, end exclusive, at most ``max_chars``; only for bodies with an
  over-wide line (compressed JSON, minified output), where line ranges cannot bound the answer.

Every wrong choice is answered with a plain text that names the form to use; the tool never raises
into the model loop. The body comes through the :class:`ToolOutputSource` port, so a reference of
another session (the store answers ``None``) reads exactly like an unknown one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.context.previews import READ_TOOL_OUTPUT, is_valid_ref

READ_TOOL_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": READ_TOOL_OUTPUT,
        "description": (
            "Read a stored tool output that was compacted into a preview naming ref=<REF>. Give ref and exactly "
            "one of: query (a literal, case-sensitive text; returns the matching lines with their line numbers), "
            "start_line and end_line (1-based, inclusive), or start_char and end_char (0-based, end exclusive; "
            "only for outputs with over-wide lines such as compressed JSON). Results are bounded; ask again for more."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "ref": {"type": "string", "description": "The reference after ref= in the preview."},
                "query": {"type": "string", "description": "Literal text to find (case-sensitive)."},
                "start_line": {"type": "integer", "minimum": 1},
                "end_line": {"type": "integer", "minimum": 1},
                "start_char": {"type": "integer", "minimum": 0},
                "end_char": {"type": "integer", "minimum": 1},
            },
            "required": ["ref"],
            "additionalProperties": False,
        },
    },
}

KNOWN_ARGUMENTS = frozenset(READ_TOOL_OUTPUT_SCHEMA["function"]["parameters"]["properties"])
FORMS = "query, or start_line and end_line, or start_char and end_char"


class ToolOutputSource(Protocol):
    """Where stored tool bodies come from (the session store, scoped to one session)."""

    async def get(self, ref: str) -> str | None:
        """The body stored under ``ref`` in this session, or ``None`` when it is not this session's."""


@dataclass(frozen=True)
class ReaderLimits:
    """Bounds of one answer."""

    max_matches: int = 40
    max_lines: int = 200
    max_chars: int = 8000  # of any answer's body text
    wide_line_chars: int = 2000  # a line longer than this is over-wide
    hit_window: int = 160  # characters shown either side of a hit on an over-wide line


def _int_arg(args: Mapping[str, Any], name: str) -> int | str | None:
    """The integer argument ``name``, ``None`` when absent, or an error text."""
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        return f"error: {name} must be an integer, got {value!r}"
    return value


def read_body(body: str, args: Mapping[str, Any], limits: ReaderLimits | None = None) -> str:
    """Answer one ``read_tool_output`` call on ``body`` (``ref`` is not looked at here)."""
    limits = limits or ReaderLimits()
    unknown = sorted(set(args) - KNOWN_ARGUMENTS)
    if unknown:
        return f"error: unknown argument(s) {', '.join(unknown)}; give ref and one of: {FORMS}."
    ints: dict[str, int | None] = {}
    for name in ("start_line", "end_line", "start_char", "end_char"):
        value = _int_arg(args, name)
        if isinstance(value, str):
            return value
        ints[name] = value
    query = args.get("query")
    if query is not None and not isinstance(query, str):
        return f"error: query must be a string, got {query!r}"
    has_lines = ints["start_line"] is not None or ints["end_line"] is not None
    has_chars = ints["start_char"] is not None or ints["end_char"] is not None
    chosen = [
        form for form, used in (("query", bool(query)), ("line range", has_lines), ("char range", has_chars)) if used
    ]
    if not chosen:
        return f"error: give exactly one of: {FORMS}. {_shape(body, limits)}"
    if len(chosen) > 1:
        return f"error: use only one of: {FORMS} (got {' and '.join(chosen)})."
    if query:
        return _query(body, query, limits)
    if has_lines:
        return _lines(body, ints["start_line"], ints["end_line"], limits)
    return _chars(body, ints["start_char"], ints["end_char"], limits)


def _shape(body: str, limits: ReaderLimits) -> str:
    lines = body.split("\n")
    widest = max(len(line) for line in lines)
    shape = f"This output has {len(lines):,} lines and {len(body):,} characters"
    if widest > limits.wide_line_chars:
        return shape + f"; its widest line has {widest:,} characters (use start_char/end_char for it)."
    return shape + "."


def _query(body: str, query: str, limits: ReaderLimits) -> str:
    lines = body.split("\n")
    out: list[str] = []
    used = 0
    total = 0
    offset = 0  # character offset of the current line in the body
    truncated = False
    for number, line in enumerate(lines, start=1):
        if query in line:
            total += 1
            if not truncated:
                for piece in _hits(line, query, number, offset, limits):
                    if len(out) >= limits.max_matches or used + len(piece) > limits.max_chars:
                        truncated = True
                        break
                    out.append(piece)
                    used += len(piece) + 1
        offset += len(line) + 1
    if total == 0:
        return (
            f"no line contains {query!r} (literal, case-sensitive match). {_shape(body, limits)} "
            "Try another literal query or a line range."
        )
    header = f"{total:,} line(s) contain {query!r}"
    if truncated:
        header += f"; showing the first {len(out)} match(es); narrow the query or read a line range"
    return header + ":\n" + "\n".join(out)


def _hits(line: str, query: str, number: int, offset: int, limits: ReaderLimits) -> list[str]:
    """One result line, or for an over-wide line a window around each hit with its body char offsets."""
    if len(line) <= limits.wide_line_chars:
        return [f"{number}: {line}"]
    pieces: list[str] = []
    start = line.find(query)
    while start != -1:
        lo, hi = max(0, start - limits.hit_window), min(len(line), start + len(query) + limits.hit_window)
        pieces.append(f"{number} [chars {offset + lo}-{offset + hi}]: {line[lo:hi]}")
        start = line.find(query, hi)
    return pieces


def _lines(body: str, start: int | None, end: int | None, limits: ReaderLimits) -> str:
    if start is None or end is None:
        return "error: a line range needs both start_line and end_line (1-based, inclusive)."
    lines = body.split("\n")
    if len(lines) == 1 and len(body) > limits.wide_line_chars:
        return (
            f"error: this output is one line of {len(body):,} characters; use start_char/end_char "
            f"(0-based, end exclusive, at most {limits.max_chars:,} per call) or a query."
        )
    if start < 1 or end < start:
        return "error: need 1 <= start_line <= end_line."
    if start > len(lines):
        return f"error: start_line {start} is past the end; this output has {len(lines):,} lines."
    stop = min(end, len(lines), start + limits.max_lines - 1)
    offset = sum(len(line) + 1 for line in lines[: start - 1])
    out: list[str] = []
    used = 0
    for number in range(start, stop + 1):
        line = lines[number - 1]
        if len(line) > limits.wide_line_chars:
            shown = (
                f"{number}: {line[: limits.hit_window]}… [line of {len(line):,} characters at chars "
                f"{offset}-{offset + len(line)}; read it with start_char/end_char]"
            )
        else:
            shown = f"{number}: {line}"
        if out and used + len(shown) > limits.max_chars:
            stop = number - 1
            break
        out.append(shown)
        used += len(shown) + 1
        offset += len(line) + 1
    header = f"lines {start}-{stop} of {len(lines):,}"
    if stop < min(end, len(lines)):
        header += f" (answer bounded; continue with start_line={stop + 1})"
    return header + ":\n" + "\n".join(out)


def _chars(body: str, start: int | None, end: int | None, limits: ReaderLimits) -> str:
    if start is None or end is None:
        return "error: a character range needs both start_char and end_char (0-based, end exclusive)."
    if max((len(line) for line in body.split("\n")), default=0) <= limits.wide_line_chars:
        return f"error: this output has no over-wide line; use start_line/end_line or a query. {_shape(body, limits)}"
    if start < 0 or end <= start:
        return "error: need 0 <= start_char < end_char."
    if start >= len(body):
        return f"error: start_char {start} is past the end; this output has {len(body):,} characters."
    stop = min(end, len(body), start + limits.max_chars)
    header = f"chars {start}-{stop} of {len(body):,}"
    if stop < min(end, len(body)):
        header += f" (answer bounded; continue with start_char={stop})"
    return header + ":\n" + body[start:stop]


def parse_arguments(arguments: str | Mapping[str, Any]) -> dict[str, Any] | str:
    """The call's arguments as a dict (from the JSON text a model sends), or an error text."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    try:
        parsed = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        return f"error: the arguments are not valid JSON ({exc.msg}); give an object with ref and one of: {FORMS}."
    if not isinstance(parsed, dict):
        return f"error: the arguments must be a JSON object with ref and one of: {FORMS}."
    return parsed


async def read_tool_output(
    source: ToolOutputSource, arguments: str | Mapping[str, Any], limits: ReaderLimits | None = None
) -> str:
    """Run one ``read_tool_output`` call: the text that becomes the tool result for the model."""
    args = parse_arguments(arguments)
    if isinstance(args, str):
        return args
    ref = args.get("ref")
    if not isinstance(ref, str) or not ref:
        return f"error: ref is required (the text after ref= in a compacted preview), plus one of: {FORMS}."
    if not is_valid_ref(ref):
        return f"error: {ref!r} is not a reference; copy the text after ref= from a compacted preview."
    body = await source.get(ref)
    if body is None:
        return f"unknown reference ref={ref}: no stored output of this session has it."
    return read_body(body, args, limits)
