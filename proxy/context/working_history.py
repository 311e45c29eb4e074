"""``WorkingHistory``: the history one compaction pass works on.

A verbatim head (everything up to the task anchor), the checkpoint in effect, then the visible entries
from ``start``, each as it came or replaced (a preview, a split tail), with the token count of each.
The compactor (``compactor.py``) decides what to replace; this keeps the state and renders it: the
messages the model will see, and the units and counts the window takes along with them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.context.checkpoint import Checkpoint
from proxy.context.previews import is_preview
from proxy.context.turn_estimator import counts_of
from proxy.context.types import TokenEstimator
from proxy.context.units import SplitMemo, Unit, anchor_stop, latest_step_start, split_units
from proxy.kernel.canonical import HistoryEntry, content_text

SPLIT_NOTE = "[the first {cut:,} characters of this message are summarized in the checkpoint above]\n"


class WorkingHistory:
    """The history being compacted: a verbatim head, the checkpoint, then visible entries from ``start``."""

    def __init__(
        self,
        entries: Sequence[HistoryEntry],
        estimator: TokenEstimator,
        nonce: str,
        reader: str,
        splits: SplitMemo | None = None,
    ) -> None:
        self.entries = entries
        self.splits = splits
        self.estimator = estimator
        self.nonce = nonce  # the session's framing nonce, on the checkpoint message
        self.reader = reader  # the name previews give the proxy's tool-output reader
        self.messages: list[dict[str, Any]] = [e.message for e in entries]
        # Found without splitting: the split is made only when previews or a checkpoint need it.
        self.head_end = anchor_stop(self.messages)
        self.checkpoint: Checkpoint | None = None
        self.start = self.head_end
        self.visible: dict[int, dict[str, Any]] = {}  # entry index -> replacement (preview or split tail)
        self.costs = counts_of(estimator, self.messages)
        self.checkpoint_cost = 0

    @functools.cached_property
    def units(self) -> list[Unit]:
        if self.splits is None:
            return split_units(self.messages)
        return self.splits.split(self.messages, [entry.chain_hash for entry in self.entries])

    @functools.cached_property
    def latest(self) -> int:
        """Where the latest step begins (``latest_step_start``), as a message index."""
        return self.units[latest_step_start(self.messages, self.units)].start if self.units else 0

    def message(self, i: int) -> dict[str, Any]:
        visible = self.visible.get(i)
        return self.messages[i] if visible is None else visible

    def replace(self, i: int, message: dict[str, Any], cost: int | None = None) -> None:
        """Show ``message`` in place of entry ``i``; ``cost`` is its count when the caller has it."""
        self.visible[i] = message
        self.costs[i] = self.estimator.count_message(message) if cost is None else cost

    def set_checkpoint(self, checkpoint: Checkpoint, covers: int) -> None:
        self.checkpoint = checkpoint
        self.checkpoint_cost = self.estimator.count_message(checkpoint.message(self.nonce))
        if checkpoint.split_chars:
            self.start = covers
            text = content_text(self.messages[covers].get("content"))
            self.replace(covers, split_tail(self.messages[covers], text, checkpoint.split_chars))
        else:
            self.start = covers + 1

    def total(self) -> int:
        return sum(self.costs[: self.head_end]) + self.checkpoint_cost + sum(self.costs[self.start :])

    def render(self) -> list[dict[str, Any]]:
        # Unchanged messages are passed on as they are (see ``window._as_dict``); replacements are new dicts.
        # Copied as a list slice, then the few replacements put in (a call per message is most of the cost).
        out = self.messages[: self.head_end]
        if self.checkpoint is not None:
            out.append(self.checkpoint.message(self.nonce))
        offset = len(out) - self.start
        out.extend(self.messages[self.start :])
        for i, replacement in self.visible.items():
            if i >= self.start:
                out[i + offset] = replacement
        return out

    def visible_units(self) -> tuple[Unit, ...] | None:
        """The units of the history ``render`` gives without the checkpoint message, from those of the
        entries (when they were made, or are cheap to make from a split memo; ``None`` otherwise). Head and
        visible part are each whole units (the anchor is a unit of its own, a checkpoint covers whole units
        or splits a user message), and a preview or split tail keeps its message's role and ids, so these
        are what splitting it would give."""
        units = self.units if self.splits is not None else self.__dict__.get("units")  # cheap, or if it was needed
        if units is None:
            return None
        if self.checkpoint is None:
            return tuple(units)
        head, start = self.head_end, self.start
        if any(u.start < head < u.stop or u.start < start < u.stop for u in units):
            return None  # not whole units after all: let the window split it
        shift = start - head
        kept = [u for u in units if u.stop <= head]
        return (*kept, *(Unit(u.start - shift, u.stop - shift, u.kind, u.missing) for u in units if u.start >= start))

    def visible_costs(self) -> tuple[int, ...]:
        """The token counts of the history ``render`` gives without the checkpoint message."""
        return (*self.costs[: self.head_end], *self.costs[self.start :])

    def previewed_refs(self) -> list[str]:
        visible, messages, entries = self.visible, self.messages, self.entries
        out: list[str] = []
        for i in range(self.start, len(entries)):
            ref = entries[i].tool_output_ref
            if not ref:
                continue  # no stored body: never previewed (most messages: only tool results have one)
            content = (visible.get(i, messages[i]) if visible else messages[i]).get("content")
            if is_preview(content if type(content) is str else content_text(content)):
                out.append(ref)
        return out


def split_tail(message: Mapping[str, Any], text: str, cut: int) -> dict[str, Any]:
    """``message`` with the first ``cut`` characters of its ``text`` gone (a checkpoint summarizes them)."""
    out = dict(message)
    out["content"] = SPLIT_NOTE.format(cut=cut) + text[cut:]
    return out
