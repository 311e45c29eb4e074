"""Run state channels derived from canonical history: plan, skills, tools and the record channels.

Successful tool results update the channels at the tool-result boundary, in the order the model
*declared* the calls (the order of ``tool_calls`` in its assistant message), never in the order the
results arrived: parallel tools finish in any order, the state sequence must not depend on it. A call
without a result yet (unfinished) changes nothing.

A result is *successful* unless its text, leading whitespace ignored, starts with ``error`` (any case),
or it is a JSON object with a truthy ``error`` key or ``"ok": false`` / ``"success": false``. That is
how tool runners (ours included: ``read_skill``, ``find_tools``, ``read_tool_output``) report failure
in a chat transcript, which has no error flag of its own.

Channels (every value is plain JSON data):

- ``plan``: the latest valid ``update_plan`` (``{"plan": [{"step", "status"}], "explanation"}``) with
  the declaring ``tool_call_id`` and ``progress`` (see :func:`plan_progress`), or ``None``.
- ``skills``: one reference per skill read through ``read_skill``: name, the revision the result
  stated, the call ID and whether the body is still visible (present and not compacted to a preview).
- ``tools``: ``promoted`` (names a ``find_tools`` result promoted) and ``called`` (every tool name the
  model called), sorted.
- ``delegation``, ``artifact``, ``review``, ``memory``: ``{"total", "entries"}``, the latest
  ``max_entries`` successful calls of the channel's tool names, arguments and result bounded.
- ``diagnostics``: why a call that looked like state was ignored (invalid plan...).

A session first seen mid-run is just a longer history: one pass fills every channel.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from proxy.canonical import content_text
from proxy.context.previews import is_preview

RunState: TypeAlias = dict[str, Any]

PLAN = "plan"
SKILLS = "skills"
TOOLS = "tools"
DIAGNOSTICS = "diagnostics"
DELEGATION = "delegation"
ARTIFACT = "artifact"
REVIEW = "review"
MEMORY = "memory"
RECORD_CHANNELS = (DELEGATION, ARTIFACT, REVIEW, MEMORY)
PLAN_STATUSES = ("pending", "in_progress", "completed")
DEFAULT_RECORD_TOOLS: Mapping[str, tuple[str, ...]] = {
    DELEGATION: ("delegate", "spawn_subagent", "task"),
    ARTIFACT: ("write_artifact", "save_artifact"),
    REVIEW: ("submit_review", "request_review"),
    MEMORY: ("remember", "memory_write"),
}
# The header run_read_skill puts on a body; the revision recorded in a durable skill reference.
SKILL_HEADER = re.compile(r'\s*<skill name="(?P<name>[^"]+)" revision="(?P<revision>[^"]+)">')
# A read_skill answer that points back at a body still in context instead of repeating it: it is not a
# reference of its own (the earlier result stays the one whose visibility counts).
SKILL_ALREADY_LOADED = "Skill already in context:"
_MAX_DIAGNOSTICS = 20
_MAX_LIST_ITEMS = 20


def _default_records() -> dict[str, frozenset[str]]:
    return {channel: frozenset(names) for channel, names in DEFAULT_RECORD_TOOLS.items()}


@dataclass(frozen=True)
class StateConfig:
    """Which tool names feed which channel, and how much of each call a record channel keeps."""

    plan_tools: frozenset[str] = frozenset({"update_plan"})
    skill_tools: frozenset[str] = frozenset({"read_skill"})
    find_tools: frozenset[str] = frozenset({"find_tools"})
    record_tools: Mapping[str, frozenset[str]] = field(default_factory=_default_records)
    max_entries: int = 20
    value_chars: int = 400

    @classmethod
    def from_options(cls, options: Mapping[str, Mapping[str, Any]]) -> StateConfig:
        """The config with each record channel's ``tools`` option (``contributors: {memory: {tools:
        [...]}}``) replacing its default tool names. Raises ValueError naming a bad option."""
        records = _default_records()
        for channel in RECORD_CHANNELS:
            names = (options.get(channel) or {}).get("tools")
            if names is None:
                continue
            if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
                raise ValueError(f"contributors.{channel}.tools must be a non-empty list of tool names, got {names!r}")
            records[channel] = frozenset(names)
        return cls(record_tools=records)


@dataclass(frozen=True)
class DeclaredCall:
    """One tool call of an assistant message, arguments parsed."""

    index: int  # of the declaring assistant message
    call_id: str
    name: str
    arguments: Any  # parsed JSON, or the raw text when it is not JSON


def is_successful(text: str) -> bool:
    """True unless ``text`` reports a failure (see the module docstring for the rule)."""
    stripped = text.lstrip()
    if stripped[:5].lower() == "error":
        return False
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except ValueError:
            return True
        if isinstance(data, dict):
            return not (data.get("error") or data.get("ok") is False or data.get("success") is False)
    return True


def declared_calls(history: Sequence[Mapping[str, Any]]) -> list[DeclaredCall]:
    """Every assistant tool call, in history order and, within a message, in declared order."""
    calls: list[DeclaredCall] = []
    for i, message in enumerate(history):
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or ():
            if not isinstance(call, Mapping):
                continue
            function = call.get("function")
            if not isinstance(function, Mapping):
                function = {}
            raw = function.get("arguments")
            calls.append(DeclaredCall(i, str(call.get("id", "")), str(function.get("name", "")), _parse(raw)))
    return calls


def _parse(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        return raw


def tool_results(history: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, str]]:
    """``tool_call_id`` -> (index, text) of its first tool result."""
    found: dict[str, tuple[int, str]] = {}
    for i, message in enumerate(history):
        if message.get("role") == "tool":
            found.setdefault(str(message.get("tool_call_id", "")), (i, content_text(message.get("content"))))
    return found


def derive_state(
    history: Sequence[Mapping[str, Any]],
    config: StateConfig | None = None,
    visible: Sequence[Mapping[str, Any]] | None = None,
) -> RunState:
    """The run state of ``history`` (canonical, before compaction).

    ``visible`` is the model-visible history (after compaction) that plan progress and skill visibility
    are judged against; by default ``history`` itself.
    """
    config = config or StateConfig()
    state: RunState = {
        PLAN: None,
        SKILLS: [],
        TOOLS: {"promoted": [], "called": []},
        DIAGNOSTICS: [],
        **{channel: {"total": 0, "entries": []} for channel in RECORD_CHANNELS},
    }
    results = tool_results(history)
    skills: dict[str, dict[str, Any]] = {}
    promoted: set[str] = set()
    called: set[str] = set()
    for call in declared_calls(history):
        if call.name:
            called.add(call.name)
        found = results.get(call.call_id)
        if found is None or found[0] < call.index or not is_successful(found[1]):
            continue
        text = found[1]
        if call.name in config.plan_tools:
            _apply_plan(state, call)
        elif call.name in config.skill_tools:
            reference = _skill_reference(call, text)
            if reference is not None:
                skills.pop(reference["name"], None)  # re-insert: the latest read goes last
                skills[reference["name"]] = reference
        elif call.name in config.find_tools:
            promoted.update(promoted_in(text))
        else:
            for channel in RECORD_CHANNELS:
                if call.name in config.record_tools.get(channel, ()):
                    _apply_record(state[channel], call, text, config)
    state[SKILLS] = list(skills.values())
    state[TOOLS] = {"promoted": sorted(promoted), "called": sorted(called)}
    return with_visibility(state, history if visible is None else visible, config)


def with_visibility(state: Mapping[str, Any], visible: Sequence[Mapping[str, Any]], config: StateConfig) -> RunState:
    """A copy of ``state`` with plan progress and skill visibility judged against ``visible``."""
    out = dict(state)
    bodies = {cid for cid, (_, text) in tool_results(visible).items() if not is_preview(text)}
    out[SKILLS] = [{**ref, "visible": ref["tool_call_id"] in bodies} for ref in state.get(SKILLS) or ()]
    plan = state.get(PLAN)
    if isinstance(plan, Mapping):
        out[PLAN] = {**plan, "progress": plan_progress(str(plan.get("tool_call_id", "")), visible, config)}
    return out


def plan_progress(call_id: str, visible: Sequence[Mapping[str, Any]], config: StateConfig) -> dict[str, Any]:
    """Observation only: is the declaring call visible, and how many model steps and non-plan tool
    results came after it. Without the anchor the counters are omitted rather than guessed."""
    calls = declared_calls(visible)
    anchor = next((c.index for c in calls if c.call_id == call_id), None)
    if anchor is None:
        return {"toolCallId": call_id, "anchorFound": False}
    plan_ids = {c.call_id for c in calls if c.name in config.plan_tools}
    later_steps = sum(1 for m in visible[anchor + 1 :] if m.get("role") == "assistant")
    later_results = sum(
        1 for m in visible[anchor + 1 :] if m.get("role") == "tool" and str(m.get("tool_call_id", "")) not in plan_ids
    )
    return {"toolCallId": call_id, "anchorFound": True, "laterSteps": later_steps, "laterToolResults": later_results}


def _apply_plan(state: RunState, call: DeclaredCall) -> None:
    problem = plan_problem(call.arguments)
    if problem:
        _diagnose(state, f"update_plan call {call.call_id}: ignored, {problem}")
        return
    args = call.arguments
    steps = [{"step": item["step"], "status": item["status"]} for item in args["plan"]]
    explanation = args.get("explanation")
    state[PLAN] = {"plan": steps, "explanation": explanation, "tool_call_id": call.call_id}


def plan_problem(arguments: Any) -> str:
    """Why ``arguments`` are not a valid ``update_plan`` payload, or ``""`` when they are."""
    if not isinstance(arguments, Mapping):
        return "arguments are not a JSON object"
    steps = arguments.get("plan")
    if not isinstance(steps, list) or not steps:
        return "'plan' must be a non-empty list"
    for item in steps:
        if not isinstance(item, Mapping) or not isinstance(item.get("step"), str) or not item["step"].strip():
            return "every plan item needs a non-empty 'step' string"
        if item.get("status") not in PLAN_STATUSES:
            return f"status {item.get('status')!r} is not one of {', '.join(PLAN_STATUSES)}"
    explanation = arguments.get("explanation")
    if explanation is not None and not isinstance(explanation, str):
        return "'explanation' must be a string"
    return ""


def _skill_reference(call: DeclaredCall, text: str) -> dict[str, Any] | None:
    if text.startswith(SKILL_ALREADY_LOADED):
        return None
    header = SKILL_HEADER.match(text)
    asked = call.arguments.get("name") if isinstance(call.arguments, Mapping) else None
    name = header.group("name") if header else asked
    if not isinstance(name, str) or not name:
        return None
    revision = header.group("revision") if header else None
    return {"name": name, "revision": revision, "tool_call_id": call.call_id, "visible": True}


def promoted_in(text: str) -> list[str]:
    """The tool names a ``find_tools`` result promoted (its JSON ``promoted`` list)."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    names = data.get("promoted") if isinstance(data, dict) else None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _apply_record(channel: dict[str, Any], call: DeclaredCall, text: str, config: StateConfig) -> None:
    entry = {
        "tool": call.name,
        "tool_call_id": call.call_id,
        "arguments": bounded(call.arguments, config.value_chars),
        "result": bounded(text, config.value_chars),
    }
    channel["total"] += 1
    channel["entries"] = [*channel["entries"], entry][-config.max_entries :]


def bounded(value: Any, chars: int) -> Any:
    """``value`` with every string cut to ``chars`` characters and every list to a few items, so that
    one large ``write_artifact`` payload cannot make the state (and each call's projection) large."""
    if isinstance(value, str):
        return value if len(value) <= chars else f"{value[:chars]}… [+{len(value) - chars} chars]"
    if isinstance(value, Mapping):
        return {str(k): bounded(v, chars) for k, v in value.items()}
    if isinstance(value, list):
        items = [bounded(v, chars) for v in value[:_MAX_LIST_ITEMS]]
        extra = len(value) - _MAX_LIST_ITEMS
        return [*items, f"… [+{extra} items]"] if extra > 0 else items
    return value


def _diagnose(state: RunState, text: str) -> None:
    state[DIAGNOSTICS] = [*state[DIAGNOSTICS], text][-_MAX_DIAGNOSTICS:]
