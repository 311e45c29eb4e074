"""Proxy-owned tools: offered to the model beside the client's, run here, never seen by the client.

``read_tool_output`` reads stored tool bodies back (the store answers only for the session's own
references); ``read_skill`` returns a skill body once, with its revision; ``find_tools`` promotes
deferred client tools. Each is a schema, a rule for when it is offered, and an async runner.

A client tool of the same name wins: ``read_skill`` and ``find_tools`` are then not offered at all
(DESIGN.md). The reader cannot step aside like that, because previews and checkpoints tell the model to
call it; it is offered under another name instead (``context_read_tool_output``, or with a number when
the client has that too), chosen from the client's tool list alone, so it is the same on every call of
the session and the prefix stays byte-stable. The model's calls of that name run here; its calls of
the client's ``read_tool_output`` go to the client like any client call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from contributors.capabilities import FIND_TOOLS, FIND_TOOLS_SCHEMA, DeferredToolPolicy, promoted_names, tool_name
from contributors.skills import READ_SKILL, READ_SKILL_SCHEMA, SkillLibrary
from proxy.context.previews import READ_TOOL_OUTPUT
from proxy.context.state import SKILLS
from proxy.context.tool_output_reader import READ_TOOL_OUTPUT_SCHEMA, read_tool_output
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
    # On a name clash with a client tool: True offers this one under another name, False leaves the
    # client's alone and offers none.
    renamed_on_clash: bool = False


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

    return ProxyTool(
        READ_TOOL_OUTPUT, READ_TOOL_OUTPUT_SCHEMA, run, offer_when, needs_references=True, renamed_on_clash=True
    )


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
    """The proxy-owned tools of this proxy. A client tool of the same name always keeps its name."""

    def __init__(self, tools: Sequence[ProxyTool]) -> None:
        self._tools = {tool.name: tool for tool in tools}

    def session_tools(self, client_tools: Sequence[Mapping[str, Any]]) -> dict[str, ProxyTool]:
        """Every proxy tool a session with these client tools may be offered, by the name it has there
        (offered or not yet), in a stable order."""
        return {alias: _named(self._tools[name], alias) for name, alias in self._session_names(client_tools).items()}

    def session_name(self, name: str, client_tools: Sequence[Mapping[str, Any]]) -> str | None:
        """The name the proxy tool ``name`` has in a session with these client tools (``None``: none)."""
        return self._session_names(client_tools).get(name)

    def _session_names(self, client_tools: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        """Own name -> session name, for each tool not displaced by a client tool."""
        client_names = {tool_name(tool) for tool in client_tools}
        taken = client_names | set(self._tools)
        names: dict[str, str] = {}
        for name, tool in sorted(self._tools.items()):
            if name not in client_names:
                names[name] = name
            elif tool.renamed_on_clash:
                names[name] = _free_name(f"context_{name}", taken)
                taken.add(names[name])
        return names

    def offered(self, context: ToolContext) -> list[ProxyTool]:
        """The proxy tools to offer for this call, under their session names, in a stable order."""
        return [tool for tool in self.session_tools(context.client_tools).values() if tool.offer_when(context)]

    async def run(self, context: ToolContext, call: Mapping[str, Any]) -> str:
        """Run one tool call of the model (by its session name); every failure is a result text the model
        can read."""
        function = call.get("function") or {}
        tool = self.session_tools(context.client_tools).get(str(function.get("name")))
        if tool is None:
            return f"error: {function.get('name')!r} is not a proxy-owned tool"
        arguments = function.get("arguments")
        return await tool.run(context, arguments if isinstance(arguments, str) else "{}")


def _free_name(base: str, taken: set[str]) -> str:
    """``base``, else ``base_2``, ``base_3``... : the first that no tool of the session has."""
    if base not in taken:
        return base
    number = 2
    while f"{base}_{number}" in taken:
        number += 1
    return f"{base}_{number}"


def _named(tool: ProxyTool, name: str) -> ProxyTool:
    """``tool`` as offered under ``name`` (itself when the name is its own)."""
    if name == tool.name:
        return tool
    return replace(tool, name=name, schema={**tool.schema, "function": {**tool.schema["function"], "name": name}})
