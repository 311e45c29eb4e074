"""``HistoryCompactor``: shrinks a history under token pressure, deterministic trimming first.

One pass, in this order:

0. Re-apply what earlier turns decided, so their bytes (and the provider's prompt cache) stay stable:
   the stored checkpoint covering the longest prefix of this history replaces that prefix (no
   summarizer call), and tool bodies previewed before (``previewed_refs``) are previewed again.
1. If the input is at the pressure threshold (or the pass is forced), old stored tool bodies become
   head/tail previews, oldest first, until the input is under the target. The latest step keeps its
   structure; one of its bodies is previewed only if it alone exceeds ``latest_body_percent`` of the
   limit (the model just asked for it, but a body that size would starve everything else).
2. If still above the target, the oldest finished units after the task anchor (and the previous
   checkpoint) are summarized into a new checkpoint. The kept suffix is chosen by token cost, walking
   back from the end; a user message the boundary falls into is split (see ``_split_user_message``).
   A checkpoint that is invalid, not smaller than its source, or that does not shrink the history is
   rejected and asked for again, up to ``max_summary_attempts``; if every attempt fails (or the
   summarizer raises), the deterministic trimming of step 1 stands.

The task anchor (first user message) and everything before it stay verbatim; the checkpoint message
follows it. Units (an assistant tool-call message with its results) are never split, unfinished ones
and the latest step are never summarized, so a protocol-valid history stays protocol-valid.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.context.checkpoint import Checkpoint, build_summary_request, validate_checkpoint
from proxy.context.pressure import Pressure, PressureConfig, measure_pressure
from proxy.context.previews import READ_TOOL_OUTPUT, PreviewMemo, PreviewPolicy, is_valid_ref
from proxy.context.turn_estimator import TurnEstimator, count_named
from proxy.context.types import TokenEstimator
from proxy.context.units import RESULT_ROLES, SplitMemo, Unit
from proxy.context.working_history import WorkingHistory, split_tail
from proxy.kernel.canonical import HistoryEntry, chain_hashes, content_text
from proxy.kernel.errors import ContextOverflow

# Counting a history is pure CPU: seconds for 20,000 messages seen for the first time. On the event loop
# that would stall every other session's request for as long, so a large history is counted (and its
# deterministic trimming planned) on a worker thread. A small one stays on the loop, where a thread hop
# costs more than it saves and where it can never queue behind large ones in the executor; so does a
# large one the turn has counted already (a resent history: its trimming is then a few milliseconds). The
# estimator must be thread-safe for this (``CachingEstimator`` is; a ``TurnEstimator`` belongs to one
# turn, which waits for the worker).
OFFLOAD_MESSAGES = 500
OFFLOAD_CHARS = 500_000

SPLIT_HEAD_NOTE = "(the first part of a long message; its rest stays verbatim after the checkpoint)\n"


def history_entries(messages: Sequence[Mapping[str, Any]], refs: Mapping[int, str] | None = None) -> list[HistoryEntry]:
    """Entries for ``messages`` with their chain hashes; ``refs`` maps message index to stored ref."""
    refs = refs or {}
    return [
        HistoryEntry(dict(m), h, refs.get(i))
        for i, (m, h) in enumerate(zip(messages, chain_hashes(messages), strict=True))
    ]


class Summarizer(Protocol):
    """The model that writes checkpoints. May raise; the compactor then keeps deterministic trimming."""

    async def summarize(self, messages: list[dict[str, Any]]) -> str:
        """The model's text answer to ``messages``."""


@dataclass(frozen=True)
class CompactionConfig:
    """Knobs of the compactor (the pressure percentages are of the context window, see ``pressure.py``;
    the others of the effective input limit)."""

    pressure: PressureConfig = field(default_factory=PressureConfig)
    preview: PreviewPolicy = field(default_factory=PreviewPolicy)
    max_summary_attempts: int = 2  # per round (SCIENCE_AGENT_SUMMARY_MAX_ATTEMPTS)
    # Rounds of one pass, each over the next oldest slice (SCIENCE_AGENT_SUMMARY_MAX_ROUNDS).
    max_summary_rounds: int = 3
    checkpoint_percent: int = 10  # room reserved for the checkpoint; the summarizer is told to fit it
    source_percent: int = 50  # at most this much history goes into one summarization request
    latest_body_percent: int = 25
    min_split_tokens: int = 256  # a user message is split only if its kept tail gets at least this


@dataclass
class CompactionTrace:
    """What one pass did, for the context trace (``proxy/runtime/trace_record.py`` serializes it)."""

    reason: str | None
    limit: int
    threshold_tokens: int
    target_tokens: int
    tokens_before: int
    tokens_after: int = 0
    reused_checkpoint: str | None = None
    compacted_refs: list[str] = field(default_factory=list)  # bodies this pass previewed for the first time
    reapplied_refs: list[str] = field(default_factory=list)  # bodies previewed again as earlier turns decided
    summary_source_tokens: int = 0  # of the last summarization round (previous checkpoint included)
    checkpoint_tokens: int = 0  # of the accepted checkpoint message
    attempts: int = 0
    rejections: list[str] = field(default_factory=list)
    summarized_messages: int = 0
    split_chars: int = 0
    unknown_refs: list[str] = field(default_factory=list)
    checkpoint_issues: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CompactionResult:
    """The compacted history and what the caller keeps for later turns.

    ``checkpoint`` is the one in effect (reused or new); store it when ``new_checkpoint`` is true, keyed
    by ``checkpoint.covers_hash``. ``previewed_refs`` are all bodies shown as previews: pass them back
    as ``previewed_refs`` next turn so the same bodies stay previewed.
    """

    messages: tuple[dict[str, Any], ...]
    checkpoint: Checkpoint | None
    new_checkpoint: bool
    previewed_refs: tuple[str, ...]
    trace: CompactionTrace
    checkpoint_index: int | None = None  # position of the checkpoint message in ``messages``
    # The units and token counts of the history of ``history_and_checkpoint`` when the compaction had them
    # (the window need not split and count it again); ``None``: not made.
    history_units: tuple[Unit, ...] | None = None
    history_costs: tuple[int, ...] | None = None

    @property
    def history_and_checkpoint(self) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """The history without the checkpoint message, and that message (the window policy's arguments)."""
        if self.checkpoint_index is None:
            return list(self.messages), None
        i = self.checkpoint_index
        return list(self.messages[:i] + self.messages[i + 1 :]), self.messages[i]


def _costly(history: Sequence[HistoryEntry], estimator: TokenEstimator) -> bool:
    """Whether trimming ``history`` is worth a worker thread: a large history, unless the turn counted it
    already (a resent history, named when the turn began), when what is left costs less than the hop."""
    if not is_large(history):
        return False
    return not (isinstance(estimator, TurnEstimator) and estimator.has_counted([e.message for e in history]))


def is_large(history: Sequence[HistoryEntry]) -> bool:
    """Whether counting ``history`` is worth a worker thread (see ``OFFLOAD_MESSAGES``)."""
    if len(history) >= OFFLOAD_MESSAGES:
        return True
    chars = 0
    for record in history:
        content = record.message.get("content")
        # A rough size: string content and text parts, which is where the counting time goes.
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            texts = (part.get("text") for part in content if isinstance(part, Mapping))
            chars += sum(len(text) for text in texts if isinstance(text, str))
    return chars >= OFFLOAD_CHARS


class HistoryCompactor:
    """Compacts histories under token pressure; see the module docstring for the order of steps."""

    def __init__(self, config: CompactionConfig | None = None) -> None:
        self.config = config or CompactionConfig()
        # Earlier turns' previews, rendered once: every turn re-applies them to the resent history. And its
        # units, split once: every turn splits the resent history again.
        self._previews = PreviewMemo(self.config.preview)
        self._splits = SplitMemo()

    async def compact(
        self,
        history: Sequence[HistoryEntry],
        *,
        nonce: str,
        limit: int,
        estimator: TokenEstimator,
        summarizer: Summarizer | None = None,
        fixed_tokens: int = 0,
        checkpoints: Collection[Checkpoint] = (),
        previewed_refs: Collection[str] = (),
        known_refs: Collection[str] = (),
        forced: bool = False,
        stated_limit: int | None = None,
        output_reserve: int = 0,
        reader: str = READ_TOOL_OUTPUT,
        window: int | None = None,
    ) -> CompactionResult:
        """One compaction pass over ``history`` (the full canonical history, oldest first).

        ``fixed_tokens`` is what the system prompt, tool schemas and contributed data cost;
        ``checkpoints`` are the session's stored ones (any that covers a prefix is reused);
        ``known_refs`` adds references the checkpoint may cite beyond those of ``history``; ``nonce`` is
        the session's framing nonce and ``reader`` the name its tool-output reader is offered under;
        ``window`` is the context window the pressure percentages are of (``None``: ``limit``).
        """
        pressure = measure_pressure(
            limit=limit,
            fixed_tokens=fixed_tokens,
            history_tokens=0,
            config=self.config.pressure,
            forced=forced,
            stated_limit=stated_limit,
            output_reserve=output_reserve,
            window=window,
        )

        def trim() -> tuple[WorkingHistory, Pressure, CompactionTrace]:
            """Steps 0 and 1: everything before the summarizer, all synchronous."""
            work = WorkingHistory(history, estimator, nonce, reader, self._splits)
            before = fixed_tokens + sum(work.costs)
            trace = CompactionTrace(None, limit, pressure.threshold_tokens, pressure.target_tokens, before)
            self._reapply(work, checkpoints, set(previewed_refs), trace)
            trimmed = pressure.with_history(work.total())
            if trimmed.needed:
                trace.reason = trimmed.reason
                trace.compacted_refs = self._preview_old_bodies(work, trimmed)
            return work, trimmed, trace

        work, pressure, trace = await asyncio.to_thread(trim) if _costly(history, estimator) else trim()
        new_checkpoint = False
        if pressure.needed and summarizer is not None and fixed_tokens + work.total() > pressure.target_tokens:
            known = {e.tool_output_ref for e in history if e.tool_output_ref} | set(known_refs)
            new_checkpoint = await self._summarize(work, pressure, summarizer, known, trace)
        trace.tokens_after = fixed_tokens + work.total()
        return CompactionResult(
            tuple(work.render()),
            work.checkpoint,
            new_checkpoint,
            tuple(work.previewed_refs()),
            trace,
            work.head_end if work.checkpoint is not None else None,
            work.visible_units(),
            work.visible_costs(),
        )

    def _reapply(
        self, work: WorkingHistory, checkpoints: Collection[Checkpoint], previewed: set[str], trace: CompactionTrace
    ) -> None:
        """Step 0: the stored checkpoint of the longest covered prefix, and earlier previews."""
        position = {e.chain_hash: i for i, e in enumerate(work.entries)} if checkpoints else {}
        best: tuple[int, Checkpoint] | None = None
        for checkpoint in checkpoints:
            i = position.get(checkpoint.covers_hash, -1)
            if i >= work.head_end and (best is None or i > best[0]) and _reusable(work, checkpoint, i):
                best = (i, checkpoint)
        if best is not None:
            work.set_checkpoint(best[1], best[0])
            trace.reused_checkpoint = best[1].covers_hash
        if not previewed:
            return  # nothing was previewed on this branch: no entry to walk
        entries, visible = work.entries, work.visible
        for i in [i for i in range(work.start, len(entries)) if entries[i].tool_output_ref in previewed]:
            if i not in visible and self._try_preview(work, i):
                trace.reapplied_refs.append(str(entries[i].tool_output_ref))

    def _try_preview(self, work: WorkingHistory, i: int) -> bool:
        ref = work.entries[i].tool_output_ref
        if not ref or not is_valid_ref(ref) or work.messages[i].get("role") not in RESULT_ROLES:
            return False
        named = self._previews.named_preview(work.message(i), work.entries[i].chain_hash, ref, reader=work.reader)
        if named is None:
            return False
        preview, name = named
        # Characters shorter is not always tokens cheaper; a preview must never grow the history. Counted by
        # name: re-applied on every later turn, it is then looked up instead of digested again.
        cost = count_named(work.estimator, preview, name)
        if cost >= work.costs[i]:
            return False
        work.replace(i, preview, cost)
        return True

    def _preview_old_bodies(self, work: WorkingHistory, pressure: Pressure) -> list[str]:
        """Step 1: previews, oldest first, until under the target; then oversized latest-step bodies."""
        done: list[str] = []
        target = pressure.history_target
        oversized = pressure.limit * self.config.latest_body_percent // 100
        entries, costs, visible = work.entries, work.costs, work.visible
        candidates = list(range(work.start, work.latest))
        candidates += [i for i in range(max(work.start, work.latest), len(entries)) if costs[i] > oversized]
        # Only a tool output not shown otherwise yet can be previewed: the rest are left out here, in one
        # pass, rather than one call each (a warm turn over a long history walks them all every turn).
        candidates = [i for i in candidates if entries[i].tool_output_ref and i not in visible]
        total = work.total()  # kept by difference: re-summing per candidate is quadratic in long runs
        for i in candidates:
            if total <= target:
                break
            old = costs[i]
            if self._try_preview(work, i):
                total += costs[i] - old
                done.append(str(entries[i].tool_output_ref))
        return done

    async def _summarize(
        self, work: WorkingHistory, pressure: Pressure, summarizer: Summarizer, known: set[str], trace: CompactionTrace
    ) -> bool:
        """Step 2: rounds of summarization, each over the next oldest slice; True if one succeeded."""
        config = self.config
        target = pressure.history_target
        reserve = pressure.limit * config.checkpoint_percent // 100
        # The summarizer's request must fit the window too: its instructions and the checkpoint it writes
        # (``reserve``) come on top of the source, and a quarter is kept spare, since the calibration learned
        # on the session's calls (tools, JSON) may not hold for a transcript's prose (a local server's
        # tokenizer counted such a request 1.28x ours). Only a small window feels this: at 128k the source
        # cap is the smaller bound.
        instructions = sum(work.estimator.count_message(m) for m in build_summary_request([], reader=work.reader))
        room = (pressure.limit - instructions - reserve) * 3 // 4
        source_cap = max(1, min(pressure.limit * config.source_percent // 100, room))
        succeeded, halved = False, False
        rounds = 0
        while rounds < config.max_summary_rounds:
            if work.total() <= target:
                break
            plan = _plan_round(work, target - reserve, source_cap, config.min_split_tokens)
            if plan is None:
                break
            try:
                done = await self._summarize_round(work, plan, summarizer, known, reserve, trace)
            except _SummaryOverflow as overflow:
                # The summarizer's provider counted the request over its window where ours did not: once,
                # plan again with half the source (the next round's cap), as a turn's overflow is retried once.
                if halved or overflow.source_tokens <= 1:
                    break
                halved, source_cap = True, max(1, overflow.source_tokens // 2)
                continue
            if not done:
                break
            succeeded = True
            rounds += 1
            if not plan.capped:
                break
        return succeeded

    async def _summarize_round(
        self,
        work: WorkingHistory,
        plan: _Plan,
        summarizer: Summarizer,
        known: set[str],
        reserve: int,
        trace: CompactionTrace,
    ) -> bool:
        source = [(work.message(i), work.entries[i].tool_output_ref) for i in range(work.start, plan.stop)]
        covers = plan.stop - 1
        if plan.cut:
            covers = plan.stop
            text = content_text(work.messages[covers].get("content"))
            offset = work.checkpoint.split_chars if work.checkpoint and work.start == covers else 0
            head = dict(work.messages[covers])
            head["content"] = SPLIT_HEAD_NOTE + text[offset : plan.cut]
            source.append((head, None))
        estimator = work.estimator
        source_tokens = work.checkpoint_cost + sum(estimator.count_message(m) for m, _ in source)
        request = build_summary_request(source, work.checkpoint, max_tokens=reserve, reader=work.reader)
        # What accepting a checkpoint removes and adds, so a summary can never grow the history.
        removed = work.checkpoint_cost + sum(work.costs[work.start : covers + 1])
        tail_cost = 0
        if plan.cut:
            text = content_text(work.messages[covers].get("content"))
            tail_cost = estimator.count_message(split_tail(work.messages[covers], text, plan.cut))
        trace.summary_source_tokens = source_tokens
        for _ in range(self.config.max_summary_attempts):
            trace.attempts += 1
            try:
                text = await summarizer.summarize(request)
            # The summarizer is a model call behind a port: it may fail in any way, and a failed
            # summary must leave the deterministic trimming in place, not fail the turn. The error is
            # recorded in the trace, never swallowed silently.
            except ContextOverflow as exc:
                trace.errors.append(f"summarizer failed: {type(exc).__name__}: {exc}")
                raise _SummaryOverflow(source_tokens) from exc
            except Exception as exc:
                trace.errors.append(f"summarizer failed: {type(exc).__name__}: {exc}")
                continue
            report = validate_checkpoint(text, known)
            if not report.valid:
                trace.rejections.append("invalid structure: " + "; ".join(report.issues))
                continue
            checkpoint = Checkpoint(report.text, work.entries[covers].chain_hash, covers + 1 - work.head_end, plan.cut)
            cost = estimator.count_message(checkpoint.message(work.nonce))
            if cost >= source_tokens:
                trace.rejections.append(
                    f"checkpoint of {cost} tokens is not smaller than its source of {source_tokens}"
                )
                continue
            if cost + tail_cost >= removed:
                trace.rejections.append("checkpoint does not shrink the history")
                continue
            summarized = covers + 1 - work.start
            work.set_checkpoint(checkpoint, covers)
            trace.checkpoint_tokens = cost
            trace.summarized_messages += summarized
            trace.split_chars = plan.cut
            trace.unknown_refs = list(report.unknown_refs)
            trace.checkpoint_issues = list(report.issues)
            return True
        return False


def _reusable(work: WorkingHistory, checkpoint: Checkpoint, i: int) -> bool:
    """A stored checkpoint applies if its boundary is still a unit boundary before the latest step."""
    if i >= work.latest:
        return False
    if checkpoint.split_chars:
        message = work.messages[i]
        text = message.get("content")
        return message.get("role") == "user" and isinstance(text, str) and 0 < checkpoint.split_chars < len(text)
    return any(u.start == i + 1 for u in work.units) or i + 1 == len(work.messages)


class _SummaryOverflow(Exception):
    """The summarizer's provider refused its request as over its window."""

    def __init__(self, source_tokens: int) -> None:
        super().__init__(source_tokens)
        self.source_tokens = source_tokens


@dataclass(frozen=True)
class _Plan:
    """A summarization round: cover entries ``[work.start, stop)`` (+ the first ``cut`` chars of ``stop``)."""

    stop: int
    cut: int
    capped: bool  # the source cap cut the slice short; another round may follow


def _plan_round(work: WorkingHistory, suffix_budget: int, source_cap: int, min_split: int) -> _Plan | None:
    """Choose the kept suffix by token cost, then the oldest slice before it within ``source_cap``."""
    units = [u for u in work.units if u.start >= work.start]
    barrier = max(work.start, min([work.latest] + [u.start for u in units if u.unfinished]))
    remaining = suffix_budget - sum(work.costs[: work.head_end]) - sum(work.costs[barrier:])
    boundary, cut = barrier, 0
    for unit in reversed([u for u in units if u.stop <= barrier]):
        cost = sum(work.costs[unit.start : unit.stop])
        if cost <= remaining:
            remaining -= cost
            boundary = unit.start
            continue
        if remaining >= min_split:
            cut = _split_user_message(work, unit, remaining)
            if cut:
                boundary = unit.start
        break
    # Take the oldest units up to the boundary, within the source cap (always at least one unit).
    stop, used, capped = work.start, work.checkpoint_cost, False
    for unit in units:
        if unit.start >= boundary:
            break
        cost = sum(work.costs[unit.start : unit.stop])
        if stop > work.start and used + cost > source_cap:
            capped = True
            break
        used += cost
        stop = unit.stop
    if capped:
        cut = 0
    elif cut and stop > work.start and used + _head_cost(work, boundary, cut) > source_cap:
        cut, capped = 0, True
    if stop == work.start and not cut:
        return None
    return _Plan(stop, cut, capped)


def _head_cost(work: WorkingHistory, i: int, cut: int) -> int:
    """Tokens of the part of a split user message that goes to the summarizer."""
    text = content_text(work.messages[i].get("content"))
    offset = work.checkpoint.split_chars if work.checkpoint and work.start == i else 0
    return work.estimator.count_message({"role": "user", "content": SPLIT_HEAD_NOTE + text[offset:cut]})


def _split_user_message(work: WorkingHistory, unit: Unit, budget: int) -> int:
    """Where to cut a long user message so that its kept tail costs at most ``budget`` tokens, or 0.

    Only a plain-text user message is split. The cut is the smallest character position whose tail
    (with the note saying what was summarized) fits, moved forward to the next line start within 1,000
    characters, else to the next whitespace within 200, so words and lines stay whole where possible.
    The characters before the cut go to the summarizer; the tail stays verbatim after the checkpoint.
    """
    i = unit.start
    message = work.messages[i]
    text = message.get("content")
    if unit.kind != "message" or message.get("role") != "user" or not isinstance(text, str):
        return 0
    offset = work.checkpoint.split_chars if work.checkpoint and work.start == i else 0
    low, high = offset + 1, len(text) - 1
    if low > high or work.estimator.count_message(split_tail(message, text, high)) > budget:
        return 0
    while low < high:
        mid = (low + high) // 2
        if work.estimator.count_message(split_tail(message, text, mid)) <= budget:
            high = mid
        else:
            low = mid + 1
    cut = low
    newline = text.find("\n", cut, cut + 1000)
    if newline != -1 and newline + 1 < len(text):
        return newline + 1
    for j in range(cut, min(cut + 200, len(text) - 1)):
        if text[j].isspace():
            return j + 1
    return cut
