"""Proxy-owned tool names: the reader steps aside under another name, the others give way entirely."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contributors.capabilities import DeferredToolPolicy, FindTools
from contributors.skills import ReadSkill, SkillShelf
from proxy.context.types import ToolContext
from proxy.runtime.proxy_tools import ProxyToolbox, ReadToolOutput
from proxy.session.sqlite import SqliteSessionStore


def client_tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def toolbox(tmp_path: Path) -> ProxyToolbox:
    skill = tmp_path / "skills" / "xrd"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: xrd\ndescription: Refine XRD data.\n---\nIndex the peaks.\n")
    return ProxyToolbox(
        ReadToolOutput(SqliteSessionStore(tmp_path / "unused.sqlite3")),
        [FindTools(DeferredToolPolicy(["mcp__*"])), ReadSkill(SkillShelf(), str(tmp_path / "skills"), None)],
    )


def test_without_a_clash_every_tool_keeps_its_name(tmp_path: Path) -> None:
    names = toolbox(tmp_path).session_tools([client_tool("measure")])
    assert list(names) == ["find_tools", "read_skill", "read_tool_output"]
    assert names["read_tool_output"].schema["function"]["name"] == "read_tool_output"


def test_a_client_read_tool_output_renames_the_proxys_reader_deterministically(tmp_path: Path) -> None:
    box = toolbox(tmp_path)
    clients = [client_tool("read_tool_output"), client_tool("measure")]
    named = box.session_tools(clients)
    assert list(named) == ["find_tools", "read_skill", "context_read_tool_output"]
    assert named["context_read_tool_output"].schema["function"]["name"] == "context_read_tool_output"
    assert box.session_name("read_tool_output", clients) == "context_read_tool_output"
    assert box.session_name("read_tool_output", list(reversed(clients))) == "context_read_tool_output"
    # The alias is taken too: the next free one, never a client's name.
    crowded = [*clients, client_tool("context_read_tool_output")]
    assert box.session_name("read_tool_output", crowded) == "context_read_tool_output_2"


def test_read_skill_and_find_tools_give_way_to_client_tools_of_their_name(tmp_path: Path) -> None:
    box = toolbox(tmp_path)
    clients = [client_tool("read_skill"), client_tool("find_tools")]
    assert list(box.session_tools(clients)) == ["read_tool_output"]
    assert box.session_name("read_skill", clients) is None


async def test_a_call_runs_by_its_session_name_only(tmp_path: Path) -> None:
    box = toolbox(tmp_path)
    clients = [client_tool("read_skill")]
    context = ToolContext("s", [], clients, {})

    def call(name: str) -> dict[str, Any]:
        return {"id": "c", "function": {"name": name, "arguments": json.dumps({"name": "xrd"})}}

    assert (await box.run(context, call("read_skill"))) == "error: 'read_skill' is not a proxy-owned tool"
    assert "Index the peaks." in await box.run(ToolContext("s", [], [], {}), call("read_skill"))


def test_deferred_client_tools_are_withheld_until_promoted(tmp_path: Path) -> None:
    box = toolbox(tmp_path)
    clients = [client_tool("mcp__db__query"), client_tool("measure")]
    assert box.withheld(ToolContext("s", [], clients, {})) == {"mcp__db__query"}
    promoted = {"tools": {"promoted": ["mcp__db__query"], "called": []}}
    assert box.withheld(ToolContext("s", [], clients, promoted)) == frozenset()
