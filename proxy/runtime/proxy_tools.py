"""The toolbox: the proxy-owned tools of this proxy, offered beside the client's, run here, never seen
by the client.

``read_tool_output`` is the core tool, always there: it reads stored tool bodies back (the store
answers only for the session's own references). Every other tool is a contribution: a loaded
contributor factory offers it (``contributors/skills.py``: ``read_skill``; ``contributors/capabilities.py``:
``find_tools``; a third-party package: its own), so the allow-list ``CONTEXT_PROXY_CONTRIBUTORS``
governs them and this module names none of them.

A client tool of the same name wins: a contributed tool is then not offered at all (DESIGN.md). The
reader cannot step aside like that, because previews and checkpoints tell the model to call it; it is
offered under another name instead (``context_read_tool_output``, or with a number when the client has
that too), chosen from the client's tool list alone, so it is the same on every call of the session and
the prefix stays byte-stable. The model's calls of that name run here; its calls of the client's
``read_tool_output`` go to the client like any client call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.context.previews import READ_TOOL_OUTPUT
from proxy.context.tool_output_reader import READ_TOOL_OUTPUT_SCHEMA, read_tool_output
from proxy.context.types import ClientToolGate, ProxyTool, ToolContext, tool_name
from proxy.session.store import SessionStore, SkillRef

# Session-wide values a tool keeps (``ToolSession.put``) live in the store's state channels under this
# prefix, at the chain hash ``""`` that every branch of the session reads as its root.
_TOOL_STATE_PREFIX = "tool."
_SESSION_WIDE = ""


class _SessionOutputs:
    """The store's tool bodies of one session, as the reader's ``ToolOutputSource``."""

    def __init__(self, store: SessionStore, context_id: str) -> None:
        self._store = store
        self._context_id = context_id

    async def get(self, ref: str) -> str | None:
        return await self._store.tool_output(self._context_id, ref)


@dataclass(frozen=True)
class ReadToolOutput:
    """``read_tool_output``: offered in every session that works with tools, from its first call (see
    ``ProxyToolbox.offered``), so the tool list does not change when compaction first leaves a preview."""

    store: SessionStore
    name: str = READ_TOOL_OUTPUT
    schema: Mapping[str, Any] = field(default_factory=lambda: READ_TOOL_OUTPUT_SCHEMA)
    needs_references: bool = True

    def offered(self, context: ToolContext) -> bool:
        """Always: the toolbox offers it where the session works with tools (``needs_references``)."""
        return True

    async def run(self, context: ToolContext, arguments: str) -> str:
        """The stored body, or the part of it asked for."""
        return await read_tool_output(_SessionOutputs(self.store, context.context_id), arguments)


class StoreToolSession:
    """A proxy tool's durable session records, in the session store: revision references in the
    ``skill_refs`` table (written at the request's head), other values session-wide."""

    def __init__(self, store: SessionStore, context_id: str, head_hash: str) -> None:
        self._store = store
        self._context_id = context_id
        self._head_hash = head_hash

    async def revisions(self) -> Mapping[str, str]:
        """Name -> the revision the session first read it at."""
        first: dict[str, str] = {}
        for ref in await self._store.skill_refs(self._context_id):
            first.setdefault(ref.name, ref.revision)
        return first

    async def record_revision(self, name: str, revision: str) -> None:
        """Record a read of ``name`` at ``revision``."""
        await self._store.put_skill_ref(self._context_id, SkillRef(name, revision, self._head_hash))

    async def get(self, key: str) -> Any | None:
        """The value kept under ``key``, or ``None``."""
        return await self._store.state(self._context_id, _SESSION_WIDE, _TOOL_STATE_PREFIX + key)

    async def put(self, key: str, value: Any) -> None:
        """Keep ``value`` under ``key`` for the session."""
        await self._store.put_state(self._context_id, _SESSION_WIDE, _TOOL_STATE_PREFIX + key, value)


class ProxyToolbox:
    """The proxy-owned tools of this proxy: the core reader plus the loaded contributors' tools. A client
    tool of the same name always keeps its name."""

    def __init__(self, reader: ReadToolOutput, contributed: Sequence[ProxyTool] = ()) -> None:
        self._reader = reader
        self._tools: dict[str, ProxyTool] = {reader.name: reader, **{tool.name: tool for tool in contributed}}
        # Found once: an isinstance check against a runtime-checkable protocol costs microseconds per tool and turn.
        self._gates = [tool for tool in self._tools.values() if isinstance(tool, ClientToolGate)]

    @property
    def reader(self) -> ReadToolOutput:
        """The core ``read_tool_output``."""
        return self._reader

    def withheld(self, context: ToolContext) -> frozenset[str]:
        """Client tools a proxy tool keeps out of this call's offer (deferred tools not yet promoted)."""
        names: set[str] = set()
        for gate in self._gates:
            names |= gate.withheld(context)
        return frozenset(names)

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
            elif tool is self._reader:
                names[name] = _free_name(f"context_{name}", taken)
                taken.add(names[name])
        return names

    def offered(self, context: ToolContext) -> list[ProxyTool]:
        """The proxy tools to offer for this call, under their session names, in a stable order. A tool that
        reads references back is offered only where there can be references: in a session that works with
        tools, from its first call on (its tool list then stays what it was when compaction begins)."""
        with_tools = _works_with_tools(context)
        return [
            tool
            for tool in self.session_tools(context.client_tools).values()
            if tool.offered(context) and (with_tools or not tool.needs_references)
        ]

    async def run(self, context: ToolContext, call: Mapping[str, Any]) -> str:
        """Run one tool call of the model (by its session name); every failure is a result text the model
        can read."""
        function = call.get("function") or {}
        tool = self.session_tools(context.client_tools).get(str(function.get("name")))
        if tool is None:
            return f"error: {function.get('name')!r} is not a proxy-owned tool"
        arguments = function.get("arguments")
        return await tool.run(context, arguments if isinstance(arguments, str) else "{}")


def _works_with_tools(context: ToolContext) -> bool:
    """Whether the session can have tool outputs: the client declares tools, or its history has a result."""
    return bool(context.client_tools) or any(message.get("role") == "tool" for message in context.history)


def _free_name(base: str, taken: set[str]) -> str:
    """``base``, else ``base_2``, ``base_3``... : the first that no tool of the session has."""
    if base not in taken:
        return base
    number = 2
    while f"{base}_{number}" in taken:
        number += 1
    return f"{base}_{number}"


def _named(tool: ProxyTool, name: str) -> ProxyTool:
    """``tool`` as offered under ``name`` (itself when the name is its own; only the reader is renamed)."""
    if name == tool.name or not isinstance(tool, ReadToolOutput):
        return tool
    return replace(tool, name=name, schema={**tool.schema, "function": {**tool.schema["function"], "name": name}})
