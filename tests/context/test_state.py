"""Run state channels: declared call order, success rule, mid-run fill, plan progress, skill visibility."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contributors.plan import plan_problem, plan_progress
from contributors.projection import RecordChannel
from proxy.context.previews import render_preview
from proxy.context.registry import OptionsInvalid
from proxy.context.state import StateConfig, bounded, is_successful
from tests.builtin_state import builtin_config, derive_state


def call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def step(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def plan(*steps: tuple[str, str], explanation: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"plan": [{"step": s, "status": st} for s, st in steps]}
    if explanation is not None:
        body["explanation"] = explanation
    return body


USER = {"role": "user", "content": "analyse the dataset"}


def test_plan_follows_declared_order_when_results_arrive_out_of_order() -> None:
    first = plan(("load", "in_progress"), ("fit", "pending"))
    second = plan(("load", "completed"), ("fit", "in_progress"))
    history = [
        USER,
        step(call("a", "update_plan", first), call("b", "update_plan", second)),
        result("b", "Plan updated"),  # the second declared call finished first
        result("a", "Plan updated"),
    ]
    state = derive_state(history)
    assert state["plan"]["tool_call_id"] == "b"
    assert state["plan"]["plan"] == second["plan"]
    # The same results in the other arrival order give the same state: arrival order does not matter.
    swapped = [*history[:2], history[3], history[2]]
    assert derive_state(swapped)["plan"] == state["plan"]


def test_record_channel_keeps_declared_order_not_arrival_order() -> None:
    history = [
        USER,
        step(call("m1", "remember", {"key": "first"}), call("m2", "remember", {"key": "second"})),
        result("m2", "ok"),
        result("m1", "ok"),
    ]
    entries = derive_state(history)["memory"]["entries"]
    assert [e["tool_call_id"] for e in entries] == ["m1", "m2"]


def test_failed_and_unfinished_calls_do_not_update_state() -> None:
    good = plan(("collect", "completed"))
    history = [
        USER,
        step(call("a", "update_plan", good)),
        result("a", "ok"),
        step(call("b", "update_plan", plan(("x", "pending"))), call("c", "update_plan", plan(("y", "pending")))),
        result("b", "Error: plan rejected"),
        # c has no result yet: unfinished
    ]
    state = derive_state(history)
    assert state["plan"]["tool_call_id"] == "a"


def test_invalid_plan_is_ignored_with_a_diagnostic_and_the_previous_plan_stays() -> None:
    history = [
        USER,
        step(call("a", "update_plan", plan(("collect", "pending")))),
        result("a", "ok"),
        step(call("b", "update_plan", {"plan": [{"step": "x", "status": "someday"}]})),
        result("b", "ok"),
    ]
    state = derive_state(history)
    assert state["plan"]["tool_call_id"] == "a"
    assert any("b" in d and "someday" in d for d in state["diagnostics"])


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("Plan updated", True),
        ("", True),
        ("Error: no such file", False),
        ("  error running tool", False),
        ('{"error": "denied"}', False),
        ('{"error": null, "value": 1}', True),
        ('{"ok": false}', False),
        ('{"success": false}', False),
        ("{not json", True),
        ("the word error later is fine", True),
    ],
)
def test_success_rule(text: str, ok: bool) -> None:
    assert is_successful(text) is ok


def test_plan_problem_names_the_fault() -> None:
    assert plan_problem(plan(("a", "pending"), explanation="why")) == ""
    assert "non-empty" in plan_problem({"plan": []})
    assert "explanation" in plan_problem({"plan": [{"step": "a", "status": "pending"}], "explanation": 3})
    assert "JSON object" in plan_problem("not json")


def mid_run_history() -> list[dict[str, Any]]:
    """A run a client sends all at once: 80 messages with every kind of state call."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a scientist."}, USER]
    for k in range(13):
        history += [
            step(call(f"r{k}", "run_python", {"code": f"print({k})"})),
            result(f"r{k}", f"{k}"),
            {"role": "assistant", "content": f"step {k} done"},
        ]
    history += [
        step(call("p1", "update_plan", plan(("load", "completed"), ("fit", "in_progress")))),
        result("p1", "ok"),
        step(call("d1", "delegate", {"task": "literature"}), call("s1", "read_skill", {"name": "fitting"})),
        result("s1", '<skill name="fitting" revision="abc123def456">\nUse least squares.\n</skill>'),
        result("d1", "subagent sub-1 started"),
        step(call("w1", "write_artifact", {"path": "fig.png", "content": "x" * 5000})),
        result("w1", "saved fig.png"),
        step(call("v1", "submit_review", {"verdict": "accept"})),
        result("v1", "review recorded"),
        step(call("m1", "remember", {"key": "alpha", "value": 0.05})),
        result("m1", "ok"),
        step(call("f1", "find_tools", {"query": "mcp database"})),
        result("f1", json.dumps({"promoted": ["mcp__db__query"], "tools": []})),
    ]
    while len(history) < 80:
        history.append({"role": "assistant", "content": "thinking"})
    return history


def test_a_session_first_seen_mid_run_fills_every_channel() -> None:
    history = mid_run_history()
    assert len(history) == 80
    state = derive_state(history)
    assert state["plan"]["plan"][1] == {"step": "fit", "status": "in_progress"}
    assert state["delegation"]["entries"][0]["arguments"] == {"task": "literature"}
    assert state["artifact"]["entries"][0]["result"] == "saved fig.png"
    assert state["review"]["entries"][0]["arguments"] == {"verdict": "accept"}
    assert state["memory"]["entries"][0]["arguments"] == {"key": "alpha", "value": 0.05}
    assert state["skills"] == [{"name": "fitting", "revision": "abc123def456", "tool_call_id": "s1", "visible": True}]
    assert state["tools"]["promoted"] == ["mcp__db__query"]
    assert "run_python" in state["tools"]["called"]
    json.dumps(state)  # plain JSON data


def test_large_arguments_are_bounded() -> None:
    state = derive_state(
        mid_run_history(), StateConfig((RecordChannel("artifact", frozenset({"write_artifact"}), value_chars=100),))
    )
    content = state["artifact"]["entries"][0]["arguments"]["content"]
    assert content.startswith("x" * 100) and "+4900 chars" in content
    assert bounded(list(range(30)), 10)[-1] == "… [+10 items]"


def test_record_channels_keep_the_latest_entries_and_count_all() -> None:
    history: list[dict[str, Any]] = [USER]
    for k in range(5):
        history += [step(call(f"m{k}", "remember", {"k": k})), result(f"m{k}", "ok")]
    memory = derive_state(history, StateConfig((RecordChannel("memory", frozenset({"remember"}), max_entries=2),)))[
        "memory"
    ]
    assert memory["total"] == 5
    assert [e["tool_call_id"] for e in memory["entries"]] == ["m3", "m4"]


def test_operator_tool_names_replace_the_defaults() -> None:
    config = builtin_config({"memory": {"tools": ["note"]}})
    history = [
        USER,
        step(call("n1", "note", {"x": 1}), call("r1", "remember", {"x": 2})),
        result("n1", "ok"),
        result("r1", "ok"),
    ]
    entries = derive_state(history, config)["memory"]["entries"]
    assert [e["tool"] for e in entries] == ["note"]
    with pytest.raises(OptionsInvalid, match=r"contributors\.memory\.tools"):
        builtin_config({"memory": {"tools": "note"}})


def test_skill_reference_is_invisible_once_its_result_is_compacted_or_gone() -> None:
    body = "\n".join(["<skill name='x'>"] + [f"line {i}" for i in range(100)])
    text = f'<skill name="fitting" revision="r1">\n{body}\n</skill>'
    history = [USER, step(call("s1", "read_skill", {"name": "fitting"})), result("s1", text)]
    preview = render_preview(text, "to_s1")
    assert preview is not None
    compacted = [*history[:2], result("s1", preview)]
    assert derive_state(history)["skills"][0]["visible"] is True
    assert derive_state(history, visible=compacted)["skills"][0]["visible"] is False
    assert derive_state(history, visible=[USER])["skills"][0]["visible"] is False


def test_a_failed_read_skill_records_no_reference_and_a_later_read_wins() -> None:
    history = [
        USER,
        step(call("s1", "read_skill", {"name": "nope"})),
        result("s1", "Error: unknown skill 'nope'"),
        step(call("s2", "read_skill", {"name": "fit"})),
        result("s2", '<skill name="fit" revision="r1">a</skill>'),
        step(call("s3", "read_skill", {"name": "fit"})),
        result("s3", '<skill name="fit" revision="r2">b</skill>'),
    ]
    skills = derive_state(history)["skills"]
    assert skills == [{"name": "fit", "revision": "r2", "tool_call_id": "s3", "visible": True}]


def test_plan_progress_counts_later_steps_and_non_plan_results() -> None:
    history = [
        USER,
        step(call("p1", "update_plan", plan(("a", "in_progress")))),
        result("p1", "ok"),
        step(call("r1", "run", {}), call("r2", "run", {})),
        result("r1", "1"),
        result("r2", "2"),
        {"role": "assistant", "content": "done"},
    ]
    progress = derive_state(history)["plan"]["progress"]
    assert progress == {"toolCallId": "p1", "anchorFound": True, "laterSteps": 2, "laterToolResults": 2}


def test_plan_progress_without_its_anchor_omits_the_counters() -> None:
    history = [USER, step(call("p1", "update_plan", plan(("a", "pending")))), result("p1", "ok")]
    state = derive_state(history, visible=[USER, {"role": "assistant", "content": "later"}])
    assert state["plan"]["plan"] == [{"step": "a", "status": "pending"}]  # the plan survives compaction
    assert state["plan"]["progress"] == {"toolCallId": "p1", "anchorFound": False}
    assert plan_progress("missing", history) == {"toolCallId": "missing", "anchorFound": False}


def test_a_result_before_its_call_does_not_count() -> None:
    history = [USER, result("p1", "ok"), step(call("p1", "update_plan", plan(("a", "pending"))))]
    assert derive_state(history)["plan"] is None


def test_the_generic_state_names_no_channel_of_its_own_but_diagnostics() -> None:
    history = [USER, step(call("p1", "update_plan", plan(("a", "pending")))), result("p1", "ok")]
    assert StateConfig().channels == ()
    from proxy.context.state import derive_state as bare

    assert bare(history) == {"diagnostics": []}
