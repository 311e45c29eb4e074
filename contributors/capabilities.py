"""Capabilities: the tools offered in this call as stable policy, and the deferred-tool mechanism.

``request.tools`` is what the model is offered this call (the client's visible tools plus the
proxy-owned ones). The section lists their names, sorted, so it changes only when the offer changes;
it names the promoted deferred tools and, when ``find_tools`` is offered, says how to load more.

Deferred tools are client tools the operator marks by name pattern: :class:`DeferredToolPolicy` keeps
them out of the offer until the model promotes them with the proxy-owned ``find_tools`` (or has already
called them); from the next model call on they are offered, and their calls go to the client as usual.
The offer is always a subset of the client's tools plus the proxy's own: the proxy never offers a tool
that neither can run.

This package owns ``find_tools``: the tool (:class:`FindTools`, which also keeps the unpromoted deferred
tools out of the offer), its JSON result and the ``tools`` run-state channel that reads that result back
(``promoted``: names a ``find_tools`` result promoted; ``called``: every tool name the model called).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from pydantic import Field

from contributors.base import BuiltinContributor, ContributorOptions, Factory, options_for
from proxy.context.types import (
    ContributionRequest,
    ContributorOutput,
    DeclaredCall,
    ProxyTool,
    Section,
    StateChannel,
    ToolContext,
    tool_name,
)

SLOT = 30
TOOLS = "tools"  # the run-state channel
FIND_TOOLS = "find_tools"
MAX_MATCHES = 5
FIND_TOOLS_SCHEMA: Mapping[str, Any] = {
    "type": "function",
    "function": {
        "name": FIND_TOOLS,
        "description": (
            "Search the tools that are available on demand by words in their names and descriptions. "
            "Matching tools are loaded and can be called from your next step on."
        ),
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "Words to look for, e.g. 'database query'."}},
            "required": ["query"],
            "additionalProperties": False,
        },
    },
}


class CapabilitiesOptions(ContributorOptions):
    """``contributors: {capabilities: {...}}``."""

    deferred: list[str] = Field(
        default_factory=list,
        description="fnmatch patterns on tool names (e.g. mcp__*): matching client tools wait for find_tools",
    )


def _description(tool: Mapping[str, Any]) -> str:
    function = tool.get("function")
    text = function.get("description") if isinstance(function, Mapping) else tool.get("description")
    return text if isinstance(text, str) else ""


def promoted_names(state: Mapping[str, Any]) -> set[str]:
    """Tools promoted so far: those a ``find_tools`` result loaded and those the model already called
    (a tool in use keeps being offered, so its calls in the history stay meaningful)."""
    tools = state.get(TOOLS)
    if not isinstance(tools, Mapping):
        return set()
    return {n for key in ("promoted", "called") for n in tools.get(key) or () if isinstance(n, str)}


class DeferredToolPolicy:
    """Which client tools wait for promotion, by fnmatch patterns on their names (case-sensitive)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = tuple(patterns)

    def is_deferred(self, tool: Mapping[str, Any] | str) -> bool:
        """True if the tool (or tool name) matches a deferred pattern."""
        name = tool if isinstance(tool, str) else tool_name(tool)
        return bool(name) and any(fnmatchcase(name, p) for p in self.patterns)

    def visible_tools(self, client_tools: Sequence[Mapping[str, Any]], promoted: Collection[str]) -> list[Any]:
        """The client's tools minus the unpromoted deferred ones, in the client's order."""
        return [t for t in client_tools if not self.is_deferred(t) or tool_name(t) in promoted]

    def hidden_tools(self, client_tools: Sequence[Mapping[str, Any]], promoted: Collection[str]) -> list[Any]:
        """The deferred client tools not yet promoted: what ``find_tools`` searches."""
        return [t for t in client_tools if self.is_deferred(t) and tool_name(t) not in promoted]

    def run_find_tools(
        self, arguments: str | Mapping[str, Any], client_tools: Sequence[Mapping[str, Any]], promoted: Collection[str]
    ) -> tuple[str, list[str]]:
        """Run ``find_tools``: ``(result text, newly promoted names)``.

        The result is JSON ``{"promoted": [...], "tools": [{"name", "description"}], "note"}`` (the run
        state reads ``promoted`` back from the history); bad arguments give a text starting ``Error:``.
        A deferred tool matches when a query word occurs in its name or description; the best
        ``MAX_MATCHES`` by number of words found are promoted.
        """
        query = _query(arguments)
        if query is None:
            return 'Error: find_tools takes {"query": "<words>"}, a non-empty string.', []
        words = [w for w in query.lower().replace("_", " ").split() if w]
        scored = []
        for tool in (t for t in client_tools if self.is_deferred(t)):
            haystack = f"{tool_name(tool)} {_description(tool)}".lower().replace("_", " ")
            score = sum(1 for w in words if w in haystack)
            if score:
                scored.append((-score, tool_name(tool), _description(tool)))
        matches = sorted(scored)[:MAX_MATCHES]
        names = [name for _, name, _ in matches]
        newly = [n for n in names if n not in promoted]
        if names:
            note = "These tools are loaded; call them from your next step on."
        else:
            waiting = sorted(tool_name(t) for t in self.hidden_tools(client_tools, promoted))
            note = f"No tool matches {query!r}. Not yet loaded: {', '.join(waiting[:30]) or 'none'}."
        body = {"promoted": names, "tools": [{"name": n, "description": d} for _, n, d in matches], "note": note}
        return json.dumps(body, ensure_ascii=False), newly


def promoted_in(text: str) -> list[str]:
    """The tool names a ``find_tools`` result promoted (its JSON ``promoted`` list; see ``run_find_tools``)."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    names = data.get("promoted") if isinstance(data, dict) else None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


class ToolsChannel:
    """The ``tools`` channel: ``promoted`` by ``find_tools`` results and ``called`` by the model, sorted."""

    name = TOOLS

    def initial(self) -> Any:
        """Nothing promoted or called yet."""
        return {"promoted": [], "called": []}

    def observe(self, value: Any, call: DeclaredCall, result: str | None, diagnose: Callable[[str], None]) -> Any:
        """Every call counts as called; a successful ``find_tools`` result adds what it promoted."""
        promoted, called = value["promoted"], value["called"]
        if call.name and call.name not in called:
            called = sorted([*called, call.name])
        if result is not None and call.name == FIND_TOOLS:
            promoted = sorted(set(promoted) | set(promoted_in(result)))
        return {"promoted": promoted, "called": called}

    def judge(self, value: Any, visible: Sequence[Mapping[str, Any]]) -> Any:
        """Promotion does not depend on what is visible."""
        return value


@dataclass(frozen=True)
class FindTools:
    """The proxy-owned ``find_tools``: a search over the deferred client tools; what it finds is offered
    from the next call. It also withholds the deferred tools not yet promoted."""

    policy: DeferredToolPolicy
    name: str = FIND_TOOLS
    schema: Mapping[str, Any] = field(default_factory=lambda: FIND_TOOLS_SCHEMA)
    needs_references: bool = False

    def offered(self, context: ToolContext) -> bool:
        """Offered while a deferred client tool waits for promotion."""
        return bool(self.policy.hidden_tools(context.client_tools, promoted_names(context.state)))

    async def run(self, context: ToolContext, arguments: str) -> str:
        """The JSON result of the search (or an ``Error:`` text)."""
        text, _ = self.policy.run_find_tools(arguments, context.client_tools, promoted_names(context.state))
        return text

    def withheld(self, context: ToolContext) -> frozenset[str]:
        """The deferred client tools not yet promoted."""
        hidden = self.policy.hidden_tools(context.client_tools, promoted_names(context.state))
        return frozenset(tool_name(tool) for tool in hidden)


def _query(arguments: str | Mapping[str, Any]) -> str | None:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    query = arguments.get("query") if isinstance(arguments, Mapping) else None
    return query if isinstance(query, str) and query.strip() else None


class Capabilities(BuiltinContributor):
    """The capabilities section: offered tool names, promoted deferred tools, how to load more."""

    id = "capabilities"
    Options = CapabilitiesOptions

    async def contribute(self, request: ContributionRequest) -> ContributorOutput:
        """One section; none when no tools are offered."""
        policy = DeferredToolPolicy(options_for(request, CapabilitiesOptions).deferred)
        names = sorted({tool_name(t) for t in request.tools} - {""})
        if not names:
            return ContributorOutput()
        lines = [
            f"Tools offered in this call: {', '.join(names)}.",
            "Call only these tools, with arguments that match their schemas.",
        ]
        promoted = [n for n in names if policy.is_deferred(n)]
        if promoted:
            lines.append(f"Loaded on demand earlier in this run: {', '.join(promoted)}.")
        if FIND_TOOLS in names:
            lines.append(
                "More tools are available on demand: call find_tools(query) to search them; "
                "a tool it loads can be called from your next step on."
            )
        section = Section("capabilities", "\n".join(lines), slot=SLOT, title="Capabilities")
        return ContributorOutput(sections=(section,))


@dataclass(frozen=True)
class CapabilitiesFactory(Factory):
    """The capabilities factory: it also offers ``find_tools`` and declares the ``tools`` channel."""

    def tools(self, options: Any) -> Sequence[ProxyTool]:
        """``find_tools`` over the configured deferred patterns (offered only while one waits)."""
        deferred = options.deferred if isinstance(options, CapabilitiesOptions) else ()
        return (FindTools(DeferredToolPolicy(deferred)),)

    def channels(self, options: Any) -> Sequence[StateChannel]:
        """The ``tools`` channel."""
        return (ToolsChannel(),)


factory = CapabilitiesFactory(Capabilities)
