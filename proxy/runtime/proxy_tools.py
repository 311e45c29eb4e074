"""Proxy-owned tools: offered to the model beside the client's, run here, never seen by the client.

``read_tool_output`` reads stored tool bodies back (the store answers only for the session's own
references); ``read_skill`` returns a skill body once, with its revision; ``find_tools`` promotes
deferred client tools. Each is a schema, a rule for when it is offered, and an async runner.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contributors.capabilities import FIND_TOOLS, FIND_TOOLS_SCHEMA, DeferredToolPolicy, promoted_names, tool_name
from contributors.skills import READ_SKILL, READ_SKILL_SCHEMA, SkillLibrary
from proxy.context.state import SKILLS
from proxy.context.tool_output_reader import READ_TOOL_OUTPUT, READ_TOOL_OUTPUT_SCHEMA, read_tool_output
from proxy.session.store import SessionStore


@dataclass(frozen=True)
class ToolContext:
    """What a proxy tool may look at: the session, its canonical history, the client's tools, run state."""

    context_id: str
    history: Sequence[Mapping[str, Any]]
    client_tools: Sequence[Mapping[str, Any]]
    state: Mapping[str, Any]


@dataclass(frozen=True)
class ProxyTool:
    """A tool the proxy offers and runs itself."""

    name: str
    schema: Mapping[str, Any]
    run: Callable[[ToolContext, str], Awaitable[str]]  # (context, raw JSON arguments) -> result text
    offer_when: Callable[[ToolContext], bool]
    needs_references: bool = False  # offered only once compaction left a preview or a checkpoint


class _SessionOutputs:
    """The store's tool bodies of one session, as the reader's ``ToolOutputSource``."""

    def __init__(self, store: SessionStore, context_id: str) -> None:
        self._store = store
        self._context_id = context_id

    async def get(self, ref: str) -> str | None:
        return await self._store.tool_output(self._context_id, ref)


def read_tool_output_tool(store: SessionStore) -> ProxyTool:
    """``read_tool_output``: offered once compaction previewed an output or wrote a checkpoint."""

    async def run(context: ToolContext, arguments: str) -> str:
        return await read_tool_output(_SessionOutputs(store, context.context_id), arguments)

    def offer_when(context: ToolContext) -> bool:
        return any(message.get("role") == "tool" for message in context.history)

    return ProxyTool(READ_TOOL_OUTPUT, READ_TOOL_OUTPUT_SCHEMA, run, offer_when, needs_references=True)


def read_skill_tool(library: SkillLibrary, select: Sequence[str] | None) -> ProxyTool:
    """``read_skill``: a skill body once, headed with its revision; a repeat read while the body is still
    in context gets a pointer instead, so a body never appears twice in one request."""

    async def run(context: ToolContext, arguments: str) -> str:
        loaded = {ref["name"]: ref["revision"] for ref in context.state.get(SKILLS) or () if ref.get("visible")}
        return library.run_read_skill(arguments, loaded=loaded, select=select)

    def offer_when(context: ToolContext) -> bool:
        return bool(library.names())

    return ProxyTool(READ_SKILL, READ_SKILL_SCHEMA, run, offer_when)


def find_tools_tool(policy: DeferredToolPolicy) -> ProxyTool:
    """``find_tools``: a search over the deferred client tools; what it finds is offered from the next call."""

    async def run(context: ToolContext, arguments: str) -> str:
        text, _ = policy.run_find_tools(arguments, context.client_tools, promoted_names(context.state))
        return text

    def offer_when(context: ToolContext) -> bool:
        return bool(policy.hidden_tools(context.client_tools, promoted_names(context.state)))

    return ProxyTool(FIND_TOOLS, FIND_TOOLS_SCHEMA, run, offer_when)


class ProxyToolbox:
    """The proxy-owned tools of this proxy. A client tool of the same name always wins."""

    def __init__(self, tools: Sequence[ProxyTool]) -> None:
        self._tools = {tool.name: tool for tool in tools}

    def offered(self, context: ToolContext) -> list[ProxyTool]:
        """The proxy tools to offer for this call, in a stable order."""
        client_names = {tool_name(tool) for tool in context.client_tools}
        return [
            tool for name, tool in sorted(self._tools.items()) if name not in client_names and tool.offer_when(context)
        ]

    async def run(self, context: ToolContext, call: Mapping[str, Any]) -> str:
        """Run one tool call of the model; every failure is a result text the model can read."""
        function = call.get("function") or {}
        tool = self._tools.get(str(function.get("name")))
        if tool is None:
            return f"error: {function.get('name')!r} is not a proxy-owned tool"
        arguments = function.get("arguments")
        return await tool.run(context, arguments if isinstance(arguments, str) else "{}")
