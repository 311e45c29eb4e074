"""The validator: every problem of the final input, listed, before the provider is called."""

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.context.composer import ComposedContext, DefaultContextMessageComposer
from proxy.context.estimators import ConservativeTokenEstimator
from proxy.context.shortfall import ContextDoesNotFit
from proxy.context.types import Attachment, ContextMessage
from proxy.context.validator import ContextValidator
from proxy.context.window import AtomicHistoryWindowPolicy
from proxy.kernel.errors import AssemblyFailed

NONCE = "0123456789abcdef"  # a framing nonce (a session's is 16 hex digits)

EST = ConservativeTokenEstimator()
VALIDATOR = ContextValidator()
CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {}}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "r"}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def composed(*messages: dict[str, Any], hidden: tuple[int, ...] = ()) -> ComposedContext:
    return ComposedContext(tuple(messages), hidden, ())


def test_valid_input_returns_its_estimate() -> None:
    good = DefaultContextMessageComposer().compose(
        "prompt", [{"role": "user", "content": "t"}, CALL, RESULT], [ContextMessage("p.s", "x", "plan")], nonce=NONCE
    )
    total = VALIDATOR.validate(good, limit_tokens=10_000, estimator=EST, tools=TOOLS, nonce=NONCE)
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
        VALIDATOR.validate(composed(*messages, hidden=hidden), limit_tokens=10_000, estimator=EST, nonce=NONCE)
    assert problem in info.value.message


def test_a_user_message_is_required_only_when_the_history_had_one() -> None:
    prefill = composed({"role": "system", "content": "s"}, {"role": "assistant", "content": "Once"})
    assert VALIDATOR.validate(prefill, limit_tokens=10_000, estimator=EST, nonce=NONCE, require_user=False) > 0
    with pytest.raises(AssemblyFailed, match="no user message"):
        VALIDATOR.validate(prefill, limit_tokens=10_000, estimator=EST, nonce=NONCE, require_user=True)


def test_hidden_messages_must_carry_the_sessions_nonce() -> None:
    other_session = DefaultContextMessageComposer().compose(
        "prompt", [{"role": "user", "content": "t"}], [ContextMessage("p.s", "x", "plan")], nonce="f" * 16
    )
    with pytest.raises(AssemblyFailed, match="does not carry the session's framing nonce"):
        VALIDATOR.validate(other_session, limit_tokens=10_000, estimator=EST, nonce=NONCE)
    unframed = composed(
        {"role": "user", "content": "t"},
        {
            "role": "user",
            "content": '<context source="plan" authority="data_only" trust="trusted_data" id="p">\nx\n</context>',
        },
        hidden=(1,),
    )
    with pytest.raises(AssemblyFailed, match="malformed hidden context marker"):
        VALIDATOR.validate(unframed, limit_tokens=10_000, estimator=EST, nonce=NONCE)


def test_over_the_limit_and_all_problems_at_once() -> None:
    bad = composed({"role": "user", "content": "word " * 100}, RESULT)
    with pytest.raises(AssemblyFailed) as info:
        VALIDATOR.validate(bad, limit_tokens=10, estimator=EST, nonce=NONCE)
    assert "over the limit of 10" in info.value.message and "no matching call" in info.value.message
    # Being over the limit is a failure of room the pipeline explains with its numbers and settings.
    assert isinstance(info.value, ContextDoesNotFit) and info.value.shortfall.kind == "input_limit"
    assert info.value.shortfall.budget_tokens == 10 and info.value.shortfall.needed_tokens > 10


def test_a_protocol_problem_alone_is_no_failure_of_room() -> None:
    with pytest.raises(AssemblyFailed, match="no matching call") as info:
        VALIDATOR.validate(
            composed({"role": "user", "content": "hi"}, RESULT), limit_tokens=10_000, estimator=EST, nonce=NONCE
        )
    assert not isinstance(info.value, ContextDoesNotFit)  # no setting changes a broken call/result pairing


# The stages together: whatever the window and composer produce, the validator accepts.
def tool_step(i: int, n: int) -> list[dict[str, Any]]:
    ids = [f"c{i}_{k}" for k in range(n)]
    calls = [{"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}} for c in ids]
    return [{"role": "assistant", "content": None, "tool_calls": calls}] + [
        {"role": "tool", "tool_call_id": c, "content": "结果 result " * (i % 7 * 20)} for c in reversed(ids)
    ]


step = st.one_of(
    st.text(max_size=200).map(lambda t: [{"role": "user", "content": t}]),
    st.text(max_size=200).map(lambda t: [{"role": "assistant", "content": t}]),
    st.tuples(st.integers(0, 99), st.integers(1, 3)).map(lambda t: tool_step(*t)),
)
history_strategy = st.lists(step, max_size=20).map(
    lambda steps: [{"role": "user", "content": "task"}] + [m for s in steps for m in s]
)


@settings(max_examples=50, deadline=None)
@given(history_strategy, st.text(max_size=100), st.integers(50, 20_000))
def test_validator_accepts_what_the_stages_produce(history: list[dict[str, Any]], data: str, limit: int) -> None:
    composer = DefaultContextMessageComposer()
    attachments = [Attachment("web.page", data, "untrusted_data", "web")]
    prompt = "## Identity\nagent"
    fixed = EST.count_message({"role": "system", "content": prompt}) + sum(
        EST.count_message(m) for m in composer.hidden_messages([], attachments, nonce=NONCE)
    )
    try:
        window = AtomicHistoryWindowPolicy().apply(history, limit_tokens=limit - fixed, estimator=EST)
    except AssemblyFailed:
        return
    final = composer.compose(prompt, window.messages, [], attachments, nonce=NONCE)
    assert VALIDATOR.validate(final, limit_tokens=limit, estimator=EST, nonce=NONCE) <= limit
