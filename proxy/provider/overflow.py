"""Recognize a provider's context-window overflow, whatever shape its error takes.

Providers disagree on everything but the words: the HTTP status (400, 413, 422, 500, even 200 for an
error event inside a stream) and the ``code`` field are unreliable, and the envelope varies
(``{"error": {...}}``, ``{"type": "error", "error": {...}}``, ``{"message": ...}``, ``{"error": "text"}``,
JSON arrays, raw event-stream text). So the normalizer reads every message the body carries and
matches the phrasings providers use, after first ruling out the look-alikes that also talk about
tokens and sizes: per-minute token quotas, output ``max_tokens`` caps, request-size limits and content
filters. Retrying those after a compaction would only waste a provider call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from proxy.provider.overflow_lookalikes import LOOKALIKE_CODES, LOOKALIKE_TEXT
from proxy.provider.overflow_phrasings import OVERFLOW_CODES, PHRASINGS

_I = re.IGNORECASE


@dataclass(frozen=True)
class OverflowMatch:
    """A recognized context-window overflow.

    ``limit`` is the window the provider stated (None when it stated none); ``counts_output`` says the
    provider counted the requested ``max_tokens`` against the window, so lowering it may be enough.
    """

    message: str
    limit: int | None
    counts_output: bool
    rule: str


# Machine-readable window sizes some servers put beside the message (llama.cpp's ``n_ctx``).
_LIMIT_FIELDS = ("n_ctx", "max_context_length", "context_length")
_OUTPUT_WORDS = re.compile(r"completion|output|max_tokens|max_new_tokens|prediction", _I)


@dataclass
class _Facts:
    """Everything a body says that matters here, flattened."""

    messages: list[str]
    codes: set[str]
    limit_field: int | None = None
    # Other free text a gateway puts beside the message (one puts the upstream sentence in ``param``):
    # read for look-alikes only, never quoted as the provider's message.
    asides: list[str] = field(default_factory=list)


def stated_limit(text: str) -> int | None:
    """The context window a provider's message states (``maximum context length is N tokens``,
    ``prompt is too long: N tokens > M maximum`` -> M, ...), or None when it states none."""
    for rule in PHRASINGS:
        if rule.limit_group and (found := rule.pattern.search(text)):
            return int(found.group(rule.limit_group).replace(",", ""))
    return None


def parse_error_body(raw: str | bytes) -> Any:
    """Decode an error body: JSON, the ``data:`` lines of an event stream, else the text itself."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    stripped = text.strip()
    if not stripped:
        return None
    try:
        return json.loads(stripped)
    except ValueError:
        pass
    events = []
    for line in stripped.splitlines():
        if line.startswith("data:"):
            try:
                events.append(json.loads(line[5:].strip()))
            except ValueError:
                continue
    if events:
        return events[0] if len(events) == 1 else events
    return stripped


def provider_message(body: Any) -> str | None:
    """The first human-readable message in an error body of any known shape, or None."""
    facts = _facts(body)
    return facts.messages[0] if facts.messages else None


def lookalike_reason(status: int | None, body: Any, text: str = "") -> str | None:
    """Why this error is a known overflow look-alike (``rate_limit``, ``output_cap``, ``request_size``,
    ``content_filter``), or None. An exception litellm classed as an overflow is still not one then."""
    if status == 429:
        return "rate_limit"
    facts = _facts(body)
    for code in facts.codes:
        if code in LOOKALIKE_CODES:
            return LOOKALIKE_CODES[code]
    joined = "\n".join([*facts.messages, *facts.asides, text])
    for reason, pattern in LOOKALIKE_TEXT:
        if pattern.search(joined):
            return reason
    return None


def detect_overflow(status: int | None, body: Any, text: str = "") -> OverflowMatch | None:
    """Recognize a context-window overflow from the HTTP status, the error body and any extra text.

    ``body`` may be parsed JSON, a string (JSON, event-stream or plain text) or None; ``text`` is read
    too (e.g. an exception message that quotes the body). Look-alikes are ruled out first.
    """
    if lookalike_reason(status, body, text) is not None:
        return None
    facts = _facts(body)
    candidates = [*facts.messages, text] if text else facts.messages
    for candidate in candidates:
        for rule in PHRASINGS:
            if found := rule.pattern.search(candidate):
                limit = int(found.group(rule.limit_group).replace(",", "")) if rule.limit_group else facts.limit_field
                # OpenAI-style messages say "... in the completion" when max_tokens was counted.
                said_output = rule.name == "max_context_length" and bool(_OUTPUT_WORDS.search(candidate))
                message = facts.messages[0] if candidate is text and facts.messages else candidate
                return OverflowMatch(message, limit, rule.counts_output or said_output, rule.name)
    matched_codes = facts.codes & OVERFLOW_CODES
    if matched_codes:
        message = facts.messages[0] if facts.messages else text
        return OverflowMatch(message, facts.limit_field, False, f"code:{min(matched_codes)}")
    return None


def _facts(body: Any) -> _Facts:
    facts = _Facts(messages=[], codes=set())
    _walk(body, facts, depth=0)
    # Bodies repeat their message (Gemini's errors[], LM Studio's event); keep each once, in order.
    facts.messages = list(dict.fromkeys(m for m in facts.messages if m))
    return facts


def _walk(node: Any, facts: _Facts, depth: int) -> None:
    if depth > 8:  # a hostile or absurd body must not recurse forever
        return
    if isinstance(node, str):
        parsed = parse_error_body(node) if node.lstrip()[:1] in ("{", "[") or "data:" in node else None
        if parsed is not None and not isinstance(parsed, str):
            _walk(parsed, facts, depth + 1)
        else:
            facts.messages.append(node.strip())
    elif isinstance(node, list):
        for item in node[:32]:
            _walk(item, facts, depth + 1)
    elif isinstance(node, dict):
        for key in ("message", "error", "detail", "errors", "msg", "error_message"):
            if key in node:
                _walk(node[key], facts, depth + 1)
        if isinstance(node.get("param"), str):
            facts.asides.append(node["param"])
        for key in ("code", "type"):
            if isinstance(node.get(key), str):
                facts.codes.add(node[key].lower())
        for key in _LIMIT_FIELDS:
            value = node.get(key)
            if facts.limit_field is None and isinstance(value, int) and not isinstance(value, bool) and value > 0:
                facts.limit_field = value
