"""Provider errors that talk about tokens, length or size but are not context overflows.

Retrying one of these after a compaction would only waste a provider call: token quotas and throttling,
account quotas, output ``max_tokens`` caps, the length of a tool name or an array, request and image sizes
in bytes, content filters. Each pattern names the look-alike it is.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_I = re.IGNORECASE


class Lookalike(NamedTuple):
    """A kind of error that is not an overflow, and how to tell it."""

    reason: str
    pattern: re.Pattern[str]
    # A decisive look-alike rules an overflow out whatever else the body says; the others only keep the
    # general rules quiet (vLLM's "'max_tokens' ... is too large" message also states the window it overflowed).
    decisive: bool


def _lookalike(reason: str, pattern: str, decisive: bool = True) -> Lookalike:
    return Lookalike(reason, re.compile(pattern, _I), decisive)


# Each is a real provider error that mentions tokens, length or size but is not fixed by shrinking the
# context; the sources are in tests/provider/data/overflow_corpus.json.
LOOKALIKES: tuple[Lookalike, ...] = (
    # Per-minute and per-day token quotas ("tokens per min (TPM)", Groq answers them with 413 "Request too
    # large"), and throttling (Bedrock's "Too many tokens, please wait before trying again.").
    _lookalike(
        "rate_limit",
        r"rate[\s_-]*limit|per (?:min(?:ute)?|hour|day)\b|\b[trq]pm\b|\bqps\b|too many requests"
        r"|throttl|please wait",
    ),
    # Account quotas and money (Moonshot's "exceeded current quota", MiniMax's "insufficient balance").
    _lookalike("quota", r"quota|insufficient[_ ]balance|\bbalance\b|billing|\bcredits?\b"),
    _lookalike(
        "output_cap",
        # Anthropic's "max_tokens: N > M, which is the maximum allowed number of output tokens"
        r"maximum allowed number of output tokens|max_tokens: \d+ > \d+"
        # OpenAI "max_tokens is too large: N. This model supports at most M completion tokens"
        r"|max_tokens is too large|supports at most \d+ completion tokens"
        # Groq "max_tokens must be less than or equal to N, the maximum value for max_tokens ..."
        r"|max_tokens`? must be less than or equal to"
        # Bedrock (Anthropic) "The maximum tokens you requested exceeds the model limit of N"
        r"|maximum tokens you requested exceeds the model limit"
        # TGI "Input validation error: `max_new_tokens` must be <= N" (not "`inputs` tokens + `max_new_tokens`")
        r"|error: `max_new_tokens` must be <="
        # Volcengine Ark "The parameter `max_completion_tokens` specified in the request are not valid"
        r"|parameter `max_(?:completion_)?tokens` specified in the request"
        # Anthropic's extended thinking "`max_tokens` must be greater than `thinking.budget_tokens`" (its
        # documentation link ends "#max-tokens-and-context-window-size", which litellm reads as an overflow)
        r"|must be greater than `?thinking\.budget_tokens",
    ),
    # The length of a name or the count of an array, not of the context: OpenAI's "Invalid
    # 'tools[0].function.name': string too long", "Invalid 'tools': array too long", Anthropic's "String
    # should have at most 64 characters", DashScope's "The length of the tool name cannot exceed 64".
    _lookalike(
        "parameter_length",
        r"array too long|expected an array with maximum length|should have at most \d+ characters"
        r"|\b(?:tool|function)(?:[\w\[\]'`.]*|\s)name\b",
    ),
    _lookalike(
        "request_size",
        # OpenAI's 10 MiB string limit, Anthropic's 413, Bedrock InvokeModel's 25 MB body limit, Gemini's
        # "Request payload size exceeds the limit: N bytes", Anthropic's "image exceeds 5 MB maximum".
        r"string too long|request exceeds the maximum size|request entity too large"
        r"|value at 'body' failed to satisfy constraint|\bbytes\b|\b\d+(?:\.\d+)?\s*[kmg]b\b|body size|payload size"
        r"|image[^.]{0,40}(?:exceed|too (?:large|big)|dimension)|\bpixels\b",
    ),
    _lookalike("content_filter", r"content (management|filter(ing)?) polic|safety system|content_policy"),
    # Output caps in other words: "max_tokens (10000) cannot exceed 8192" (Databricks), "max_tokens for
    # `model` must be less than or equal to 8000" (Groq), "max_completion_tokens is too large" (Cloudflare).
    _lookalike(
        "output_cap",
        r"max_(?:new_|completion_|output_)?tokens\b[`'\"]?(?:\s+\S+){0,3}?\s+must be (?:less|<=|at most|at least)"
        r"|max_(?:new_|completion_|output_)?tokens\b[`'\"]?(?:\s+or\s+\S+)?\s+(?:is|are) too large"
        r"|max_(?:new_|completion_|output_)?tokens\s*\(\d[\d,]*\)\s*(?:cannot|must not|should not|may not) exceed",
        decisive=False,
    ),
)
LOOKALIKE_CODES = {
    "rate_limit_exceeded": "rate_limit",
    "rate_limit_error": "rate_limit",
    "insufficient_quota": "quota",
    "exceeded_current_quota_error": "quota",
    "insufficient_balance_error": "quota",
    "string_above_max_length": "request_size",
    "array_above_max_length": "parameter_length",
    "request_too_large": "request_size",
    "content_filter": "content_filter",
    "content_policy_violation": "content_filter",
}
