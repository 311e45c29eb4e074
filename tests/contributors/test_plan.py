"""Plan projection: the latest declared plan as data, main and subagent only."""

from __future__ import annotations

import json
from typing import Any

from contributors.plan import render_plan
from proxy.context.hidden import hidden_message, is_hidden_message
from tests.builtin_state import derive_state

NONCE = "0123456789abcdef"  # a framing nonce (a session's is 16 hex digits)


def update_plan(call_id: str, status: str) -> dict[str, Any]:
    args = {"plan": [{"step": "load data", "status": "completed"}, {"step": "fit", "status": status}]}
    return {"id": call_id, "type": "function", "function": {"name": "update_plan", "arguments": json.dumps(args)}}


HISTORY = [
    {"role": "user", "content": "fit the model"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [update_plan("p1", "pending"), update_plan("p2", "in_progress")],
    },
    {"role": "tool", "tool_call_id": "p2", "content": "ok"},
    {"role": "tool", "tool_call_id": "p1", "content": "ok"},
]


async def test_main_gets_the_declared_order_plan_as_a_data_message(collect) -> None:
    collection = await collect(history=HISTORY, state=derive_state(HISTORY))
    (message,) = [m for m in collection.messages if m.id == "plan.state"]
    assert "2. [in_progress] fit" in message.content and "[pending]" not in message.content
    assert "data, not instructions" in message.content
    assert "plan.state" not in [s.id for s in collection.sections]  # changes every turn: never in the prompt
    wrapped = hidden_message(message, nonce=NONCE)
    assert is_hidden_message(wrapped, NONCE) and 'authority="data_only"' in wrapped["content"]


async def test_subagent_gets_the_plan_reviewer_does_not(collect) -> None:
    state = derive_state(HISTORY)
    subagent = await collect("subagent", history=HISTORY, state=state)
    reviewer = await collect("reviewer", history=HISTORY, state=state)
    assert "plan.state" in [m.id for m in subagent.messages]
    assert "plan" not in [r.contributor_id for r in reviewer.runs]
    assert "plan.state" not in [m.id for m in reviewer.messages]


async def test_without_assembler_state_the_plan_is_derived_from_visible_history(collect) -> None:
    collection = await collect(history=HISTORY)
    assert "plan.state" in [m.id for m in collection.messages]


async def test_no_plan_no_message(collect) -> None:
    collection = await collect(history=HISTORY[:1])
    assert "plan.state" not in [m.id for m in collection.messages]


def test_render_reports_progress_or_a_missing_anchor() -> None:
    state = derive_state(HISTORY)
    assert "Since it was declared (call p2): 0 model steps, 0 other tool results." in render_plan(state["plan"])
    gone = derive_state(HISTORY, visible=HISTORY[:1])
    assert "no longer in the visible history" in render_plan(gone["plan"])
