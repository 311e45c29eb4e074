"""Artifact projection: written artifacts as bounded data, in every scope."""

from __future__ import annotations

import pytest

from proxy.context.state import derive_state


@pytest.mark.parametrize("scope", ["main", "subagent", "reviewer"])
async def test_every_scope_sees_artifacts(collect, tool_step, scope) -> None:
    history = tool_step("w1", "write_artifact", {"path": "fig1.png", "content": "x" * 3000}, "saved")
    collection = await collect(scope, history=history, state=derive_state(history))
    (message,) = [m for m in collection.messages if m.id == "artifact.state"]
    assert "fig1.png" in message.content and "+2600 chars" in message.content
    assert len(message.content) < 1000


async def test_invalid_tools_option_fails_only_this_contributor(collect, tool_step) -> None:
    history = tool_step("w1", "write_artifact", {"path": "a"}, "saved")
    collection = await collect(history=history, options={"artifact": {"tools": "write_artifact"}})
    (run,) = [r for r in collection.runs if r.contributor_id == "artifact"]
    assert run.status == "error" and "contributors.artifact.tools" in run.error
    assert "artifact.state" not in [m.id for m in collection.messages]
