"""Review projection: reviews as data for the main agent and the reviewer, not subagents."""

from __future__ import annotations

from tests.builtin_state import derive_state


async def test_review_scopes(collect, tool_step) -> None:
    history = tool_step("v1", "submit_review", {"verdict": "revise", "notes": "units"}, "recorded")
    state = derive_state(history)
    for scope, expected in (("main", True), ("reviewer", True), ("subagent", False)):
        collection = await collect(scope, history=history, state=state)
        assert ("review.state" in [m.id for m in collection.messages]) is expected, scope


async def test_review_entry_text(collect, tool_step) -> None:
    history = tool_step("v1", "request_review", {"artifact": "fig1.png"}, "review r-1 requested")
    collection = await collect("reviewer", history=history)
    (message,) = [m for m in collection.messages if m.id == "review.state"]
    assert message.content.endswith(
        'request_review (call v1) arguments={"artifact":"fig1.png"} -> "review r-1 requested"'
    )
