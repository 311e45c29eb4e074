"""Capabilities and deferred tools: absent before promotion, offered from the next call on."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contributors.capabilities import FIND_TOOLS_SCHEMA, DeferredToolPolicy, factory, promoted_names, tool_name
from proxy.context.registry import FactorySource, OptionsInvalid, configure
from tests.builtin_state import derive_state


def tool(name: str, description: str = "") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {}}}


CLIENT_TOOLS = [
    tool("run_python", "Run Python code"),
    tool("mcp__db__query", "Run a SQL query against the lab database"),
    tool("mcp__db__schema", "Describe database tables"),
    tool("mcp__plot__render", "Render a chart"),
]
POLICY = DeferredToolPolicy(["mcp__*"])


def names(tools: list[Any]) -> list[str]:
    return [tool_name(t) for t in tools]


def test_deferred_tools_are_hidden_until_promoted_order_kept() -> None:
    assert POLICY.is_deferred("mcp__db__query") and not POLICY.is_deferred(CLIENT_TOOLS[0])
    assert names(POLICY.visible_tools(CLIENT_TOOLS, set())) == ["run_python"]
    visible = POLICY.visible_tools(CLIENT_TOOLS, {"mcp__plot__render", "mcp__db__query"})
    assert names(visible) == ["run_python", "mcp__db__query", "mcp__plot__render"]


def test_a_promoted_name_the_client_does_not_declare_is_never_offered() -> None:
    assert names(POLICY.visible_tools(CLIENT_TOOLS, {"mcp__gone__tool"})) == ["run_python"]


def test_find_tools_promotes_matches_by_name_and_description() -> None:
    text, newly = POLICY.run_find_tools({"query": "database"}, CLIENT_TOOLS, set())
    body = json.loads(text)
    assert newly == ["mcp__db__query", "mcp__db__schema"]
    assert body["promoted"] == newly
    assert {t["name"] for t in body["tools"]} == set(newly)
    # Asked again after promotion: nothing new, the result still names them.
    _, again = POLICY.run_find_tools(json.dumps({"query": "database"}), CLIENT_TOOLS, set(newly))
    assert again == []


def test_find_tools_never_promotes_a_tool_that_is_not_deferred() -> None:
    text, newly = POLICY.run_find_tools({"query": "python"}, CLIENT_TOOLS, set())
    assert newly == [] and json.loads(text)["promoted"] == []
    assert "mcp__plot__render" in json.loads(text)["note"]


@pytest.mark.parametrize("arguments", [{}, {"query": "  "}, "not json", {"query": 3}])
def test_find_tools_bad_arguments_are_an_error_text(arguments: Any) -> None:
    text, newly = POLICY.run_find_tools(arguments, CLIENT_TOOLS, set())
    assert text.startswith("Error:") and newly == []


def test_deferred_tool_absent_before_promotion_present_in_the_next_call() -> None:
    """The run-state round trip: the find_tools result in the history promotes for the next call."""
    offered = [*POLICY.visible_tools(CLIENT_TOOLS, set()), FIND_TOOLS_SCHEMA]
    assert "mcp__db__query" not in names(offered)
    text, _ = POLICY.run_find_tools({"query": "sql"}, CLIENT_TOOLS, set())
    call = {"id": "f1", "type": "function", "function": {"name": "find_tools", "arguments": '{"query": "sql"}'}}
    history = [
        {"role": "user", "content": "count the samples"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "f1", "content": text},
    ]
    promoted = promoted_names(derive_state(history))
    assert "mcp__db__query" in names(POLICY.visible_tools(CLIENT_TOOLS, promoted))
    assert "mcp__db__schema" not in names(POLICY.visible_tools(CLIENT_TOOLS, promoted))


def test_a_deferred_tool_the_model_already_called_stays_offered() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "mcp__plot__render", "arguments": "{}"}}
    history = [{"role": "assistant", "content": None, "tool_calls": [call]}]
    assert "mcp__plot__render" in promoted_names(derive_state(history))


async def test_section_lists_offered_tools_and_notes_promoted_ones(collect) -> None:
    offered = [*POLICY.visible_tools(CLIENT_TOOLS, {"mcp__db__query"}), FIND_TOOLS_SCHEMA]
    collection = await collect(tools=offered, options={"capabilities": {"deferred": ["mcp__*"]}})
    (section,) = [s for s in collection.sections if s.id == "capabilities"]
    assert not section.protected
    assert "Tools offered in this call: find_tools, mcp__db__query, run_python." in section.text
    assert "Loaded on demand earlier in this run: mcp__db__query." in section.text
    assert "find_tools(query)" in section.text
    assert "mcp__db__schema" not in section.text


async def test_section_is_stable_for_the_same_offer_in_any_order(collect) -> None:
    first = await collect(tools=CLIENT_TOOLS)
    second = await collect(tools=list(reversed(CLIENT_TOOLS)))
    assert first.sections == second.sections
    assert "find_tools" not in next(s.text for s in first.sections if s.id == "capabilities")


def test_deferred_option_must_be_a_list() -> None:
    with pytest.raises(OptionsInvalid, match=r"contributors\.capabilities\.deferred"):
        configure([FactorySource(factory, "test")], {"capabilities": {"deferred": "mcp__*"}})
