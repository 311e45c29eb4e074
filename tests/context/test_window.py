"""AtomicHistoryWindowPolicy: protocol-valid, within the limit, whole units, anchor and latest step kept."""

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.context.estimators import CachingEstimator, ConservativeTokenEstimator
from proxy.context.shortfall import ContextDoesNotFit, Shortfall
from proxy.context.window import AtomicHistoryWindowPolicy
from proxy.kernel.errors import AssemblyFailed

EST = CachingEstimator(ConservativeTokenEstimator())
WINDOW = AtomicHistoryWindowPolicy()

ZH = "蛋白质结构预测实验结果表明该方法在多个基准数据集上取得了显著提升温度压力溶剂效应"
EN = ["protein", "structure", "yield", "catalyst", "we", "observe", "p=0.03", "Table", "2", "{", "}", '"k":']
body = st.one_of(
    st.lists(st.sampled_from(EN), min_size=1, max_size=30).map(" ".join),
    st.text(st.sampled_from(ZH), min_size=1, max_size=60),
    st.tuples(st.sampled_from(EN), st.integers(50, 3000)).map(lambda t: (t[0] + " 数据 ") * (t[1] // 8)),
)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def call(ids: list[str]) -> dict[str, Any]:
    calls = [{"id": i, "type": "function", "function": {"name": "run", "arguments": f'{{"q": "{i}"}}'}} for i in ids]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if draw(st.booleans()):
        out.append({"role": "system", "content": "client system prompt"})
    out.append(user(draw(body)))
    counter = 0
    for kind in draw(st.lists(st.sampled_from(["user", "assistant", "tools"]), max_size=25)):
        if kind == "user":
            out.append(user(draw(body)))
        elif kind == "assistant":
            out.append(assistant(draw(body)))
        else:
            ids = [f"call_{counter + k}" for k in range(draw(st.integers(1, 3)))]
            counter += len(ids)
            out.append(call(ids))
            order = draw(st.permutations(ids))  # parallel results may come back in any order
            out.extend(result(i, draw(body)) for i in order)
    return out


def protocol_problems(messages: list[dict[str, Any]]) -> list[str]:
    """An independent checker: every call answered right after it; no result without its call."""
    problems, pending = [], set()
    for i, m in enumerate(messages):
        if m["role"] == "tool":
            if m["tool_call_id"] not in pending:
                problems.append(f"orphan result at {i}")
            pending.discard(m["tool_call_id"])
            continue
        if pending:
            problems.append(f"unanswered calls before {i}")
        pending = {c["id"] for c in m.get("tool_calls") or []}
    if pending:
        problems.append("unanswered calls at the end")
    return problems


def cost(messages: list[dict[str, Any]]) -> int:
    return sum(EST.count_message(m) for m in messages)


def last_assistant(history: list[dict[str, Any]]) -> int:
    return max((i for i, m in enumerate(history) if m["role"] == "assistant"), default=len(history) - 1)


@settings(max_examples=60, deadline=None)
@given(histories(), st.integers(20, 6000))
def test_window_invariants(history: list[dict[str, Any]], limit: int) -> None:
    anchor = next(i for i, m in enumerate(history) if m["role"] == "user")
    latest = last_assistant(history)
    must = sorted({anchor, *range(latest, len(history))} | {i for i, m in enumerate(history) if m["role"] == "system"})
    try:
        out = WINDOW.apply(history, limit_tokens=limit, estimator=EST)
    except AssemblyFailed:
        assert cost([history[i] for i in must]) > limit  # fails only when the minimum cannot fit
        return
    messages = list(out.messages)
    assert protocol_problems(messages) == []
    assert cost(messages) <= limit
    assert out.statistics.kept_tokens == cost(messages)
    kept = list(out.kept_indices)
    assert kept == sorted(kept) and messages == [history[i] for i in kept]
    assert set(must) <= set(kept)  # anchor (verbatim) and latest step always kept
    # Oldest first: past the anchor, what stays is a contiguous suffix.
    after_anchor = [i for i in kept if i > anchor]
    if after_anchor:
        assert after_anchor == list(range(after_anchor[0], len(history)))
    # Whole units: a kept call keeps all its results, a kept result keeps its call.
    for i in kept:
        for c in history[i].get("tool_calls") or []:
            assert any(history[j].get("tool_call_id") == c["id"] for j in kept)


@settings(max_examples=30, deadline=None)
@given(histories())
def test_everything_kept_when_it_fits(history: list[dict[str, Any]]) -> None:
    out = WINDOW.apply(history, limit_tokens=10**7, estimator=EST)
    assert list(out.messages) == history and out.statistics.dropped_messages == 0


@settings(max_examples=30, deadline=None)
@given(histories())
def test_a_checkpoint_goes_right_after_the_anchor_whether_or_not_anything_is_dropped(
    history: list[dict[str, Any]],
) -> None:
    checkpoint = user("<checkpoint>completed: the early steps</checkpoint>")
    anchor = next(i for i, m in enumerate(history) if m["role"] == "user")
    everything = WINDOW.apply(history, limit_tokens=10**7, estimator=EST, checkpoint=checkpoint)
    assert list(everything.messages) == [*history[: anchor + 1], checkpoint, *history[anchor + 1 :]]
    assert list(everything.kept_indices) == list(range(len(history)))
    minimum = cost([*history[: anchor + 1], checkpoint, *history[last_assistant(history) :]])
    try:
        tight = WINDOW.apply(history, limit_tokens=minimum + 1, estimator=EST, checkpoint=checkpoint)
    except AssemblyFailed:
        return  # unfinished calls or pinned messages past the minimum: nothing to compare
    kept = list(tight.kept_indices)
    position = sum(1 for i in kept if i <= anchor)  # the checkpoint follows the anchor's unit
    assert list(tight.messages) == [
        *(history[i] for i in kept[:position]),
        checkpoint,
        *(history[i] for i in kept[position:]),
    ]


def test_drops_oldest_units_and_keeps_checkpoint_after_anchor() -> None:
    history = [user("task: analyse the spectra"), assistant("old " * 300), call(["c1", "c2"])]
    history += [result("c2", "two " * 300), result("c1", "one " * 300), assistant("recent"), user("go on")]
    checkpoint = user("<checkpoint>completed: spectra 1-3</checkpoint>")
    minimum = cost([history[0], checkpoint, *history[5:]])
    out = WINDOW.apply(history, limit_tokens=minimum + 5, estimator=EST, checkpoint=checkpoint)
    assert list(out.messages) == [history[0], checkpoint, history[5], history[6]]
    assert out.statistics.dropped_units == 2 and out.statistics.dropped_messages == 4
    assert out.statistics.latest_step_index == 5 and out.statistics.anchor_index == 0
    assert [d.code for d in out.diagnostics] == ["history_dropped"]


def test_fails_before_the_provider_when_the_minimum_does_not_fit() -> None:
    history = [user("task " * 500), call(["c1"]), result("c1", "ok")]
    with pytest.raises(ContextDoesNotFit, match="task anchor, checkpoint, latest step") as info:
        WINDOW.apply(history, limit_tokens=100, estimator=EST)
    # The numbers the pipeline explains the failure with: what the minimum needs, what was left.
    assert info.value.shortfall == Shortfall("history", cost(history), 100)
    assert f"needs {cost(history)} tokens, over the 100 left for history" in info.value.message


def test_latest_step_keeps_its_calls_and_results_and_what_follows() -> None:
    history = [user("task"), assistant("a " * 200), call(["c1", "c2"]), result("c1", "x " * 100), result("c2", "y")]
    history.append(user("and then?"))
    out = WINDOW.apply(history, limit_tokens=cost([history[0], *history[2:]]), estimator=EST)
    assert list(out.messages) == [history[0], *history[2:]]


def test_orphan_results_are_dropped_with_an_error() -> None:
    history = [user("task"), result("nobody", "stray"), assistant("fine")]
    out = WINDOW.apply(history, limit_tokens=10_000, estimator=EST)
    assert list(out.messages) == [history[0], history[2]]
    assert [d.code for d in out.diagnostics] == ["orphan_tool_result"]


def test_unfinished_calls_are_never_dropped_and_reported() -> None:
    history = [user("task"), call(["c1", "c2"]), result("c1", "only one"), user("x " * 200), assistant("y")]
    out = WINDOW.apply(history, limit_tokens=cost(history[:3] + history[4:]) + 1, estimator=EST)
    assert list(out.messages) == [*history[:3], history[4]]
    assert out.statistics.unfinished_call_ids == ("c2",)


def test_no_budget_left() -> None:
    with pytest.raises(ContextDoesNotFit, match=r"needs \d+ tokens, but none \(0\) is left for history") as info:
        WINDOW.apply([user("x")], limit_tokens=0, estimator=EST)
    assert info.value.shortfall == Shortfall("history", cost([user("x")]), 0)
