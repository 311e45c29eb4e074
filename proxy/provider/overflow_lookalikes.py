"""Provider errors that talk about tokens, length or size but are not context overflows.

Retrying one of these after a compaction would only waste a provider call: per-minute token quotas, output
``max_tokens`` caps, request-size limits and content filters. Each pattern names the look-alike it is.
"""

from __future__ import annotations

import re

_I = re.IGNORECASE

# Look-alikes, checked before any overflow phrasing: each is a real provider error that mentions
# tokens, length or size but is not fixed by shrinking the context.
LOOKALIKE_TEXT: tuple[tuple[str, re.Pattern[str]], ...] = (
    # OpenAI/Groq/Anthropic per-minute token quotas ("tokens per min (TPM)", Groq answers them with 413
    # "Request too large"), and account quotas (Moonshot's "exceeded current quota").
    ("rate_limit", re.compile(r"rate[\s_-]*limit|per minute|\b[tr]pm\b|quota|too many requests", _I)),
    (
        "output_cap",
        re.compile(
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
            r"|parameter `max_(?:completion_)?tokens` specified in the request",
            _I,
        ),
    ),
    (
        "request_size",
        re.compile(
            # OpenAI's 10 MiB string limit, Anthropic's 413, Bedrock InvokeModel's 25 MB body limit
            r"string too long|request exceeds the maximum size|request entity too large"
            r"|value at 'body' failed to satisfy constraint",
            _I,
        ),
    ),
    ("content_filter", re.compile(r"content (management|filter(ing)?) polic|safety system|content_policy", _I)),
)
LOOKALIKE_CODES = {
    "rate_limit_exceeded": "rate_limit",
    "rate_limit_error": "rate_limit",
    "insufficient_quota": "rate_limit",
    "string_above_max_length": "request_size",
    "request_too_large": "request_size",
    "content_filter": "content_filter",
    "content_policy_violation": "content_filter",
}
