"""The assembly pipeline: the one place that knows the order of the stages (SPEC.md).

canonical history -> message-count compaction -> collect_detailed -> apply_context_budget -> renderer
-> token pressure + HistoryCompactor -> re-collect if the visible history changed -> composer (with
the atomic window) -> validator -> model input.

Pure: the caller loads the session (history, checkpoints, state) and persists what comes back
(a new checkpoint, the previewed references); the model is reached only through the ``Summarizer``
port. Contributor output is call-local and never enters the history handed back.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.context.budget import BudgetResult, apply_context_budget
from proxy.context.checkpoint import Checkpoint
from proxy.context.collector import Collection, collect_detailed
from proxy.context.compactor import CompactionResult, HistoryCompactor, HistoryRecord, Summarizer
from proxy.context.composer import DefaultContextMessageComposer
from proxy.context.estimators import TurnEstimator
from proxy.context.message_count import apply_message_count_cap
from proxy.context.previews import READ_TOOL_OUTPUT
from proxy.context.registry import ContextContributorRegistry
from proxy.context.renderer import DeterministicSystemPromptRenderer, RenderedPrompt
from proxy.context.state import PLAN, StateConfig, with_visibility
from proxy.context.types import ContributionRequest, Scope, TokenEstimator
from proxy.context.validator import ContextValidator
from proxy.context.window import AtomicHistoryWindowPolicy, WindowResult

_CLIENT_INSTRUCTION_ROLES = ("system", "developer")


@dataclass(frozen=True)
class AssemblerConfig:
    """Budgets as percentages of the effective input limit, and the optional message-count cap."""

    prompt_percent: int = 25  # the system prompt's share
    message_percent: int = 10  # contributor messages and attachments
    max_history_messages: int | None = None
    contributor_timeout_seconds: float = 5.0
    state: StateConfig = field(default_factory=StateConfig)
    # The full stage record (raw contributor output, the collection, the rendered context) is for trace
    # files; without them the turn records only what the runtime needs (compaction, plan progress).
    detailed_trace: bool = True


@dataclass(frozen=True)
class AssemblyInput:
    """One call's inputs, loaded by the caller."""

    scope: Scope
    context_id: str
    model: str
    turn: int
    history: Sequence[HistoryRecord]  # the canonical history, oldest first
    tools: Sequence[Mapping[str, Any]]  # the tools the model will be offered
    limit: int  # the effective input limit in tokens
    nonce: str  # the session's framing nonce, on every hidden message and checkpoint (``nonce.py``)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    # Offered too, but only once references are in play (compaction left a preview or a checkpoint):
    # read_tool_output is useless before, and offering it early changes the tool list for nothing.
    reference_tools: Sequence[Mapping[str, Any]] = ()
    reader: str = READ_TOOL_OUTPUT  # the name the tool-output reader is offered under; previews name it
    state: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    checkpoints: Sequence[Checkpoint] = ()
    previewed_refs: Sequence[str] = ()
    forced: bool = False
    stated_limit: int | None = None
    output_reserve: int = 0


@dataclass(frozen=True)
class AssemblyOutput:
    """The model input, what the caller must persist, and the trace of every stage."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    new_checkpoint: Checkpoint | None
    previewed_refs: tuple[str, ...]
    visible_history: tuple[dict[str, Any], ...]  # the history the model sees: compacted and windowed
    trace: dict[str, Any]


class ContextAssembler:
    """Runs the stages for one call. Holds no per-session state; the registry for a scope is frozen."""

    def __init__(
        self,
        registries: Callable[[Scope], ContextContributorRegistry],
        estimator: TokenEstimator,
        compactor: HistoryCompactor | None = None,
        config: AssemblerConfig | None = None,
    ) -> None:
        self._registries = registries
        self._estimator = estimator
        self._compactor = compactor or HistoryCompactor()
        self._config = config or AssemblerConfig()

    async def assemble(self, inp: AssemblyInput, summarizer: Summarizer | None = None) -> AssemblyOutput:
        """Assemble one call's input; raises ``AssemblyFailed`` when the minimum does not fit."""
        started = time.perf_counter()
        estimator = TurnEstimator(self._estimator)
        registry = self._registries(inp.scope)
        # The identity contributor renders the client's system/developer messages into the stable
        # prompt, verbatim; without one they stay in the history rather than being lost.
        instructions = [r for r in inp.history if _is_instruction(r.message)] if _has_identity(registry) else []
        records = [r for r in inp.history if not instructions or not _is_instruction(r.message)]
        cap = apply_message_count_cap([r.message for r in records], self._config.max_history_messages)
        kept = [records[i] for i in cap.kept_indices]
        history = [r.message for r in kept]

        # Contributors see the client's instructions first, then the visible history.
        leading = [r.message for r in instructions]
        state = self._visible_state(inp.state, history)
        tools = list(inp.tools)
        collection = await self._collect(registry, inp, leading + history, state, tools)
        admitted, prompt = self._admit(collection, inp, estimator)
        # Compaction plans as if the reference tools were offered: they may be, once it is done.
        fixed = self._fixed_tokens(prompt, admitted, [*tools, *inp.reference_tools], estimator, inp.nonce)
        compaction = await self._compactor.compact(
            kept,
            nonce=inp.nonce,
            reader=inp.reader,
            limit=inp.limit,
            estimator=estimator,
            summarizer=summarizer,
            fixed_tokens=fixed,
            checkpoints=inp.checkpoints,
            previewed_refs=inp.previewed_refs,
            forced=inp.forced,
            stated_limit=inp.stated_limit,
            output_reserve=inp.output_reserve,
        )
        if inp.reference_tools and (compaction.previewed_refs or compaction.checkpoint is not None):
            tools += inp.reference_tools
        recollected = list(compaction.messages) != history or len(tools) != len(inp.tools)
        if recollected:
            # Plan progress and skill visibility are judged against what the model will actually see.
            state = self._visible_state(inp.state, compaction.messages)
            collection = await self._collect(registry, inp, leading + list(compaction.messages), state, tools)
            admitted, prompt = self._admit(collection, inp, estimator)
        fixed = self._fixed_tokens(prompt, admitted, tools, estimator, inp.nonce)

        window_history, checkpoint_message = compaction.history_and_checkpoint
        composer = DefaultContextMessageComposer()
        window = AtomicHistoryWindowPolicy().apply(
            window_history, limit_tokens=inp.limit - fixed, estimator=estimator, checkpoint=checkpoint_message
        )
        if inp.state and len(window.kept_indices) < len(window_history):
            # The window dropped what compaction could not: judge visibility on what is really sent.
            state = self._visible_state(inp.state, window.messages)
            collection = await self._collect(registry, inp, leading + list(window.messages), state, tools)
            admitted, prompt = self._admit(collection, inp, estimator)
            fixed = self._fixed_tokens(prompt, admitted, tools, estimator, inp.nonce)
            window = AtomicHistoryWindowPolicy().apply(
                window_history, limit_tokens=inp.limit - fixed, estimator=estimator, checkpoint=checkpoint_message
            )
            recollected = True
        composed = composer.compose(
            prompt.text,
            window.messages,
            admitted.messages,
            admitted.attachments,
            nonce=inp.nonce,
            section_ids=prompt.section_ids,
        )
        estimated = ContextValidator().validate(
            composed,
            limit_tokens=inp.limit,
            estimator=estimator,
            nonce=inp.nonce,
            tools=tools,
            require_user=any(r.message.get("role") == "user" for r in inp.history),
        )
        trace: dict[str, Any] = (
            _trace(inp, collection, admitted, prompt, compaction, window, composed.messages, recollected, tools)
            if self._config.detailed_trace
            else {"compaction": _compaction_trace(inp, compaction, recollected)}
        )
        plan = state.get(PLAN) if state else None
        if isinstance(plan, Mapping) and plan.get("progress") is not None:
            trace["planProgress"] = plan["progress"]
        trace["cap"] = {"droppedMessages": cap.dropped_messages, "max": self._config.max_history_messages}
        trace["estimatedTokens"] = estimated
        trace["assemblyMs"] = round((time.perf_counter() - started) * 1000, 3)
        return AssemblyOutput(
            messages=[dict(m) for m in composed.messages],
            tools=[dict(t) for t in tools],
            new_checkpoint=compaction.checkpoint if compaction.new_checkpoint else None,
            previewed_refs=compaction.previewed_refs,
            visible_history=window.messages,
            trace=trace,
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
            options=inp.options,
        )
        return await collect_detailed(
            registry, request, timeout=self._config.contributor_timeout_seconds, keep_raw=self._config.detailed_trace
        )

    def _visible_state(self, state: Mapping[str, Any], visible: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
        """The run state with plan progress and skill visibility judged against ``visible`` (once per
        collection, so contributors need not each redo it)."""
        return with_visibility(state, visible, self._config.state) if state else state

    def _admit(
        self, collection: Collection, inp: AssemblyInput, estimator: TokenEstimator
    ) -> tuple[BudgetResult, RenderedPrompt]:
        prompt_budget = max(1, inp.limit * self._config.prompt_percent // 100)
        message_budget = max(1, inp.limit * self._config.message_percent // 100)
        admitted = apply_context_budget(collection, prompt_budget, message_budget, estimator, nonce=inp.nonce)
        return admitted, DeterministicSystemPromptRenderer().render(admitted.sections)

    def _fixed_tokens(
        self,
        prompt: RenderedPrompt,
        admitted: BudgetResult,
        tools: Sequence[Mapping[str, Any]],
        estimator: TokenEstimator,
        nonce: str,
    ) -> int:
        """What the call costs besides the history: system prompt, tool schemas, contributed messages."""
        hidden = DefaultContextMessageComposer().hidden_messages(admitted.messages, admitted.attachments, nonce=nonce)
        prompt_cost = estimator.count_message({"role": "system", "content": prompt.text}) if prompt.text else 0
        tool_cost = estimator.count_tools(tools) if tools else 0
        return prompt_cost + tool_cost + sum(estimator.count_message(m) for m in hidden)


def _has_identity(registry: ContextContributorRegistry) -> bool:
    return any(contributor.id == "identity" for contributor in registry)


def _is_instruction(message: Mapping[str, Any]) -> bool:
    return message.get("role") in _CLIENT_INSTRUCTION_ROLES


def _trace(
    inp: AssemblyInput,
    collection: Collection,
    admitted: BudgetResult,
    prompt: RenderedPrompt,
    compaction: CompactionResult,
    window: WindowResult,
    messages: Sequence[Mapping[str, Any]],
    recollected: bool,
    tools: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The stage records a schema-v5 trace holds (the runtime adds mode, budgets and llmInput)."""
    compaction_trace = _compaction_trace(inp, compaction, recollected)
    return {
        "contributors": [
            {
                "id": run.contributor_id,
                "status": run.status,
                "durationMs": run.duration_ms,
                "error": run.error,
                "rawOutput": _plain(run.raw_output),
            }
            for run in collection.runs
        ],
        "collection": _plain(
            {"sections": collection.sections, "messages": collection.messages, "attachments": collection.attachments}
        ),
        "admitted": admitted.to_trace(),
        "renderedContext": {
            "prompt": prompt.text,
            "sectionIds": list(prompt.section_ids),
            "callHistory": [dict(m) for m in messages],
            "tools": [dict(t) for t in tools],
            "window": window.to_trace(),
        },
        "compaction": compaction_trace,
    }


def _compaction_trace(inp: AssemblyInput, compaction: CompactionResult, recollected: bool) -> dict[str, Any]:
    """The compaction record: what the compactor did, the checkpoint in effect, and any recovery."""
    record = compaction.trace.to_trace()
    record["newCheckpoint"] = compaction.new_checkpoint
    record["checkpointCovers"] = compaction.checkpoint.covers_hash if compaction.checkpoint else None
    record["recollected"] = recollected
    if inp.forced:
        record["recovery"] = {"reason": "provider_context_overflow", "statedLimit": inp.stated_limit}
    return record


def _plain(value: Any) -> Any:
    """JSON-ready data from dataclasses, tuples and mappings (contributors may return either)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)
