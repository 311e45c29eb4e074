"""The validator: every problem of the final input, listed, before the provider is called."""

from typing import Any

import pytest

from proxy.context.composer import ComposedContext, DefaultContextMessageComposer
from proxy.context.estimators import ConservativeTokenEstimator
from proxy.context.types import ContextMessage
from proxy.context.validator import ContextValidator
from proxy.errors import AssemblyFailed

EST = ConservativeTokenEstimator()
VALIDATOR = ContextValidator()
CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {}}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "r"}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def composed(*messages: dict[str, Any], hidden: tuple[int, ...] = ()) -> ComposedContext:
    return ComposedContext(tuple(messages), hidden, ())


def test_valid_input_returns_its_estimate() -> None:
    good = DefaultContextMessageComposer().compose(
        "prompt", [{"role": "user", "content": "t"}, CALL, RESULT], [ContextMessage("p.s", "x", "plan")]
    )
    total = VALIDATOR.validate(good, limit_tokens=10_000, estimator=EST, tools=TOOLS)
    assert total == sum(EST.count_message(m) for m in good.messages) + EST.count_tools(TOOLS)


@pytest.mark.parametrize(
    ("messages", "hidden", "problem"),
    [
        ((), (), "no messages"),
        (({"role": "robot", "content": "x"}, {"role": "user", "content": "u"}), (), "invalid role 'robot'"),
        (({"role": "assistant", "content": "x"},), (), "no user message"),
        (({"role": "user", "content": "u"}, RESULT), (), "no matching call"),
        (({"role": "user", "content": "u"}, CALL), (), "unfinished call cannot be sent"),
        (({"role": "user", "content": "u"}, CALL, {"role": "user", "content": "x"}), (), "have no results"),
        (({"role": "user", "content": "u", "tool_calls": []},), (), "invalid tool_calls"),
        (({"role": "user", "content": "u"}, {"role": "assistant", "content": "forged"}), (1,), "not a plain user"),
        (({"role": "user", "content": "u"}, {"role": "user", "content": "<context>x</context>"}), (1,), "malformed"),
        (({"role": "user", "content": "u"},), (3,), "out of range"),
    ],
)
def test_problems_are_reported(messages: tuple[dict[str, Any], ...], hidden: tuple[int, ...], problem: str) -> None:
    with pytest.raises(AssemblyFailed, match="invalid model input") as info:
        VALIDATOR.validate(composed(*messages, hidden=hidden), limit_tokens=10_000, estimator=EST)
    assert problem in info.value.message


def test_over_the_limit_and_all_problems_at_once() -> None:
    bad = composed({"role": "user", "content": "word " * 100}, RESULT)
    with pytest.raises(AssemblyFailed) as info:
        VALIDATOR.validate(bad, limit_tokens=10, estimator=EST)
    assert "over the limit of 10" in info.value.message and "no matching call" in info.value.message
