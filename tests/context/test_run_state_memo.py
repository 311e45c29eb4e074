"""``RunStateMemo``: a session's run state folded across turns equals the state derived from scratch,
whatever the turns resend, fork, leave unanswered or do to the values."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.context.state import RunStateMemo, StateConfig
from proxy.context.types import DeclaredCall
from proxy.kernel.canonical import HistoryEntry, chain_hashes
from tests.builtin_state import builtin_config, derive_state
from tests.context.test_state import USER, call, plan, result, step

STATUSES = ("pending", "in_progress", "completed")


def _entries(messages: list[dict[str, Any]]) -> list[HistoryEntry]:
    return [HistoryEntry(m, h) for m, h in zip(messages, chain_hashes(messages), strict=True)]


def _turn(rng: random.Random, number: int) -> list[dict[str, Any]]:
    """One agent step: an assistant message with a few calls (plan updates, skills, other tools) and
    their results in any order (some failing), or a plain exchange."""
    if rng.random() < 0.2:
        return [{"role": "assistant", "content": f"thinking {number}"}, {"role": "user", "content": "go on"}]
    calls = []
    for k in range(rng.randint(1, 3)):
        call_id = f"c{number}-{k}"
        kind = rng.choice(["update_plan", "load_skill", "find_tools", "run_assay"])
        arguments: Any = (
            plan(*((f"step {i}", rng.choice(STATUSES)) for i in range(rng.randint(1, 3))))
            if kind == "update_plan"
            else {"name": rng.choice(["pcr", "elisa"])}
            if kind == "load_skill"
            else {"query": "measure"}
        )
        calls.append(call(call_id, kind, arguments))
    results = [result(c["id"], rng.choice(["ok", "Error: failed", '{"ok": false}', "done"])) for c in calls]
    rng.shuffle(results)
    return [step(*calls), *results]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), turns=st.integers(1, 12))
def test_folding_turn_after_turn_equals_deriving_from_scratch(seed: int, turns: int) -> None:
    rng, config = random.Random(seed), builtin_config()
    memo = RunStateMemo(config)
    history: list[dict[str, Any]] = [USER]
    for number in range(turns):
        history += _turn(rng, number)
        if rng.random() < 0.15 and len(history) > 3:  # a fork: the session goes on from an earlier point
            history = history[: rng.randint(1, len(history) - 1)] + _turn(rng, 100 + number)
        if rng.random() < 0.25:  # the calls are made before their results come: unanswered, then answered
            pending = _turn(rng, 200 + number)
            unanswered = history + pending[:1]
            assert memo.derive("session", _entries(unanswered)) == derive_state(unanswered, config)
            history += pending
        assert memo.derive("session", _entries(history)) == derive_state(history, config)
        assert memo.derive("session", _entries(history)) == derive_state(history, config)  # the same again


def test_a_kept_fold_is_reused_only_for_the_same_prefix() -> None:
    config, memo = builtin_config(), RunStateMemo(builtin_config())
    first = [USER, step(call("a", "update_plan", plan(("load", "in_progress")))), result("a", "ok")]
    memo.derive("s", _entries(first))
    edited = [USER, step(call("a", "update_plan", plan(("load", "completed")))), result("a", "ok")]
    assert memo.derive("s", _entries([*edited, USER])) == derive_state([*edited, USER], config)
    assert memo.derive("s", _entries(first[:1])) == derive_state(first[:1], config)  # shorter than the fold


class _Appending:
    """A channel that (against the rule) changes its value in place."""

    name = "appending"

    def initial(self) -> Any:
        return {"calls": []}

    def observe(self, value: Any, call: DeclaredCall, result: str | None, diagnose: Callable[[str], None]) -> Any:
        value["calls"].append(call.call_id)
        return value

    def judge(self, value: Any, visible: Any) -> Any:
        value["judged"] = value.get("judged", 0) + 1
        return value


def test_a_channel_that_changes_values_in_place_cannot_change_a_kept_fold() -> None:
    config = StateConfig((_Appending(),))
    memo = RunStateMemo(config)
    history = [USER, step(call("a", "x", {})), result("a", "ok")]
    for number in range(4):
        history += [step(call(f"b{number}", "x", {})), result(f"b{number}", "ok")]
        expected = {"calls": ["a", *(f"b{i}" for i in range(number + 1))], "judged": 1}
        assert memo.derive("s", _entries(history))["appending"] == expected
        assert memo.derive("s", _entries(history))["appending"] == expected  # the kept fold again


def test_the_least_recently_used_sessions_are_dropped_first() -> None:
    memo = RunStateMemo(builtin_config(), max_sessions=2)
    history = [USER, step(call("a", "update_plan", plan(("x", "pending")))), result("a", "ok")]
    for session in ("one", "two", "three"):
        memo.derive(session, _entries(history))
    assert list(memo._last) == ["two", "three"]
