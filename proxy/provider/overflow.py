"""Recognize a provider's context-window overflow, whatever shape its error takes and whoever words it.

Providers disagree on everything but the words: the HTTP status (400, 413, 422, 500, even 200 for an
error event inside a stream) and the ``code`` field are unreliable, and the envelope varies
(``{"error": {...}}``, ``{"type": "error", "error": {...}}``, ``{"message": ...}``, ``{"error": "text"}``,
JSON arrays, raw event-stream text). So the normalizer reads every message the body carries. It first rules
out the look-alikes that also talk about tokens and sizes (``overflow_lookalikes``: quotas, output caps, a
tool name's length, sizes in bytes, content filters): retrying those after a compaction would only waste a
provider call. Then the phrasings providers are known to use decide (``overflow_phrasings``, which also
say where the window is), and for servers whose words we have never seen, the general rules read what every
overflow message says (``overflow_clause``). The status and whether the server is local are weak signals:
they count only for weak words (``OverflowHints``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from proxy.provider.overflow_clause import overflow_clause, stated_window
from proxy.provider.overflow_lookalikes import LOOKALIKE_CODES, LOOKALIKES
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


@dataclass(frozen=True)
class OverflowHints:
    """What the caller knows of the request beside the error; weak signals, counted only with weak words.

    ``local``: the server is self-hosted (loopback, a private address, a compose service name); local
    engines often answer an overflow with a bare 500. ``fill``: the share of the window the request was
    estimated to fill, when the caller knows the window; it outweighs ``local`` when given.
    """

    local: bool = False
    fill: float | None = None

    def near_window(self, status: int | None) -> bool:
        """Whether a weakly worded error is likely the window: a request at 90% of it or more, or (when
        the share is unknown) a 5xx from a local server."""
        if self.fill is not None:
            return self.fill >= 0.9
        return self.local and status is not None and status >= 500


# Words that point at the window without saying it overflowed ("context shift", "KV cache", "n_ctx"): an
# overflow only when the request came close to the window.
_WEAK_WORDS = re.compile(
    r"\bcontext\b[^.\n]{0,30}\b(?:size|length|window|limit|shift|full|exceeded|overflow)|\bn_ctx\b"
    r"|\bkv[ _-]?(?:cache|size)\b|\bout of context\b|\btoo many tokens\b",
    _I,
)
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
    ``prompt is too long: N tokens > M maximum`` -> M, ``only supports up to N``, ...), or None when it
    states none."""
    for rule in PHRASINGS:
        if rule.limit_group and (found := rule.pattern.search(text)):
            return int(found.group(rule.limit_group).replace(",", ""))
    return stated_window(text)


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
    """Why this error is a known overflow look-alike (``rate_limit``, ``quota``, ``output_cap``,
    ``parameter_length``, ``request_size``, ``content_filter``), or None. An exception litellm classed as
    an overflow is still not one then."""
    facts = _facts(body)
    decisive = _lookalike(status, facts, text, decisive=True)
    if decisive is not None:
        return decisive
    candidates = [*facts.messages, text] if text else facts.messages
    if _phrasing(facts, candidates, text) or _code(facts, text):
        return None  # the body also says, in words a provider uses, that the context overflowed
    return _lookalike(status, facts, text, decisive=False)


def detect_overflow(
    status: int | None, body: Any, text: str = "", *, hints: OverflowHints | None = None
) -> OverflowMatch | None:
    """Recognize a context-window overflow from the HTTP status, the error body and any extra text.

    ``body`` may be parsed JSON, a string (JSON, event-stream or plain text) or None; ``text`` is read
    too (e.g. an exception message that quotes the body). In order: decisive look-alikes are ruled out,
    then a provider's own phrasing or code decides, then the other look-alikes are ruled out, then the
    general rules read what any overflow message says, and last, with ``hints``, weak words count when
    the request came close to the window.
    """
    facts = _facts(body)
    if _lookalike(status, facts, text, decisive=True) is not None:
        return None
    candidates = [*facts.messages, text] if text else facts.messages
    if match := _phrasing(facts, candidates, text) or _code(facts, text):
        return match
    if _lookalike(status, facts, text, decisive=False) is not None:
        return None
    for candidate in candidates:
        if clause := overflow_clause(candidate):
            limit = clause.limit or facts.limit_field
            return OverflowMatch(_quoted(candidate, facts, text), limit, clause.counts_output, clause.rule)
    if hints is not None and hints.near_window(status):
        for candidate in candidates:
            if _WEAK_WORDS.search(candidate):
                limit = stated_window(candidate) or facts.limit_field
                return OverflowMatch(_quoted(candidate, facts, text), limit, False, "weak_words_near_window")
    return None


def _lookalike(status: int | None, facts: _Facts, text: str, *, decisive: bool) -> str | None:
    if decisive and status == 429:
        return "rate_limit"
    if decisive:
        for code in facts.codes:
            if code in LOOKALIKE_CODES:
                return LOOKALIKE_CODES[code]
    joined = "\n".join([*facts.messages, *facts.asides, text])
    for lookalike in LOOKALIKES:
        if lookalike.decisive is decisive and lookalike.pattern.search(joined):
            return lookalike.reason
    return None


def _phrasing(facts: _Facts, candidates: list[str], text: str) -> OverflowMatch | None:
    for candidate in candidates:
        for rule in PHRASINGS:
            if found := rule.pattern.search(candidate):
                if rule.limit_group:
                    limit: int | None = int(found.group(rule.limit_group).replace(",", ""))
                else:  # the phrasing states none; the message may still say it in other words
                    limit = stated_window(candidate) or facts.limit_field
                # OpenAI-style messages say "... in the completion" when max_tokens was counted.
                said_output = rule.name == "max_context_length" and bool(_OUTPUT_WORDS.search(candidate))
                return OverflowMatch(
                    _quoted(candidate, facts, text), limit, rule.counts_output or said_output, rule.name
                )
    return None


def _quoted(candidate: str, facts: _Facts, text: str) -> str:
    """The provider's message to quote: when only the extra text matched, the body's own message."""
    return facts.messages[0] if candidate is text and facts.messages else candidate


def _code(facts: _Facts, text: str) -> OverflowMatch | None:
    matched_codes = facts.codes & OVERFLOW_CODES
    if not matched_codes:
        return None
    message = facts.messages[0] if facts.messages else text
    return OverflowMatch(message, stated_window(message) or facts.limit_field, False, f"code:{min(matched_codes)}")


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
