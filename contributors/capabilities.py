"""Capabilities: the tools offered in this call as stable policy, and the deferred-tool mechanism.

``request.tools`` is what the model is offered this call (the client's visible tools plus the
proxy-owned ones). The section lists their names, sorted, so it changes only when the offer changes;
it names the promoted deferred tools and, when ``find_tools`` is offered, says how to load more.

Deferred tools are client tools the operator marks by name pattern: :class:`DeferredToolPolicy` keeps
them out of the offer until the model promotes them with the proxy-owned ``find_tools`` (or has already
called them); from the next model call on they are offered, and their calls go to the client as usual.
The offer is always a subset of the client's tools plus the proxy's own: the proxy never offers a tool
that neither can run.

Options (``contributors: {capabilities: {...}}``):
    deferred: list of fnmatch patterns on tool names, e.g. ``["mcp__*"]``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any, ClassVar

from contributors.base import BuiltinContributor, Factory, names_option
from proxy.context.state import TOOLS
from proxy.context.types import ContributionRequest, ContributorOutput, Section

SLOT = 30
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


def tool_name(tool: Mapping[str, Any]) -> str:
    """A tool's function name (``""`` when it has none)."""
    function = tool.get("function")
    name = function.get("name") if isinstance(function, Mapping) else tool.get("name")
    return name if isinstance(name, str) else ""


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
    option_keys: ClassVar[frozenset[str]] = frozenset({"deferred"})

    @classmethod
    def check_options(cls, raw: Mapping[str, Any]) -> None:
        """``deferred`` must be a list of patterns."""
        names_option(raw, cls.id, "deferred")

    async def contribute(self, request: ContributionRequest) -> ContributorOutput:
        """One section; none when no tools are offered."""
        policy = DeferredToolPolicy(names_option(self.options(request), self.id, "deferred") or ())
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


factory = Factory(Capabilities)
