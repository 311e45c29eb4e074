"""Artifact projection: written artifacts as bounded data, in every scope."""

from __future__ import annotations

import pytest

from proxy.context.registry import OptionsInvalid
from tests.builtin_state import derive_state


@pytest.mark.parametrize("scope", ["main", "subagent", "reviewer"])
async def test_every_scope_sees_artifacts(collect, tool_step, scope) -> None:
    history = tool_step("w1", "write_artifact", {"path": "fig1.png", "content": "x" * 3000}, "saved")
    collection = await collect(scope, history=history, state=derive_state(history))
    (message,) = [m for m in collection.messages if m.id == "artifact.state"]
    assert "fig1.png" in message.content and "+2600 chars" in message.content
    assert len(message.content) < 1000


async def test_an_invalid_tools_option_is_refused_at_composition_naming_the_field(collect) -> None:
    with pytest.raises(OptionsInvalid, match=r"contributors\.artifact\.tools: Input should be a valid list"):
        await collect(options={"artifact": {"tools": "write_artifact"}})
    with pytest.raises(OptionsInvalid, match=r"contributors\.artifact\.tools: List should have at least 1 item"):
        await collect(options={"artifact": {"tools": []}})
