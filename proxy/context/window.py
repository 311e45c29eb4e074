"""``AtomicHistoryWindowPolicy``: the history that fits the token limit, never splitting a unit.

Always kept: pinned system/developer messages, the task anchor (first user message, verbatim), the
checkpoint, the latest step (the last assistant unit and everything after it) and unfinished tool
steps. Older finished units are dropped oldest first until the estimate fits. If the kept minimum does
not fit, assembly fails here, before any provider call.

Orphan tool results (no call right before them) are dropped with an error diagnostic: a provider would
reject them. Unfinished steps are kept as they are (the spec forbids removing them); since a provider
also rejects a call without results, the validator reports them; they cannot be sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.context.shortfall import ContextDoesNotFit, Shortfall
from proxy.context.turn_estimator import counts_of
from proxy.context.types import Diagnostic, TokenEstimator
from proxy.context.units import Unit, anchor_unit, latest_step_start, split_units


@dataclass(frozen=True)
class WindowStatistics:
    """Counts for the trace: what came in, what was kept, what it costs."""

    limit_tokens: int
    input_messages: int
    kept_messages: int
    dropped_messages: int
    dropped_units: int
    input_tokens: int
    kept_tokens: int
    minimum_tokens: int
    anchor_index: int | None
    latest_step_index: int | None
    unfinished_call_ids: tuple[str, ...]


@dataclass(frozen=True)
class WindowResult:
    """The kept history (checkpoint inserted after the anchor), statistics and diagnostics.

    ``kept_indices`` are positions in the input history, in output order; the checkpoint has none.
    """

    messages: tuple[dict[str, Any], ...]
    kept_indices: tuple[int, ...]
    statistics: WindowStatistics
    diagnostics: tuple[Diagnostic, ...]


class AtomicHistoryWindowPolicy:
    """Keeps whole units of history within a token limit; see the module docstring for the rules."""

    def apply(
        self,
        history: Sequence[Mapping[str, Any]],
        *,
        limit_tokens: int,
        estimator: TokenEstimator,
        checkpoint: Mapping[str, Any] | None = None,
        units: Sequence[Unit] | None = None,
        costs: Sequence[int] | None = None,
    ) -> WindowResult:
        """Window ``history`` into ``limit_tokens`` (the budget left for history after the system prompt,
        tools and contributor messages). Raises ``ContextDoesNotFit`` (an ``AssemblyFailed``) when the kept
        minimum does not fit.

        ``units`` and ``costs`` are ``split_units(history)`` and ``estimator``'s count of each message, when
        the caller has them (the compactor made both for the history it rendered)."""
        units = list(units) if units is not None else split_units(history)
        costs = list(costs) if costs is not None else counts_of(estimator, history)
        if len(costs) != len(history) or (units and units[-1].stop != len(history)):
            raise ValueError("units and costs must be those of the history")
        unit_cost = [sum(costs[u.start : u.stop]) for u in units]
        anchor = anchor_unit(history, units)
        latest = latest_step_start(history, units) if units else None
        diagnostics: list[Diagnostic] = []
        keep = [False] * len(units)
        droppable: list[int] = []
        for k, unit in enumerate(units):
            if unit.kind == "orphan_result":
                diagnostics.append(
                    Diagnostic(
                        "error", "orphan_tool_result", f"tool result at {unit.start} has no call before it; dropped"
                    )
                )
            elif unit.kind == "pinned" or unit.unfinished or k == anchor or (latest is not None and k >= latest):
                keep[k] = True
            else:
                droppable.append(k)
        checkpoint_cost = estimator.count_message(checkpoint) if checkpoint is not None else 0
        minimum = checkpoint_cost + sum(c for k, c in enumerate(unit_cost) if keep[k])
        if minimum > limit_tokens or limit_tokens <= 0:
            left = f"over the {limit_tokens} left for" if limit_tokens > 0 else f"but none ({limit_tokens}) is left for"
            raise ContextDoesNotFit(
                f"the history minimum (task anchor, checkpoint, latest step, unfinished calls) needs {minimum} "
                f"tokens, {left} history",
                Shortfall("history", minimum, limit_tokens),
            )
        total = minimum + sum(unit_cost[k] for k in droppable)
        first_kept = 0
        # Drop the oldest finished units first: what stays is always a suffix of the droppable ones.
        while total > limit_tokens:
            total -= unit_cost[droppable[first_kept]]
            first_kept += 1
        for k in droppable[first_kept:]:
            keep[k] = True
        dropped = [units[k] for k in droppable[:first_kept]]
        if dropped:
            dropped_messages = sum(len(u) for u in dropped)
            diagnostics.append(
                Diagnostic(
                    "info", "history_dropped", f"{len(dropped)} oldest units ({dropped_messages} messages) dropped"
                )
            )
        messages: list[dict[str, Any]] = []
        indices: list[int] = []
        if all(keep):  # nothing dropped (a history that fits): all of it in one pass, the checkpoint after the anchor
            messages = [m if type(m) is dict else dict(m) for m in history]
            indices = list(range(len(history)))
            if checkpoint is not None:
                messages.insert(units[anchor].stop if anchor is not None else 0, dict(checkpoint))
        else:
            for k, unit in enumerate(units):
                if not keep[k]:
                    continue
                for i in range(unit.start, unit.stop):
                    messages.append(_as_dict(history[i]))
                    indices.append(i)
                if k == anchor and checkpoint is not None:
                    messages.append(dict(checkpoint))
            if checkpoint is not None and anchor is None:
                messages.insert(0, dict(checkpoint))
        stats = WindowStatistics(
            limit_tokens=limit_tokens,
            input_messages=len(history),
            kept_messages=len(indices),
            dropped_messages=len(history) - len(indices),
            dropped_units=len(dropped),
            input_tokens=sum(costs),
            kept_tokens=total,
            minimum_tokens=minimum,
            anchor_index=units[anchor].start if anchor is not None else None,
            latest_step_index=units[latest].start if latest is not None else None,
            unfinished_call_ids=tuple(cid for u in units if u.unfinished for cid in u.missing),
        )
        return WindowResult(tuple(messages), tuple(indices), stats, tuple(diagnostics))


def _as_dict(message: Mapping[str, Any]) -> dict[str, Any]:
    # Kept messages are passed on as they are, not copied: nothing downstream changes a message in place
    # (each stage copies what it rewrites), and the turn's token memo then finds them by identity.
    return message if isinstance(message, dict) else dict(message)
