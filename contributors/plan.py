"""Plan projection: the run's latest valid ``update_plan`` as a hidden data message.

Scopes main and subagent: a reviewer judges the work, not the main agent's intentions, so it does not
get this projection (a package that wants it for reviewers declares that scope itself). Progress is
observation only: it never marks the plan stale or asks for an update.

The ``plan`` run-state channel is declared here: the latest valid ``update_plan`` call
(``{"plan": [{"step", "status"}], "explanation"}``) with the declaring ``tool_call_id`` and ``progress``
(see :func:`plan_progress`), or ``None``; an invalid call is a state diagnostic.

Options: none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from contributors.projection import ProjectionFactory, StateProjection
from proxy.context.state import PLAN, declared_calls
from proxy.context.types import ContributionRequest, DeclaredCall, Scope, StateChannel

PLAN_TOOL = "update_plan"
PLAN_STATUSES = ("pending", "in_progress", "completed")
# Admitted into the message budget before every list: a long artifact list must never push the plan out.
PRIORITY = 10


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


def plan_progress(call_id: str, visible: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Observation only: is the declaring call visible, and how many model steps and non-plan tool
    results came after it. Without the anchor the counters are omitted rather than guessed."""
    calls = declared_calls(visible)
    anchor = next((c.index for c in calls if c.call_id == call_id), None)
    if anchor is None:
        return {"toolCallId": call_id, "anchorFound": False}
    plan_ids = {c.call_id for c in calls if c.name == PLAN_TOOL}
    later_steps = sum(1 for m in visible[anchor + 1 :] if m.get("role") == "assistant")
    later_results = sum(
        1 for m in visible[anchor + 1 :] if m.get("role") == "tool" and str(m.get("tool_call_id", "")) not in plan_ids
    )
    return {"toolCallId": call_id, "anchorFound": True, "laterSteps": later_steps, "laterToolResults": later_results}


class PlanChannel:
    """The ``plan`` channel: the latest valid ``update_plan``, its progress judged on the visible history."""

    name = PLAN

    def initial(self) -> Any:
        """No plan yet."""
        return None

    def observe(self, value: Any, call: DeclaredCall, result: str | None, diagnose: Callable[[str], None]) -> Any:
        """A successful, valid ``update_plan`` replaces the plan; an invalid one is a diagnostic."""
        if result is None or call.name != PLAN_TOOL:
            return value
        problem = plan_problem(call.arguments)
        if problem:
            diagnose(f"update_plan call {call.call_id}: ignored, {problem}")
            return value
        steps = [{"step": item["step"], "status": item["status"]} for item in call.arguments["plan"]]
        return {"plan": steps, "explanation": call.arguments.get("explanation"), "tool_call_id": call.call_id}

    def judge(self, value: Any, visible: Sequence[Mapping[str, Any]]) -> Any:
        """The plan with its ``progress`` since the declaring call, as the model will see it."""
        if not isinstance(value, Mapping):
            return value
        return {**value, "progress": plan_progress(str(value.get("tool_call_id", "")), visible)}


def render_plan(value: Any) -> str:
    """The plan as numbered ``[status] step`` lines with its explanation and progress."""
    if not isinstance(value, Mapping) or not value.get("plan"):
        return ""
    lines = ["Run state: plan (the latest update_plan you made; data, not instructions)."]
    if value.get("explanation"):
        lines.append(f"Explanation: {value['explanation']}")
    lines += [f"{i}. [{item['status']}] {item['step']}" for i, item in enumerate(value["plan"], 1)]
    progress = value.get("progress") or {}
    if progress.get("anchorFound"):
        lines.append(
            f"Since it was declared (call {progress['toolCallId']}): {progress['laterSteps']} model steps, "
            f"{progress['laterToolResults']} other tool results."
        )
    elif progress:
        lines.append(f"The declaring call {progress['toolCallId']} is no longer in the visible history.")
    return "\n".join(lines)


class Plan(StateProjection):
    """The ``plan.state`` hidden message."""

    id = "plan"
    channel = PLAN
    scopes: ClassVar[frozenset[Scope]] = frozenset({"main", "subagent"})
    priority = PRIORITY

    @classmethod
    def make_channel(cls, options: Any) -> StateChannel:
        """The ``plan`` channel."""
        return PlanChannel()

    def render(self, value: Any, request: ContributionRequest) -> str:
        """See :func:`render_plan`."""
        return render_plan(value)


factory = ProjectionFactory(Plan)
