"""Delegation projection: delegated tasks as data for the main agent only."""

from __future__ import annotations

from tests.builtin_state import derive_state


async def test_main_sees_delegations_subagent_does_not(collect, tool_step) -> None:
    history = [{"role": "user", "content": "survey"}, *tool_step("d1", "spawn_subagent", {"task": "papers"}, "sub-7")]
    state = derive_state(history)
    main = await collect(history=history, state=state)
    (message,) = [m for m in main.messages if m.id == "delegation.state"]
    assert 'spawn_subagent (call d1) arguments={"task":"papers"} -> "sub-7"' in message.content
    subagent = await collect("subagent", history=history, state=state)
    assert "delegation.state" not in [m.id for m in subagent.messages]


async def test_operator_tool_names_feed_the_channel(collect, tool_step) -> None:
    history = [*tool_step("h1", "handoff", {"to": "stats"}, "ok"), *tool_step("d1", "delegate", {"x": 1}, "ok")]
    collection = await collect(history=history, options={"delegation": {"tools": ["handoff"]}})
    (message,) = [m for m in collection.messages if m.id == "delegation.state"]
    assert "handoff" in message.content and "delegate (call" not in message.content


async def test_failed_delegation_is_not_recorded(collect, tool_step) -> None:
    history = tool_step("d1", "delegate", {"task": "x"}, "Error: no capacity")
    collection = await collect(history=history)
    assert "delegation.state" not in [m.id for m in collection.messages]
