"""Proxy-owned tools: offered to the model beside the client's, run here, never seen by the client.

Each tool is a schema plus an async runner bound to one session. ``read_tool_output`` reads stored tool
bodies back (the store answers only for the session's own references); further tools (``read_skill``,
``find_tools``) are added by the contributors that own them.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.context.tool_output_reader import READ_TOOL_OUTPUT, READ_TOOL_OUTPUT_SCHEMA, read_tool_output
from proxy.session.store import SessionStore

ToolRunner = Callable[[str, str], Awaitable[str]]  # (context_id, raw JSON arguments) -> result text


@dataclass(frozen=True)
class ProxyTool:
    """A tool the proxy offers and runs itself."""

    name: str
    schema: dict[str, Any]
    run: ToolRunner
    # Offered only when this says so for the call's history and client tools (e.g. references exist).
    offer_when: Callable[[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]], bool]


class _SessionOutputs:
    """The store's tool bodies of one session, as the reader's ``ToolOutputSource``."""

    def __init__(self, store: SessionStore, context_id: str) -> None:
        self._store = store
        self._context_id = context_id

    async def get(self, ref: str) -> str | None:
        return await self._store.tool_output(self._context_id, ref)


def read_tool_output_tool(store: SessionStore) -> ProxyTool:
    """``read_tool_output``, offered once the history holds a compacted preview or a checkpoint."""

    async def run(context_id: str, arguments: str) -> str:
        return await read_tool_output(_SessionOutputs(store, context_id), arguments)

    def offer_when(history: Sequence[Mapping[str, Any]], client_tools: Sequence[Mapping[str, Any]]) -> bool:
        return any(message.get("role") == "tool" for message in history)

    return ProxyTool(READ_TOOL_OUTPUT, READ_TOOL_OUTPUT_SCHEMA, run, offer_when)


class ProxyToolbox:
    """The proxy-owned tools of this proxy. A client tool of the same name always wins."""

    def __init__(self, tools: Sequence[ProxyTool]) -> None:
        self._tools = {tool.name: tool for tool in tools}

    def offered(
        self, history: Sequence[Mapping[str, Any]], client_tools: Sequence[Mapping[str, Any]]
    ) -> list[ProxyTool]:
        """The proxy tools to offer for this call, in a stable order."""
        client_names = {_tool_name(tool) for tool in client_tools}
        return [
            tool
            for name, tool in sorted(self._tools.items())
            if name not in client_names and tool.offer_when(history, client_tools)
        ]

    async def run(self, context_id: str, call: Mapping[str, Any]) -> str:
        """Run one tool call of the model; any failure becomes a result text the model can read."""
        function = call.get("function") or {}
        tool = self._tools.get(str(function.get("name")))
        if tool is None:
            return f"error: {function.get('name')!r} is not a proxy-owned tool"
        arguments = function.get("arguments") or "{}"
        return await tool.run(context_id, arguments if isinstance(arguments, str) else json.dumps(arguments))


def _tool_name(tool: Mapping[str, Any]) -> str:
    function = tool.get("function")
    return str(function.get("name")) if isinstance(function, Mapping) else ""
