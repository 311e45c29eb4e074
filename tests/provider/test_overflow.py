"""The overflow normalizer on every real provider error we collected, positives and look-alikes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.provider.overflow import (
    OverflowHints,
    detect_overflow,
    lookalike_reason,
    parse_error_body,
    provider_message,
    stated_limit,
)

ENTRIES: list[dict[str, Any]] = json.loads((Path(__file__).parent / "data" / "overflow_errors.json").read_text("utf-8"))

# The window each positive entry states, by index (None: the provider states none).
# Entry 20 (llama.cpp, older wording) states no number in its text; the window comes from its
# machine-readable ``n_ctx`` field instead, so its message-level stated limit is None.
EXPECTED_LIMIT: dict[int, int | None] = {
    0: 4097, 1: 4097, 2: 4097, 3: None, 4: 8192, 5: 200000, 6: 200000, 7: 200000, 8: 131072, 9: 1048576,
    10: 65536, 11: None, 12: 4097, 13: 131072, 14: 131072, 15: 262000, 16: 16384, 17: 131072, 18: None,
    19: 8192, 20: 8192, 21: 30000, 22: 2048, 23: 65537, 24: 2048, 25: 128000,
}  # fmt: skip
FROM_BODY_FIELD = {20}
# Overflows counted against input + requested output: lowering max_tokens alone may fix them.
COUNTS_OUTPUT = {1, 2, 6, 12, 13, 14, 15, 16, 17, 23, 24}
EXPECTED_LOOKALIKE = {26: "rate_limit", 27: "rate_limit", 28: "output_cap", 29: "content_filter", 30: "request_size",
                      31: "request_size"}  # fmt: skip


def _id(index: int) -> str:
    entry = ENTRIES[index]
    provider = entry["provider"].split(" (")[0].replace(" ", "_")
    return f"{index:02d}-{provider}-{'overflow' if entry['is_overflow'] else 'not'}"


def test_dataset_is_the_one_we_cover() -> None:
    assert len(ENTRIES) == 32
    assert {i for i, e in enumerate(ENTRIES) if e["is_overflow"]} == set(EXPECTED_LIMIT)
    assert {i for i, e in enumerate(ENTRIES) if not e["is_overflow"]} == set(EXPECTED_LOOKALIKE)


@pytest.mark.parametrize("index", range(len(ENTRIES)), ids=_id)
def test_every_entry_is_classified(index: int) -> None:
    entry = ENTRIES[index]
    match = detect_overflow(entry["status"], entry["body"], "")
    assert (match is not None) is entry["is_overflow"], entry["notes"]
    if match is None:
        assert lookalike_reason(entry["status"], entry["body"]) == EXPECTED_LOOKALIKE[index]
        return
    assert match.limit == EXPECTED_LIMIT[index]
    assert match.counts_output is (index in COUNTS_OUTPUT)
    assert match.message and "{" not in match.message  # the provider's words, not a JSON dump
    message = provider_message(entry["body"])
    assert message is not None
    assert stated_limit(message) == (None if index in FROM_BODY_FIELD else EXPECTED_LIMIT[index])


@pytest.mark.parametrize("index", range(len(ENTRIES)), ids=_id)
def test_every_entry_as_raw_text_with_unknown_status(index: int) -> None:
    """What arrives when a client library hands over only the raw body text and no status."""
    entry = ENTRIES[index]
    raw = entry["body"] if isinstance(entry["body"], str) else json.dumps(entry["body"])
    match = detect_overflow(None, raw, "")
    assert (match is not None) is entry["is_overflow"]
    assert match is None or match.limit == EXPECTED_LIMIT[index]


@pytest.mark.parametrize("index", range(len(ENTRIES)), ids=_id)
def test_every_entry_quoted_in_an_exception_message(index: int) -> None:
    """litellm often keeps only ``str(exc)``, which quotes the provider's message after its prefixes."""
    entry = ENTRIES[index]
    message = provider_message(entry["body"])
    text = f"litellm.BadRequestError: OpenAIException - {message}"
    match = detect_overflow(entry["status"], None, text)
    assert (match is not None) is entry["is_overflow"]


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("This model's maximum context length is 128,000 tokens.", 128000),
        ("Prompt contains 40000 tokens, too large for model with 32768 maximum context length", 32768),
        ("This model's maximum prompt length is 131072 but the request contains 140000 tokens.", 131072),
        ("Please reduce the length of the messages or completion. Current length is 9000 while limit is 8192", 8192),
        ("prompt tokens (300000) exceed model maximum (262144)", 262144),
        ("max_tokens: 128001 > 64000, which is the maximum allowed number of output tokens", None),
        ("", None),
    ],
)
def test_stated_limit_phrasings(text: str, limit: int | None) -> None:
    assert stated_limit(text) == limit


def test_a_rate_limit_status_is_never_an_overflow_even_with_overflow_words() -> None:
    body = {"error": {"message": "This model's maximum context length is 4097 tokens.", "code": None}}
    assert detect_overflow(400, body) is not None
    assert detect_overflow(429, body) is None


def test_code_alone_is_enough_when_the_text_is_generic() -> None:
    match = detect_overflow(400, {"error": {"message": "Bad request.", "code": "context_length_exceeded"}})
    assert match is not None
    assert match.rule == "code:context_length_exceeded"
    assert match.message == "Bad request."


def test_unrelated_errors_are_not_overflows() -> None:
    assert detect_overflow(400, {"error": {"message": "Invalid value for 'temperature'."}}) is None
    assert detect_overflow(500, "Internal Server Error") is None
    assert detect_overflow(None, None, "") is None


def test_parse_error_body_shapes() -> None:
    assert parse_error_body(b'{"error": "x"}') == {"error": "x"}
    assert parse_error_body('event: error\ndata: {"message": "m"}\n\n') == {"message": "m"}
    assert parse_error_body("plain words") == "plain words"
    assert parse_error_body("  ") is None


def test_a_deeply_nested_body_does_not_recurse_forever() -> None:
    body: Any = {"message": "prompt is too long: 5 tokens > 4 maximum"}
    for _ in range(5000):
        body = {"error": body}
    assert detect_overflow(400, body) is None  # too deep to read, and nothing crashed


# The general rules, on sentences written for these tests (not provider bodies: those are in the corpora).
# Each names the input side, an excess and a measure, or states two counts, in words no phrasing table holds.
@pytest.mark.parametrize(
    ("text", "rule", "limit"),
    [
        ("Your conversation is too long for this model.", "general_excess", None),
        ("The prompt does not fit: the model takes 16384 tokens at most.", "general_excess", None),
        ("Input exceeds the token budget of the deployment (max_input_len 8192).", "general_excess", 8192),
        ("messages are longer than the maximum sequence length (4096)", "general_excess", 4096),
        ("request size in tokens (9000) is greater than the model limit", "general_excess", None),
        ("prompt_tokens must be less than max_model_len (32768)", "general_excess", 32768),
        ("Token limit has been exceeded for this model", "general_capacity_exceeded", None),
        ("max tokens of 200000 exceeded", "general_capacity_exceeded", 200000),
        ("The request holds 70000 tokens; the context window is 65536.", "general_comparison", 65536),
        ("History uses 9000 tokens but the model only supports up to 8192.", "general_comparison", 8192),
        ("Rejected. Please shorten the prompt to fit the context length.", "general_advice", None),
    ],
)
def test_general_rules_read_phrasings_no_table_holds(text: str, rule: str, limit: int | None) -> None:
    match = detect_overflow(400, {"error": {"message": text}})
    assert match is not None and (match.rule, match.limit) == (rule, limit)


@pytest.mark.parametrize(
    "text",
    [
        "max_tokens (10000) cannot exceed 8192",  # the output is what is too large
        "Too many messages in the conversation: the limit is 100",  # too many of something not counted in tokens
        "messages.4.name: too long, at most 64 characters",  # a path into the request, not the conversation
        "Input validation error: `best_of` must be less than the maximum of 2",  # the error's kind, not the input
        "Bad request: size of the seed exceeds 2^32",  # an HTTP reason phrase, not the request
        "The prompt is 900 tokens and the context window is 8192.",  # two counts, the first the smaller
    ],
)
def test_general_rules_need_the_input_to_be_what_is_too_much(text: str) -> None:
    assert detect_overflow(400, {"error": {"message": text}}) is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Too many tokens, please wait before trying again.", "rate_limit"),
        ("input tokens per day exceeded for this key", "rate_limit"),
        ("insufficient balance (1008): the request exceeds your remaining credits", "quota"),
        ("max_completion_tokens is too large: 300000. The input is small.", "output_cap"),
        ("Invalid 'tools[2].function.name': the tool name exceeds 64 characters", "parameter_length"),
        ("Request payload of 9000000 bytes exceeds the 4 MB maximum for the input", "request_size"),
        (  # Anthropic's thinking budget rule; its documentation link names the context window
            "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at "
            "https://docs.claude.com/en/docs/build-with-claude/extended-thinking#max-tokens-and-context-window-size",
            "output_cap",
        ),
    ],
)
def test_lookalikes_that_share_the_words_are_refused_and_named(text: str, reason: str) -> None:
    body = {"error": {"message": text}}
    assert detect_overflow(400, body) is None
    assert lookalike_reason(400, body) == reason


def test_an_output_cap_does_not_hide_an_overflow_the_same_body_states() -> None:
    """vLLM: "'max_tokens' ... is too large" is an output cap unless the body also states the window it overflowed."""
    cap = {"error": {"message": "'max_tokens' or 'max_completion_tokens' is too large: 64000."}}
    assert detect_overflow(400, cap) is None and lookalike_reason(400, cap) == "output_cap"
    both = {"error": {"message": cap["error"]["message"] + " This model's maximum context length is 64001 tokens."}}
    assert detect_overflow(400, both) is not None and lookalike_reason(400, both) is None


def test_a_phrasing_without_a_number_takes_the_window_stated_in_other_words() -> None:
    match = detect_overflow(400, "The input token count exceeds the maximum number of tokens allowed 1048576.")
    assert match is not None and match.rule == "exceeds_max_tokens_allowed" and match.limit == 1048576


@pytest.mark.parametrize(
    "text",
    [
        "invalid params, context window exceeds limit (2013)",  # an error code in parentheses, not a window
        "Prompt length (1240) is longer than allowed",  # what the request holds, not what the model takes
        "too many tokens: size limit exceeded by 1502 tokens",  # the excess, not the window
    ],
)
def test_numbers_that_are_not_the_window_are_not_stated_as_one(text: str) -> None:
    match = detect_overflow(400, {"error": {"message": text}})
    assert match is not None and match.limit is None


# Weak words: they point at the window without saying it overflowed.
WEAK = {"error": {"code": 500, "message": "failed to find free space in the KV cache", "type": "server_error"}}


def test_weak_words_alone_are_not_an_overflow() -> None:
    assert detect_overflow(500, WEAK) is None


def test_weak_words_in_a_5xx_from_a_local_server_are_an_overflow() -> None:
    match = detect_overflow(500, WEAK, hints=OverflowHints(local=True))
    assert match is not None and match.rule == "weak_words_near_window" and match.limit is None


@pytest.mark.parametrize(
    ("status", "hints", "overflow"),
    [
        (400, OverflowHints(local=True), False),  # a local 4xx says what it means; weak words do not decide
        (500, OverflowHints(local=False), False),  # a hosted provider's 500 is its own trouble
        (500, OverflowHints(local=True, fill=0.4), False),  # far from the window: not the window
        (400, OverflowHints(fill=0.95), True),  # at the window, whoever answers
        (429, OverflowHints(local=True, fill=0.99), False),  # a rate limit stays one
    ],
)
def test_hints_decide_only_weak_words(status: int, hints: OverflowHints, overflow: bool) -> None:
    assert (detect_overflow(status, WEAK, hints=hints) is not None) is overflow


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"code": 500, "message": "Invalid input batch.", "type": "server_error"}},  # no weak words
        {"type": "error", "error": {"type": "api_error", "message": "insufficient balance (1008) for context"}},
    ],
)
def test_a_local_5xx_without_weak_words_or_with_a_lookalike_is_not_an_overflow(body: Any) -> None:
    assert detect_overflow(500, body, hints=OverflowHints(local=True, fill=0.99)) is None
