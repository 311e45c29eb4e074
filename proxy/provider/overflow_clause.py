"""What every overflow message has in common, for the servers whose exact words we have never seen.

A provider that says its context overflowed names the input side (prompt, input, context, request,
messages, sequence, conversation), says it is too much (exceeds, too long, too large, longer than, does
not fit) and says of what (tokens, characters, length, size, window, a limit). Or it states two counts,
what the request holds and what the model takes, and the first is the larger. Output caps say the same of
``max_tokens`` instead, which is why the subject of the excess is read, not just the words around it.

The look-alikes that share this vocabulary (quotas, byte limits, a tool name's length) are ruled out by
``overflow_lookalikes`` before this module is asked.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_I = re.IGNORECASE
_N = r"(\d[\d,]*)"

# Not the input side: "Bad request" (an HTTP reason), "Input validation error" and "invalid input argument"
# (an error's kind), "messages.0.content" and "messages[3]" (a path into the request to some other field).
_INPUT_SIDE = re.compile(
    r"\b(?:prompts?|(?<!invalid )inputs?(?! validation| argument|[.\[]\d)|input_ids|prompt_tokens|input_tokens|context"
    r"|(?<!bad )requests?|messages?(?![.\[]\d)|sequences?|conversation|query|history)\b",
    _I,
)
_OUTPUT_SIDE = re.compile(r"\bmax_(?:new_|completion_|output_)?tokens\b|\bn_predict\b|\bcompletion\b|\boutput\b", _I)
_EXCESS = re.compile(
    r"\bexceed(?:s|ed|ing)?\b|\btoo (?:long|large|big|many)\b|\b(?:longer|larger|greater|bigger|more) than\b"
    r"|\boverflow(?:s|ed|ing)?\b|\bbeyond\b|\bdoes(?:n't| not) fit\b"
    # A constraint stated when it was broken: "must be less than max_seq_len", "`inputs` tokens must be <= 2048".
    r"|\b(?:must|should) (?:be|have) (?:less|fewer|smaller|no more|at most|<=)"
    r"|\bcannot be (?:greater|larger|longer|more)",
    _I,
)
# The window named as the thing exceeded, the input left implicit: "model max length exceeded", "max tokens of
# 200000 exceeded", "token limit exceeded". No underscore: "max_tokens" is the output parameter.
_CAPACITY_EXCEEDED = re.compile(
    r"\b(?:max(?:imum)?|model|context|token|input|prompt|sequence)[\s-]+(?:context[\s-]+)?(?:length|window|size|limit"
    r"|tokens)\b(?:\s+of\s+\d[\d,]*)?\s+(?:has been |have been |was |is |were )?exceeded\b",
    _I,
)
# The advice every overflow gives and no look-alike does once quotas and output caps are ruled out: "Please
# reduce the length of the messages", "Reduce the input token count", "Try using shorter or fewer inputs".
_ADVICE = re.compile(
    r"\b(?:reduce|shorten|decrease|truncate)\b[^.]{0,25}\b(?:length|size)\b[^.]{0,20}\b(?:input|prompt|messages?"
    r"|conversation|context|history)\b|\b(?:reduce|shorten|decrease|truncate)\s+(?:the\s+|your\s+)?(?:input|prompt"
    r"|messages?|conversation|context)\b|\bshorter(?: or fewer)? (?:inputs?|prompts?|messages?|conversation)\b",
    _I,
)
# "too long" and "longer than" carry their own measure; every other excess needs one beside it.
_LENGTH_EXCESS = re.compile(r"too long|longer than", _I)
_MEASURE = re.compile(
    r"\btokens?\b|\bcharacters?\b|\bchars\b|\blength\b|\bsize\b|\bwindow\b|\blimit\b|\bmaximum\b|\bn_ctx\b"
    r"|\bmax_\w+|\bkv\b",
    _I,
)
_COUNTED = re.compile(r"\btokens\b|\bcharacters\b", _I)
_OUTPUT_WORDS = re.compile(r"completion|output|max_tokens|max_new_tokens|prediction", _I)
# A sentence ends at . ! ? ; followed by a space (not inside "5.3" or "9351.0"), or at a line break.
_SENTENCE_END = re.compile(r"[.!?;]+(?=\s|$)|\n+")

# Where a message states the window, most specific first. Each group 1 is the window; a count the request
# holds ("prompt length (1240)", "input length (265330)") is never read as one.
_WINDOWS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(pattern, _I)
    for pattern in (
        rf"\(\s*\d[\d,]*\s*(?:tokens?\s*)?>\s*{_N}\s*(?:tokens?\s*)?\)",  # "(1336 > 512)"
        rf"maximum context (?:length|window|size) of [^\s,]+ is {_N}",  # "of DeepSeek-V3-0324 is 32768"
        rf"maximum number of tokens(?: allowed)?\s*(?:is|of|:)?\s*\(?{_N}",
        rf"\bmax(?:imum)? (?:input |sequence |prompt |context |model |total )?(?:length|tokens|size|window)"
        rf"\s*(?:is|of|=|:)?\s*\(?{_N}",
        rf"\bcontext (?:length|size|window|limit)(?: of this model)?\s*(?:is|of|=|:)?\s*\(?{_N}",
        rf"\bmax_(?:num_tokens|seq_len|model_len|input_len(?:gth)?|context_length|position_embeddings|total_tokens)"
        rf"\b\s*(?:is|of|=|:)?\s*\(?{_N}",
        rf"\bn_ctx\b\s*[:=(]?\s*{_N}",
        rf"\bsupports? (?:up to|at most) {_N}",
        rf"\blimit (?:is|of) {_N}\s*tokens",
    )
)
# What the request holds: "prompt is 9884 tokens", "input token count is 1251952", "you supplied 5441 tokens".
# Or the left side of a comparison the server printed: "n_keep (15028) >= n_ctx (7424)".
_REQUEST_COUNT = re.compile(rf"token count (?:is|of|:)?\s*\(?{_N}|{_N}\s*(?:input )?tokens?\b|{_N}\)?\s*>=?\s", _I)


class Clause(NamedTuple):
    """The sentence that says the input overflowed, the window it states, whether output was counted."""

    sentence: str
    limit: int | None
    counts_output: bool
    rule: str


def overflow_clause(text: str) -> Clause | None:
    """The part of ``text`` that says the input is larger than the model's window, or None."""
    for sentence in _sentences(text):
        if rule := _excess_rule(sentence, text) or _capacity_rule(sentence):
            return Clause(sentence, stated_window(text), bool(_OUTPUT_WORDS.search(sentence)), rule)
    # Counts and advice often sit in different sentences: "maximum context length is N. However, you requested M".
    if rule := _comparison_rule(text) or _advice_rule(text):
        return Clause(text, stated_window(text), bool(_OUTPUT_WORDS.search(text)), rule)
    return None


def stated_window(text: str) -> int | None:
    """The window ``text`` states in words no provider-specific phrasing covers, or None."""
    for pattern in _WINDOWS:
        if found := pattern.search(text):
            return _int(found.group(1))
    return None


def _excess_rule(sentence: str, text: str) -> str | None:
    if not _INPUT_SIDE.search(sentence):
        return None
    for excess in _EXCESS.finditer(sentence):
        before = sentence[: excess.start()]
        # "max_tokens (10000) cannot exceed 8192": the output is what is too large, and no input is named.
        if _OUTPUT_SIDE.search(before) and not _INPUT_SIDE.search(before):
            continue
        # "Too many" of what: tokens, not messages or tools.
        if excess.group().lower().startswith("too many") and not _COUNTED.search(sentence):
            continue
        # The measure may come a sentence later: "Input is too large to process. ... increase context length."
        if _LENGTH_EXCESS.search(excess.group()) or _MEASURE.search(text):
            return "general_excess"
    return None


def _capacity_rule(sentence: str) -> str | None:
    return "general_capacity_exceeded" if _CAPACITY_EXCEEDED.search(sentence) else None


def _comparison_rule(text: str) -> str | None:
    """Two counts and no verb of excess: "The prompt is 9884 tokens and the context window is 2048"."""
    if not _INPUT_SIDE.search(text):
        return None
    window = stated_window(text)
    if window is None:
        return None
    counts = [_int(next(g for g in found.groups() if g)) for found in _REQUEST_COUNT.finditer(text)]
    return "general_comparison" if any(count > window for count in counts) else None


def _advice_rule(text: str) -> str | None:
    return "general_advice" if _ADVICE.search(text) and _MEASURE.search(text) else None


def _sentences(text: str) -> list[str]:
    return [part.strip() for part in _SENTENCE_END.split(text) if part.strip()]


def _int(digits: str) -> int:
    return int(digits.replace(",", ""))
