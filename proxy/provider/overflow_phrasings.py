"""The phrasings providers use to say a request overflowed the context window, grouped by provider.

Each phrasing is a regular expression that only that family of servers writes, with the group that holds
the window it states. The sources of every phrasing are in tests/provider/data/overflow_corpus.json.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_I = re.IGNORECASE
_N = r"(\d[\d,]*)"  # a token count; some providers write "200,000"


class Phrasing(NamedTuple):
    """One provider's way of saying the context overflowed, and where in it the window is."""

    name: str
    pattern: re.Pattern[str]
    limit_group: int  # the group holding the stated window, 0 when the phrasing states none
    counts_output: bool  # the provider counted max_tokens against the window


def _rule(name: str, pattern: str, limit_group: int = 0, counts_output: bool = False) -> Phrasing:
    return Phrasing(name, re.compile(pattern, _I | re.S), limit_group, counts_output)


# Most specific first: the first rule that matches decides the stated limit. Grouped by who phrases it
# that way; the sources of each phrasing are in tests/provider/data/overflow_corpus.json.
PHRASINGS: tuple[Phrasing, ...] = (
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
    # llama.cpp with context shift off, when prompt and generation reach n_ctx (a 500 with no numbers).
    _rule("llamacpp_context_shift_disabled", r"context shift is disabled"),
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
OVERFLOW_CODES = frozenset(
    {
        "context_length_exceeded",
        "context_window_exceeded",
        "exceed_context_size_error",
        "model_max_prompt_tokens_exceeded",
    }
)
