"""Plan projection: the run's latest valid ``update_plan`` as a hidden data message.

Scopes main and subagent: a reviewer judges the work, not the main agent's intentions, so it does not
get this projection (a package that wants it for reviewers declares that scope itself). Progress is
observation only: it never marks the plan stale or asks for an update.

Options: none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from contributors.base import Factory
from contributors.projection import StateProjection
from proxy.context.state import PLAN
from proxy.context.types import ContributionRequest, Scope


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

    def render(self, value: Any, request: ContributionRequest) -> str:
        """See :func:`render_plan`."""
        return render_plan(value)


factory = Factory(Plan)
