"""The general rules on their own, before any look-alike is ruled out: what they read, and what they do not."""

from __future__ import annotations

import pytest

from proxy.provider.overflow_clause import overflow_clause, stated_window


def test_the_output_named_alone_before_the_excess_is_not_an_overflow() -> None:
    assert overflow_clause("max_tokens (10000) cannot exceed the 8192 tokens the prompt leaves") is None


def test_the_input_and_the_output_exceeding_together_is_one_that_counts_the_output() -> None:
    clause = overflow_clause("input length and max_tokens exceed the window of 8192 tokens")
    assert clause is not None and clause.counts_output and clause.rule == "general_excess"


def test_the_clause_is_the_sentence_that_says_it() -> None:
    clause = overflow_clause("Request rejected. The input is too long for this deployment. See the docs.")
    assert clause is not None and clause.sentence == "The input is too long for this deployment"


def test_a_decimal_point_does_not_end_a_sentence() -> None:
    # Split at "9351." the sentence would lose its subject ("prompt") and the rule would not fire.
    clause = overflow_clause("the prompt of 9351.5 thousand tokens exceeds the limit")
    assert clause is not None and clause.sentence.startswith("the prompt")


@pytest.mark.parametrize(
    ("text", "window"),
    [
        ("maximum sequence length for this model (5000 > 4096)", 4096),
        ("The maximum context length of some-model-v2 is 32768.", 32768),
        ("exceeds the maximum number of tokens allowed 1048576.", 1048576),
        ("Max input length is 2048 tokens", 2048),
        ("too long to fit into the model (context length 4096)", 4096),
        ("should not exceed max_num_tokens (8192)", 8192),
        ("n_ctx: 7424", 7424),
        ("but the model only supports up to 131072", 131072),
        ("the limit is 40000 tokens", 40000),
        ("input length (265330) exceeds the context", None),  # a count the request holds, not the window
        ("exceeds limit (2013)", None),  # a bare number after "limit" is an error code as often as a window
        ("max_tokens (10000) cannot exceed 8192", None),  # the output cap is not the window
    ],
)
def test_stated_window(text: str, window: int | None) -> None:
    assert stated_window(text) == window
