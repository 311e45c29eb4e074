"""The context pipeline: the one place that knows the order of the stages (SPEC.md).

canonical history -> message-count cap -> a pass (run state -> collect_detailed -> apply_context_budget
-> renderer) -> token pressure + HistoryCompactor -> the atomic window, with the pass run again while
the visible history changes (at most three passes) -> composer -> validator -> model input.

Pure: the caller loads the session (history, checkpoints, state) and persists what comes back
(a new checkpoint, the previewed references); the model is reached only through the ``Summarizer``
port. Contributor output is call-local and never enters the history handed back.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.context.budget import BudgetResult, apply_context_budget
from proxy.context.checkpoint import Checkpoint
from proxy.context.collector import Collection, ContributorRun, ProtectedContributorFailed, collect_detailed
from proxy.context.compactor import CompactionTrace, HistoryCompactor, Summarizer
from proxy.context.composer import DefaultContextMessageComposer
from proxy.context.message_count import apply_message_count_cap
from proxy.context.previews import READ_TOOL_OUTPUT
from proxy.context.registry import ContextContributorRegistry, Registries, RunRegistries
from proxy.context.renderer import DeterministicSystemPromptRenderer, RenderedPrompt
from proxy.context.shortfall import ContextDoesNotFit, FixedParts, LimitBasis, Shortfall, explain
from proxy.context.state import PLAN, StateConfig, with_visibility
from proxy.context.turn_estimator import TurnEstimator
from proxy.context.types import ContributionRequest, Diagnostic, Scope, TokenEstimator
from proxy.context.validator import ContextValidator
from proxy.context.window import AtomicHistoryWindowPolicy, WindowResult
from proxy.kernel.canonical import HistoryEntry
from proxy.kernel.errors import AssemblyFailed

_CLIENT_INSTRUCTION_ROLES = ("system", "developer")
_MAX_PASSES = 3  # the first, after compaction, after the window: each only when the visible history changed


@dataclass(frozen=True)
class PipelineConfig:
    """Budgets as percentages of the effective input limit, and the optional message-count cap."""

    prompt_percent: int = 25  # the system prompt's share
    message_percent: int = 10  # contributor messages and attachments
    max_history_messages: int | None = None
    contributor_timeout_seconds: float = 5.0
    state: StateConfig = field(default_factory=StateConfig)
    # The full stage record (raw contributor output, the collection, the rendered context) is for trace
    # files; without them the turn records only what the runtime needs (compaction, plan progress).
    detailed_trace: bool = True

    def budgets(self, limit: int) -> ContextBudgets:
        """The token budgets of contributed context for an effective input limit of ``limit`` tokens."""
        return ContextBudgets(
            prompt_tokens=max(1, limit * self.prompt_percent // 100),
            message_tokens=max(1, limit * self.message_percent // 100),
        )


@dataclass(frozen=True)
class ContextBudgets:
    """What contributed context may cost in one call: the system prompt's sections (``prompt_tokens``),
    and the contributor messages and attachments together (``message_tokens``)."""

    prompt_tokens: int
    message_tokens: int


@dataclass(frozen=True)
class AssemblyInput:
    """One call's inputs, loaded by the caller."""

    scope: Scope
    context_id: str
    model: str
    turn: int
    history: Sequence[HistoryEntry]  # the canonical history, oldest first
    tools: Sequence[Mapping[str, Any]]  # the tools the model will be offered
    limit: int  # the effective input limit in tokens
    nonce: str  # the session's framing nonce, on every hidden message and checkpoint (``nonce.py``)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    reader: str = READ_TOOL_OUTPUT  # the name the tool-output reader is offered under; previews name it
    state: Mapping[str, Any] = field(default_factory=dict)
    checkpoints: Sequence[Checkpoint] = ()
    previewed_refs: Sequence[str] = ()
    forced: bool = False
    stated_limit: int | None = None
    output_reserve: int = 0
    window: int | None = None  # the context window compaction's percentages are of (None: ``limit``)
    # This call's token counter (a route's calibrated one); None: the assembler's own.
    estimator: TokenEstimator | None = None


@dataclass(frozen=True)
class CompactionRecord:
    """What compaction did for this call: the compactor's own record and what the pipeline made of it."""

    pass_record: CompactionTrace
    new_checkpoint: bool
    checkpoint_covers: str | None  # the chain hash the checkpoint in effect covers
    recollected: bool  # contributors ran again because the visible history changed
    forced: bool  # a forced pass after a provider overflow
    stated_limit: int | None  # the window the provider stated, on a forced pass


@dataclass(frozen=True)
class RenderedContext:
    """The candidate as composed: the prompt, the call's messages and tools, the window's statistics."""

    prompt: RenderedPrompt
    call_history: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...]
    window: WindowResult


@dataclass(frozen=True)
class AssemblyRecord:
    """The pipeline's stage results for one call, as plain data (``proxy/runtime/trace_record.py``
    serializes them). ``collection``, ``admitted`` and ``rendered`` are ``None`` without detailed traces."""

    compaction: CompactionRecord
    estimated_tokens: int
    cap_dropped_messages: int
    cap_max: int | None
    assembly_ms: float
    plan_progress: Mapping[str, Any] | None = None
    collection: Collection | None = None
    admitted: BudgetResult | None = None
    rendered: RenderedContext | None = None
    budgets: ContextBudgets | None = None  # None: recorded by something that knows no budgets (tests)
    cap_diagnostics: tuple[Diagnostic, ...] = ()  # the message-count cap's notes


@dataclass(frozen=True)
class FailedAssembly:
    """How far the pipeline got when a stage failed: what the failed call's trace can still say.

    ``stage`` is where it failed (``collect``: a protected contributor; ``budget``: protected sections
    over the prompt budget; ``window``: the kept minimum over the limit; ``validate``: the composed
    input). ``runs`` are the contributors' runs of the last pass (empty if none ran); ``collection``
    that pass's validated collection (``None`` without detailed traces or when collecting failed);
    ``shortfall`` what was needed of which budget, and the settings that change it, when the failure
    was one of room.
    """

    stage: str
    budgets: ContextBudgets
    cap_dropped_messages: int
    cap_max: int | None
    cap_diagnostics: tuple[Diagnostic, ...]
    runs: tuple[ContributorRun, ...]
    collection: Collection | None
    assembly_ms: float
    shortfall: Shortfall | None = None


class PipelineFailed(AssemblyFailed):
    """A stage's ``AssemblyFailed``, unchanged for the client (same message, status and code), with the
    pipeline's ``record`` of how far it got, for the trace."""

    def __init__(self, cause: AssemblyFailed, record: FailedAssembly) -> None:
        super().__init__(cause.message, status=cause.status, type=cause.type, code=cause.code, param=cause.param)
        self.headers = cause.headers
        self.record = record


@dataclass
class _Progress:
    """Where one assembly is, kept as it goes so that a failure can be recorded (``FailedAssembly``)."""

    started: float
    budgets: ContextBudgets
    stage: str = "cap"
    cap_dropped_messages: int = 0
    cap_diagnostics: tuple[Diagnostic, ...] = ()
    collection: Collection | None = None
    estimator_factor: float = 1.0  # the turn's counter's scale, for a failure's explanation
    fixed: FixedParts | None = None  # what the window's pass costs besides the history

    def failed(self, cause: AssemblyFailed, cap_max: int | None, detailed: bool) -> FailedAssembly:
        if isinstance(cause, ProtectedContributorFailed):
            runs = cause.runs
        else:
            runs = self.collection.runs if self.collection is not None else ()
        return FailedAssembly(
            stage=self.stage,
            budgets=self.budgets,
            cap_dropped_messages=self.cap_dropped_messages,
            cap_max=cap_max,
            cap_diagnostics=self.cap_diagnostics,
            runs=runs if detailed else tuple(dataclasses.replace(r, raw_output=None) for r in runs),
            collection=self.collection if detailed else None,
            assembly_ms=round((time.perf_counter() - self.started) * 1000, 3),
            shortfall=cause.shortfall if isinstance(cause, ContextDoesNotFit) else None,
        )


@dataclass(frozen=True)
class AssemblyOutput:
    """The model input, what the caller must persist, and the record of every stage."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    new_checkpoint: Checkpoint | None
    previewed_refs: tuple[str, ...]
    visible_history: tuple[dict[str, Any], ...]  # the history the model sees: compacted and windowed
    record: AssemblyRecord


class ContextPipeline:
    """Runs the stages for one call. Holds no per-session state but each run's contributors (``registries``,
    a ``RunRegistries``; or one frozen registry per scope, for every run)."""

    def __init__(
        self,
        registries: Registries,
        estimator: TokenEstimator,
        compactor: HistoryCompactor | None = None,
        config: PipelineConfig | None = None,
    ) -> None:
        self._registries = registries
        self._estimator = estimator
        self._compactor = compactor or HistoryCompactor()
        self._config = config or PipelineConfig()

    async def assemble(self, inp: AssemblyInput, summarizer: Summarizer | None = None) -> AssemblyOutput:
        """Assemble one call's input; raises ``PipelineFailed`` (an ``AssemblyFailed``, with the record of
        how far it got) when the minimum does not fit."""
        progress = _Progress(time.perf_counter(), self._config.budgets(inp.limit))
        try:
            return await self._assemble(inp, summarizer, progress)
        except AssemblyFailed as failed:
            cause = self._explained(failed, inp, progress) if isinstance(failed, ContextDoesNotFit) else failed
            record = progress.failed(cause, self._config.max_history_messages, self._config.detailed_trace)
            raise PipelineFailed(cause, record) from failed

    def _explained(self, failed: ContextDoesNotFit, inp: AssemblyInput, progress: _Progress) -> ContextDoesNotFit:
        """A failure of room, with the numbers and settings of the budgets it ran out of."""
        basis = LimitBasis(
            limit=inp.limit,
            window=inp.window,
            output_reserve=inp.output_reserve,
            prompt_percent=self._config.prompt_percent,
            message_percent=self._config.message_percent,
            estimator_factor=progress.estimator_factor,
            stated_limit=inp.stated_limit,
        )
        return explain(failed, basis, progress.fixed)

    async def _assemble(self, inp: AssemblyInput, summarizer: Summarizer | None, progress: _Progress) -> AssemblyOutput:
        started = progress.started
        given = inp.estimator or self._estimator
        # One memo per turn: the turn's own counter when it has one (shared with the trace and calibration).
        estimator = given if isinstance(given, TurnEstimator) else TurnEstimator(given)
        progress.estimator_factor = estimator.factor
        # The history is named by chain hashes: its unchanged prefix is counted by name, not hashed again.
        estimator.name_history(inp.history)
        registries = self._registries
        if isinstance(registries, RunRegistries):  # the run's own contributors (proxy/context/registry.py)
            registry = registries.for_run(inp.scope, inp.context_id, (e.chain_hash for e in reversed(inp.history)))
        else:
            registry = registries(inp.scope)
        # A protected contributor that declares it (identity) renders the client's system/developer messages
        # into the stable prompt, verbatim; without one they stay in the history rather than being lost.
        owned = registry.owns_client_instructions
        roles = _CLIENT_INSTRUCTION_ROLES
        instructions = [r for r in inp.history if r.message.get("role") in roles] if owned else []
        records = [r for r in inp.history if r.message.get("role") not in roles] if instructions else list(inp.history)
        cap = apply_message_count_cap([r.message for r in records], self._config.max_history_messages)
        progress.cap_dropped_messages, progress.cap_diagnostics = cap.dropped_messages, cap.diagnostics
        kept = [records[i] for i in cap.kept_indices] if cap.dropped_messages else records
        history: list[dict[str, Any]] = [dict(r.message) for r in kept]

        # Contributors see the client's instructions first, then the visible history.
        leading = [r.message for r in instructions]
        tools = list(inp.tools)
        stage = await self._pass(registry, inp, leading, history, tools, estimator, progress)
        fixed = stage.fixed_parts(tools, estimator, inp.nonce)  # again only after a pass of its own
        compaction = await self._compactor.compact(
            kept,
            nonce=inp.nonce,
            reader=inp.reader,
            limit=inp.limit,
            estimator=estimator,
            summarizer=summarizer,
            fixed_tokens=fixed.total,
            checkpoints=inp.checkpoints,
            previewed_refs=inp.previewed_refs,
            forced=inp.forced,
            stated_limit=inp.stated_limit,
            output_reserve=inp.output_reserve,
            window=inp.window,
        )
        window_history, checkpoint_message = compaction.history_and_checkpoint
        # Plan progress and skill visibility are judged against what the model will actually see: the
        # pass runs again while that changes (compaction rewrote the history, the window dropped what
        # compaction could not), at most _MAX_PASSES times in all.
        passes, visible = 1, history
        upcoming = list(compaction.messages)
        changed = upcoming != history
        windows: dict[int, WindowResult] = {}  # by the limit: a pass that leaves it as it was windows alike
        while True:
            if changed:
                visible = upcoming
                stage = await self._pass(registry, inp, leading, visible, tools, estimator, progress)
                fixed = stage.fixed_parts(tools, estimator, inp.nonce)
                passes += 1
            progress.stage = "window"
            progress.fixed = fixed
            window_limit = inp.limit - progress.fixed.total
            window = windows.get(window_limit) or AtomicHistoryWindowPolicy().apply(
                window_history,
                limit_tokens=window_limit,
                estimator=estimator,
                checkpoint=checkpoint_message,
                units=compaction.history_units,
                costs=compaction.history_costs,
            )
            windows[window_limit] = window
            upcoming = list(window.messages)
            dropped = len(window.kept_indices) < len(window_history)
            # Without run state, what the window drops changes no contribution: no pass needed.
            changed = bool(inp.state) and dropped and upcoming != visible
            if not changed or passes >= _MAX_PASSES:
                break
        recollected = passes > 1
        state, collection, admitted, prompt = stage.state, stage.collection, stage.admitted, stage.prompt
        composer = DefaultContextMessageComposer()
        composed = composer.compose(
            prompt.text,
            window.messages,
            admitted.messages,
            admitted.attachments,
            nonce=inp.nonce,
            section_ids=prompt.section_ids,
        )
        progress.stage = "validate"
        estimated = ContextValidator().validate(
            composed,
            limit_tokens=inp.limit,
            estimator=estimator,
            nonce=inp.nonce,
            tools=tools,
            require_user=any(r.message.get("role") == "user" for r in inp.history),
        )
        detailed = self._config.detailed_trace
        plan = state.get(PLAN) if state else None
        record = AssemblyRecord(
            compaction=CompactionRecord(
                pass_record=compaction.trace,
                new_checkpoint=compaction.new_checkpoint,
                checkpoint_covers=compaction.checkpoint.covers_hash if compaction.checkpoint else None,
                recollected=recollected,
                forced=inp.forced,
                stated_limit=inp.stated_limit,
            ),
            estimated_tokens=estimated,
            cap_dropped_messages=cap.dropped_messages,
            cap_max=self._config.max_history_messages,
            assembly_ms=round((time.perf_counter() - started) * 1000, 3),
            plan_progress=plan["progress"] if isinstance(plan, Mapping) and plan.get("progress") is not None else None,
            collection=collection if detailed else None,
            admitted=admitted if detailed else None,
            rendered=(
                RenderedContext(
                    prompt, tuple(dict(m) for m in composed.messages), tuple(dict(t) for t in tools), window
                )
                if detailed
                else None
            ),
            budgets=progress.budgets,
            cap_diagnostics=cap.diagnostics,
        )
        return AssemblyOutput(
            messages=list(composed.messages),  # the window's messages, not copies (see the composer)
            tools=[dict(t) for t in tools],
            new_checkpoint=compaction.checkpoint if compaction.new_checkpoint else None,
            previewed_refs=compaction.previewed_refs,
            visible_history=window.messages,
            record=record,
        )

    async def _collect(
        self,
        registry: ContextContributorRegistry,
        inp: AssemblyInput,
        history: Sequence[Mapping[str, Any]],
        state: Mapping[str, Any],
        tools: Sequence[Mapping[str, Any]],
    ) -> Collection:
        request = ContributionRequest(
            scope=inp.scope,
            context_id=inp.context_id,
            history=history,
            tools=tools,
            metadata=inp.metadata,
            headers=inp.headers,
            state=state,
            model=inp.model,
            turn=inp.turn,
            budget_tokens=inp.limit,
        )
        return await collect_detailed(
            registry, request, timeout=self._config.contributor_timeout_seconds, keep_raw=self._config.detailed_trace
        )

    async def _pass(
        self,
        registry: ContextContributorRegistry,
        inp: AssemblyInput,
        leading: Sequence[Mapping[str, Any]],
        visible: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        estimator: TokenEstimator,
        progress: _Progress,
    ) -> _Pass:
        """One pass over ``visible``: run state, collect, admit within the budgets, render the prompt."""
        # Visibility is judged once per pass, so contributors need not each redo it.
        state = with_visibility(inp.state, visible, self._config.state) if inp.state else inp.state
        progress.stage = "collect"
        collection = await self._collect(registry, inp, [*leading, *visible], state, tools)
        progress.stage, progress.collection = "budget", collection
        budgets = progress.budgets
        admitted = apply_context_budget(
            collection, budgets.prompt_tokens, budgets.message_tokens, estimator, nonce=inp.nonce
        )
        return _Pass(state, collection, admitted, DeterministicSystemPromptRenderer().render(admitted.sections))


@dataclass(frozen=True)
class _Pass:
    """What one pass over a visible history gave: the run state, the collection, what was admitted."""

    state: Mapping[str, Any]
    collection: Collection
    admitted: BudgetResult
    prompt: RenderedPrompt

    def fixed_parts(self, tools: Sequence[Mapping[str, Any]], estimator: TokenEstimator, nonce: str) -> FixedParts:
        """What the call costs besides the history, part by part: system prompt, tool schemas, contributed
        messages."""
        admitted = self.admitted
        hidden = DefaultContextMessageComposer().hidden_messages(admitted.messages, admitted.attachments, nonce=nonce)
        prompt = self.prompt.text
        prompt_cost = estimator.count_message({"role": "system", "content": prompt}) if prompt else 0
        tool_cost = estimator.count_tools(tools) if tools else 0
        return FixedParts(prompt_cost, tool_cost, sum(estimator.count_message(m) for m in hidden))
