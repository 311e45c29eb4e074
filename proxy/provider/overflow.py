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
from typing import Any, NamedTuple

_I = re.IGNORECASE
_N = r"(\d[\d,]*)"  # a token count; some providers write "200,000"


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


# Look-alikes, checked before any overflow phrasing: each is a real provider error that mentions
# tokens, length or size but is not fixed by shrinking the context.
_LOOKALIKE_TEXT: tuple[tuple[str, re.Pattern[str]], ...] = (
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
_LOOKALIKE_CODES = {
    "rate_limit_exceeded": "rate_limit",
    "rate_limit_error": "rate_limit",
    "insufficient_quota": "rate_limit",
    "string_above_max_length": "request_size",
    "request_too_large": "request_size",
    "content_filter": "content_filter",
    "content_policy_violation": "content_filter",
}


class _Rule(NamedTuple):
    name: str
    pattern: re.Pattern[str]
    limit_group: int  # the group holding the stated window, 0 when the phrasing states none
    counts_output: bool  # the provider counted max_tokens against the window


def _rule(name: str, pattern: str, limit_group: int = 0, counts_output: bool = False) -> _Rule:
    return _Rule(name, re.compile(pattern, _I | re.S), limit_group, counts_output)


# Most specific first: the first rule that matches decides the stated limit. Grouped by who phrases it
# that way; the sources of each phrasing are in tests/provider/data/overflow_corpus.json.
_OVERFLOW_TEXT: tuple[_Rule, ...] = (
    # OpenAI, Azure, DeepSeek, Groq, OpenRouter, vLLM (every version), llama-cpp-python, FastChat.
    _rule("max_context_length", rf"maximum context length is {_N}", 1),
    # Anthropic (also through Bedrock and Vertex).
    _rule("anthropic_prompt_too_long", rf"prompt is too long: {_N} tokens > {_N} maximum", 2),
    _rule("anthropic_input_plus_max_tokens", rf"exceed context limit: {_N} \+ {_N} > {_N}", 3, True),
    # Fireworks: "The prompt is too long: 40177, model maximum context length: 32767".
    _rule("fireworks_prompt_too_long", rf"prompt is too long: {_N}, model maximum context length: {_N}", 2),
    # Gemini and Vertex, with and without the input count.
    _rule(
        "gemini_input_token_count",
        rf"input token count (?:\({_N}\) )?exceeds the maximum number of tokens allowed \({_N}",
        2,
    ),
    # TGI (also Together, Hugging Face endpoints): input + max_new_tokens, or the input alone.
    _rule("tgi_inputs_plus_new_tokens", rf"tokens \+ `?max_new_tokens`? must be <= {_N}", 1, True),
    _rule("tgi_inputs_less_than", rf"`inputs` must have less than {_N} tokens", 1),
    # llama.cpp server; llama-cpp-python.
    _rule("llamacpp_context_size", rf"exceeds the available context size \({_N} tokens\)", 1),
    _rule("llamacpp_python_context_window", rf"requested tokens \({_N}\) exceed context window of {_N}", 2),
    # LM Studio: older "context length of only N", newer "n_keep: K >= n_ctx: N" / "n_keep (K) >= n_ctx (N)".
    _rule("lmstudio_context_length", rf"does not fit in context length.*?supports {_N} tokens", 1),
    _rule("lmstudio_context_of_only", rf"context length of only {_N} tokens", 1),
    _rule("lmstudio_n_keep", rf"n_keep[:\s(]*{_N}\)?\s*>=\s*n_ctx[:\s(]*{_N}", 2),
    _rule("context_length_only_supports", rf"context length only supports {_N} tokens", 1),
    # vLLM V1 ("The decoder prompt (length N) is longer than the maximum model length of M") and V0.
    _rule(
        "vllm_prompt_longer_than_model", rf"prompt \(length {_N}\) is longer than the maximum model length of {_N}", 2
    ),
    _rule("vllm_prompt_length_of", rf"prompt length of {_N} is longer than the maximum model length of {_N}", 2),
    # SGLang: "The input (N tokens) is longer than the model's context length (M tokens)".
    _rule("sglang_longer_than_context", rf"longer than the model's context length \({_N} tokens\)", 1),
    # Ollama's MLX runner: "input length (N tokens) exceeds the model's maximum context length (M tokens)".
    _rule("ollama_model_maximum", rf"model's maximum context length \({_N} tokens\)", 1),
    _rule("cohere_total_tokens", rf"total number of tokens \(prompt and prediction\) cannot exceed {_N}", 1, True),
    _rule("copilot_prompt_token_count", rf"prompt token count of {_N} exceeds the limit of {_N}", 2),
    _rule("mantle_prompt_tokens", rf"prompt tokens \({_N}\) exceed model maximum \({_N}\)", 2),
    _rule("cerebras_current_length", rf"current length is {_N} while limit is {_N}", 2),
    _rule("max_input_length", rf"maximum input length is {_N} tokens", 1),
    _rule("input_too_long_limit", rf"input too long: {_N} input tokens, limit is {_N}", 2),
    # Azure gpt-5 deployments: "Input tokens exceed the configured limit of 272000 tokens".
    _rule("configured_input_limit", rf"input tokens exceed the configured limit of {_N}", 1),
    _rule("max_prompt_length", rf"maximum prompt length is {_N}", 1),  # xAI
    _rule("n_maximum_context_length", rf"{_N} maximum context length", 1),
    # Moonshot: "Your request exceeded model token limit: N", "model max length exceeded, max length:N".
    _rule("moonshot_token_limit", rf"exceeded model token limit: {_N}", 1),
    _rule("moonshot_max_length", rf"model max length exceeded, max length: ?{_N}", 1, True),  # counts max_tokens
    # Alibaba DashScope (Qwen): "Range of input length should be [1, N]".
    _rule("dashscope_input_range", rf"range of input length should be \[1, ?{_N}\]", 1),
    # Chitu, and an unnamed OpenAI-compatible service: "... cannot be greater / must be less than max_seq_len (N)".
    _rule(
        "max_seq_len",
        rf"(?:prompt length|prompt_tokens) ?\({_N}\) (?:cannot be greater|must be less) than max_seq_len ?\({_N}\)",
        2,
    ),
    # The same families without a number, and phrasings that never state one.
    _rule("prompt_too_long", r"prompt is too long"),
    _rule("exceeds_max_tokens_allowed", r"exceeds the maximum number of tokens allowed"),
    _rule("context_size", r"exceeds the available context size"),
    _rule("context_window", r"exceeds? the (model's )?context window|context window (is )?exceeded"),
    _rule("input_exceeds_context_length", r"input length exceeds the context length"),
    _rule("does_not_fit_context", r"does not fit in (the )?context"),
    _rule("longer_than_context", r"longer than the model's (maximum )?context length"),
    _rule("max_context_limit", r"model's maximum context (limit|length)"),
    _rule("context_length_exceeded_words", r"maximum context length has been exceeded"),
    _rule("input_too_long", r"input is too long for (the )?requested model"),
    _rule("reduce_messages", r"reduce the length of the messages"),
    _rule("vllm_prompt_longer", r"prompt \(length \d[\d,]*\) is longer than"),  # an elided vLLM sentence
    _rule("lmstudio_tokens_to_keep", r"tokens to keep from the initial prompt is greater than the context length"),
    _rule("cohere_size_limit", r"too many tokens: size limit exceeded by"),  # not bare "too many tokens"
    _rule("prompt_exceeds_max_length", r"prompt exceeds max(imum)? (context )?length"),  # Zhipu, mlx-serve
    # Implicit overflow: vLLM computes max_tokens = window - prompt when the client sends none, and rejects
    # the negative result. A client's own max_tokens of 0 reads "got 0", which is not this.
    _rule("vllm_negative_max_tokens", r"max_tokens must be at least 1, got -\d+"),
)
_OVERFLOW_CODES = frozenset(
    {
        "context_length_exceeded",
        "context_window_exceeded",
        "exceed_context_size_error",
        "model_max_prompt_tokens_exceeded",
    }
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
    ``prompt is too long: N tokens > M maximum`` -> M, ...), or None when it states none."""
    for rule in _OVERFLOW_TEXT:
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
        if code in _LOOKALIKE_CODES:
            return _LOOKALIKE_CODES[code]
    joined = "\n".join([*facts.messages, *facts.asides, text])
    for reason, pattern in _LOOKALIKE_TEXT:
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
        for rule in _OVERFLOW_TEXT:
            if found := rule.pattern.search(candidate):
                limit = int(found.group(rule.limit_group).replace(",", "")) if rule.limit_group else facts.limit_field
                # OpenAI-style messages say "... in the completion" when max_tokens was counted.
                said_output = rule.name == "max_context_length" and bool(_OUTPUT_WORDS.search(candidate))
                message = facts.messages[0] if candidate is text and facts.messages else candidate
                return OverflowMatch(message, limit, rule.counts_output or said_output, rule.name)
    matched_codes = facts.codes & _OVERFLOW_CODES
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
