"""The report renders issue 18's goals and the levers section, from a synthetic report (nothing is run).

A quick or full bench run feeds ``render_markdown`` the same shapes; these tests pin how each goal is
judged (met, missed, n/a when too few samples) and how a lever that is missing or broken is shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.history_cost import session_plan, warm_histories
from bench.levers_part import EXPECTED, discover, validate
from bench.report import goals, render_markdown

MACHINE = {"cpu": "x", "cores": 2, "platform": "p", "python": "3", "litellm": "1", "commit": "c"}


def _history_row(n: int, p50: float, p99: float, warm: int) -> dict[str, Any]:
    return {
        "messages": n,
        "request_bytes": n * 2500,
        "direct_ms": 1.0,
        "direct_p99_ms": 1.5,
        "cold_requests": 5,
        "warm_requests": warm,
        "warm_messages_max": n,
        "added_cold_ms": p50 * 2,
        "added_cold_p95_ms": p50 * 2.2,
        "added_cold_p99_ms": p50 * 2.5,
        "added_warm_ms": p50,
        "added_warm_p95_ms": p50 * 1.2,
        "added_warm_p99_ms": p99,
        "added_warm_us_per_message": p50 * 1000 / n,
    }


def _report(warm: int) -> dict[str, Any]:
    paths = {
        "direct": {"p50_ms": 1.0, "p95_ms": 1.2, "rps": 700.0, "added_p50_ms": 0.0, "added_p95_ms": 0.0},
        "legacy": {"p50_ms": 4.0, "p95_ms": 5.0, "rps": 250.0, "added_p50_ms": 3.0, "added_p95_ms": 3.8},
        "dynamic": {"p50_ms": 5.0, "p95_ms": 6.0, "rps": 210.0, "added_p50_ms": 4.0, "added_p95_ms": 4.8},
        "litellm-proxy": {"p50_ms": 11.0, "p95_ms": 14.0, "rps": 100.0, "added_p50_ms": 10.0, "added_p95_ms": 12.8},
    }
    rows = [
        _history_row(1000, 12.0, 20.0, warm),  # 12 ms: met; p99 20 <= 24: met
        _history_row(5000, 70.0, 300.0, warm),  # exponent log(70/12)/log(5) = 1.10: missed; p99 300 > 140: missed
    ]
    return {
        "date": "2026-01-01T00:00:00+00:00",
        "quick": False,
        "seconds": 1.0,
        "machine": MACHINE,
        "parts": {
            "overhead": {
                "requests_per_repeat": 10,
                "throughput_requests": 20,
                "concurrency": 16,
                "repeats": 1,
                "paths": paths,
                "ratios": {"dynamic_added_p50_vs_litellm": 0.4, "dynamic_rps_vs_litellm": 2.1},
            },
            "history_cost": {
                "repeats": 5,
                "warm_requests": warm,
                "rows": rows,
                "scaling": [{"from": 1000, "to": 5000, "exponent_cold": 1.1, "exponent_warm": 1.1}],
                "stages": [{"messages": 1000, "cold_ms": 3.0, "warm_ms": 1.0}],
            },
            "levers": {
                "levers": [
                    validate({"lever": "orjson parse/encode", "before_ms": 4.0, "after_ms": 1.0, "what": "parse"}),
                    {"lever": "gc.freeze after start-up", "status": "not measured", "why": "not there yet"},
                    {"lever": "begin_turn", "status": "failed", "why": "exit 1: boom"},
                ]
            },
        },
    }


def test_issue_18_goals_are_judged_from_the_same_run() -> None:
    judged = {goal: (ok, measured) for goal, ok, measured in goals(_report(warm=30))}
    assert judged["dynamic added p50 <= 0.5x the litellm proxy's (small request)"] == (
        True,
        "ours/litellm = 0.40 (4.00 vs 10.00 ms)",
    )
    assert judged["dynamic throughput >= 2x the litellm proxy's (concurrency 16)"][0] is True
    assert judged["<= 15 ms added at 1,000 messages warm"] == (True, "12.0 ms (p50)")
    assert judged["warm growth 1,000 -> 5,000 messages linear or better (exponent <= 1.05)"] == (
        False,
        "exponent 1.10",
    )
    tail = "warm p99 <= 2x p50 at {} messages (>= 30 warm requests)"
    assert judged[tail.format("1,000")] == (True, "p99 20.0 / p50 12.0 ms over 30 requests")
    assert judged[tail.format("5,000")][0] is False
    # The goals the issue supersedes are gone.
    assert not any("20 ms" in goal or "below the litellm" in goal for goal in judged)


def test_tail_goal_is_not_judged_on_fewer_than_30_warm_requests() -> None:
    judged = {goal: (ok, measured) for goal, ok, measured in goals(_report(warm=10))}
    ok, measured = judged["warm p99 <= 2x p50 at 1,000 messages (>= 30 warm requests)"]
    assert ok is None and measured.endswith("(too few to judge)")


def test_report_renders_tails_and_every_lever_line() -> None:
    markdown = render_markdown(_report(warm=30))
    assert "| 1,000 | 2,441 | 1.0 | 5 | 24.0 / 30.0 | 30 | 12.0 / 14.4 / 20.0 | 12.0 |" in markdown
    assert "| warm growth 1,000 -> 5,000 messages linear or better (exponent <= 1.05) | MISSED |" in markdown
    assert "## 7. Levers (issue 18)" in markdown
    assert "| orjson parse/encode | 4.000 | 1.000 | 3.000 (75%) | parse |" in markdown
    assert "| gc.freeze after start-up | not measured | | | not there yet |" in markdown
    assert "| begin_turn | failed | | | exit 1: boom |" in markdown


def test_lever_results_must_fit_the_interface() -> None:
    with pytest.raises(ValueError, match="must return a dict"):
        validate({"lever": "x", "before_ms": 1.0})
    with pytest.raises(ValueError, match="non-negative numbers"):
        validate({"lever": "x", "before_ms": "fast", "after_ms": 1.0, "what": "w"})
    assert validate({"lever": "x", "before_ms": 2, "after_ms": 0.5, "what": "w"})["saved_ms"] == 1.5


def test_discovery_lists_missing_levers_and_finds_new_ones(tmp_path: Path) -> None:
    (tmp_path / "levers.py").write_text("def orjson_lever():\n    return {}\n\ndef helper():\n    pass\n")
    extra = "async def streaming_lever():\n    return {}\n\ndef _lever(name):\n    return {}\n"
    (tmp_path / "levers_extra.py").write_text(extra)  # ``_lever``: a private helper, not a lever
    found = {(module, function): exists for module, function, exists in discover(tmp_path)}
    assert found[("bench.levers", "orjson_lever")] is True
    assert found[("bench.levers", "gc_freeze_lever")] is False
    assert found[("bench.levers_store", "begin_turn_lever")] is False
    assert found[("bench.levers_extra", "streaming_lever")] is True
    assert set(EXPECTED) <= set(found) and ("bench.levers", "helper") not in found
    assert ("bench.levers_extra", "_lever") not in found


def test_warm_plan_reaches_the_sample_count_with_few_cold_requests() -> None:
    assert session_plan(10, 30, 5) == (30, 1)  # small: one warm request per new session
    sessions, steps = session_plan(5000, 30, 5)
    assert sessions >= 5 and sessions * steps >= 30 and 2 * (steps - 1) <= 5000 // 100
    chain = warm_histories([{"role": "user", "content": "go"}], 3)
    assert [len(h) for h in chain] == [1, 3, 5] and chain[2][-1]["role"] == "user"
