"""The spec's "compatible message-count compaction": an optional cap on the number of history messages.

It runs first in the pipeline, on canonical history, and drops whole units oldest first, keeping the
same minimum as the token window (pinned messages, task anchor, latest step, unfinished steps). It is a
soft cap: when the minimum alone has more messages than the cap, the minimum is kept and a diagnostic
says so (the token window decides whether that fits).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.context.types import Diagnostic
from proxy.context.units import anchor_unit, latest_step_start, split_units


@dataclass(frozen=True)
class MessageCountResult:
    """The kept history, the input positions kept, how many messages were dropped, and diagnostics."""

    messages: tuple[Mapping[str, Any], ...]
    kept_indices: tuple[int, ...]
    dropped_messages: int
    diagnostics: tuple[Diagnostic, ...]


def apply_message_count_cap(history: Sequence[Mapping[str, Any]], max_messages: int | None) -> MessageCountResult:
    """Keep at most ``max_messages`` history messages (``None``: no cap), by whole units."""
    if max_messages is None or len(history) <= max_messages:
        return MessageCountResult(tuple(history), tuple(range(len(history))), 0, ())
    if max_messages <= 0:
        raise ValueError(f"max_messages must be a positive integer, got {max_messages!r}")
    units = split_units(history)
    anchor = anchor_unit(history, units)
    latest = latest_step_start(history, units)
    keep = [u.kind == "pinned" or u.unfinished or k == anchor or k >= latest for k, u in enumerate(units)]
    count = sum(len(u) for k, u in enumerate(units) if keep[k])
    diagnostics: list[Diagnostic] = []
    if count > max_messages:
        diagnostics.append(
            Diagnostic("warning", "message_cap_minimum", f"the kept minimum has {count} messages, over {max_messages}")
        )
    # Newest droppable units first, while they fit under the cap: the kept ones form a suffix.
    for k in range(len(units) - 1, -1, -1):
        if not keep[k] and count + len(units[k]) <= max_messages:
            keep[k] = True
            count += len(units[k])
        elif not keep[k]:
            break
    indices = tuple(i for k, u in enumerate(units) if keep[k] for i in range(u.start, u.stop))
    dropped = len(history) - len(indices)
    if dropped:
        diagnostics.append(Diagnostic("info", "message_cap_dropped", f"{dropped} messages dropped by the cap"))
    return MessageCountResult(tuple(history[i] for i in indices), indices, dropped, tuple(diagnostics))
