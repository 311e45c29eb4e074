"""One model call's trace: the service's record of the call, and the one serializer to schema-v5 JSON.

The stages return typed records (``AssemblyRecord`` from the pipeline, ``CandidateRecord`` from the
session assembler, ``CompactionTrace`` from the compactor); the turn service adds what only it knows
(``CallRecord``). A remote compaction (no turn was assembled, the summarizer answered) is a
``CallRecord`` too, carrying its ``RemoteCompaction``. Nothing else builds trace JSON: ``trace_json``
is the only place that names a key, and ``trace_schema.json`` beside this module is its contract. Every
key is camelCase: dataclass field names are converted here, while the keys of data the trace quotes
(``llmInput``, a contributor's raw output given as a mapping, an ingress's notes) are kept as they were.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.context.collector import Collection, ContributorRun
from proxy.context.pipeline import AssemblyRecord, CompactionRecord, ContextBudgets, FailedAssembly, PipelineFailed
from proxy.kernel.errors import ProxyError
from proxy.kernel.usage import ModelPrices, ProviderUsage
from proxy.provider.redaction import redact_llm_input
from proxy.runtime.assembly import Candidate, CandidateRecord, TurnRequest
from proxy.runtime.calibration import CalibrationSample, TokenAccounting
from proxy.runtime.limits import ModelLimits
from proxy.runtime.remote_compaction import RemoteCompaction, summary_tokens
from proxy.session.store import Reconciliation

__all__ = ["CallRecord", "trace_json"]


@dataclass
class CallRecord:
    """One model call as the turn service saw it; the provider's outcome is filled in as the call goes."""

    request: TurnRequest
    candidate: Candidate | None  # None in legacy mode: nothing was assembled
    llm_input: dict[str, Any]
    client_tokens: int  # the client's own request, estimated like ``estimatedTokens``: what a passthrough sends
    recovery: int = 0  # 1 on the forced retry after a provider overflow
    recovery_reason: str = ""  # the provider's overflow message that caused the retry
    provider_error: Mapping[str, Any] | None = None  # the OpenAI-shaped error, when the call failed
    provider_ms: float | None = None
    # What the provider call is made with: ``llm_input`` plus the backend's own arguments (timeout,
    # retries; ``ProviderBackend.provider_arguments``). ``None``: ``llm_input`` as is. The trace shows this.
    provider_arguments: Mapping[str, Any] | None = None
    # Why nothing was sent: the assembly failed (``candidate`` and ``llm_input`` are then empty).
    assembly_error: BaseException | None = None
    # For metrics and spans (proxy/observe/), not the trace file: the failed call's HTTP status, the
    # usage the provider reported, and when the attempt began (wall clock, before assembly).
    provider_status: int | None = None
    usage: Mapping[str, Any] | None = None
    started_ns: int = 0
    # A client's compaction request answered by the summarizer (``TurnService.compact``): no candidate,
    # ``llm_input`` the summarizer's last (already redacted) request.
    compaction: RemoteCompaction | None = None
    # What the call cost at its route's prices (``ModelCalls.record`` sets it for every call that billed).
    cost: CallCost | None = None
    calibration: CalibrationSample | None = None  # what the answer taught the calibrated estimator (the trace's)


@dataclass(frozen=True)
class CallCost:
    """A call's cost in dollars at its route's prices, and that of the summarizer calls its assembly made.

    A figure nobody knows is ``None``, never 0: the cost map has no price for the model, or the provider
    reported no usage. ``unknown`` says which, so a report can show "unknown" rather than a free call."""

    usd: float | None
    summarizer_usd: float | None
    prices: ModelPrices | None
    unknown: tuple[str, ...] = ()


def trace_json(call: CallRecord) -> dict[str, Any]:
    """The schema-v5 trace of one model call (without ``schemaVersion``, which the writer adds)."""
    if call.compaction is not None:
        return _remote_compaction_json(call, call.compaction)
    request = call.request
    limits = request.limits
    reconciliation = request.reconciliation
    candidate_record = call.candidate.record if call.candidate is not None else None
    pipeline = candidate_record.pipeline if candidate_record is not None else None
    failed = call.assembly_error.record if isinstance(call.assembly_error, PipelineFailed) else None
    budgets = pipeline.budgets if pipeline is not None else failed.budgets if failed is not None else None
    trace: dict[str, Any] = {
        "contextId": request.identity.context_id,
        "contextIdSource": request.identity.source,
        "turn": request.turn,
        "mode": request.mode,
        "scope": request.identity.scope,
        "model": request.route.model_name,
        "selectedPath": "legacy" if call.candidate is None and call.assembly_error is None else "dynamic",
        "budgets": _budgets_json(limits, request.tokens, budgets),
        "session": {
            **_session_json(reconciliation),
            **({"branch": request.branch.record()} if request.branch is not None else {}),
        },
        **(_failed_pipeline_json(failed) if failed is not None else _pipeline_json(pipeline)),
        **_candidate_json(candidate_record),
    }
    if request.ingress:
        trace["ingress"] = _plain(request.ingress)
    # Set against the candidate, what the client's own request costs says what the proxy saved, in every mode.
    trace["clientTokens"] = call.client_tokens
    if call.assembly_error is not None:
        trace["assemblyError"] = _assembly_error_json(call.assembly_error, failed)
    if call.assembly_error is None or request.mode == "shadow":  # dynamic sends nothing when assembly failed
        trace["llmInput"] = redact_llm_input(
            call.provider_arguments if call.provider_arguments is not None else call.llm_input
        )
    if call.recovery:
        trace["recovery"] = {
            "attempt": call.recovery,
            "reason": "provider_context_overflow",
            "providerMessage": call.recovery_reason,
        }
    if call.provider_error is not None:
        trace["providerError"] = dict(call.provider_error)
    if call.provider_ms is not None:
        trace["providerMs"] = call.provider_ms
    if call.calibration is not None:
        sample = call.calibration
        trace["calibration"] = {
            "source": sample.source,
            "providerTokens": sample.provider_tokens,
            "localTokens": sample.local_tokens,
            **({"note": sample.note} if sample.note else {}),
        }
    trace.update(_billing_json(call))
    return trace


def _remote_compaction_json(call: CallRecord, compaction: RemoteCompaction) -> dict[str, Any]:
    """A remote compaction's trace: the stage keys null, ``compaction`` saying what was covered and whether
    the deterministic fallback was used."""
    request = call.request
    identity = request.identity
    outcome = compaction.outcome
    record: dict[str, Any] = {
        "reason": "client_compaction_request",
        "tokensBefore": compaction.tokens_before,
        "tokensAfter": compaction.checkpoint_tokens,
        "compactedRefs": [],
        "summarySourceTokens": summary_tokens(outcome.summary_request),
        "checkpointTokens": compaction.checkpoint_tokens,
        "attempts": len(outcome.calls),
        "rejections": list(outcome.rejections),
        "summarizedMessages": outcome.source_messages,
    }
    if outcome.fallback:
        record["fallback"] = {"kind": "deterministic", "reason": outcome.fallback}
    return {
        "contextId": identity.context_id,
        "contextIdSource": identity.source,
        "turn": request.turn,
        "mode": "dynamic",
        "scope": identity.scope,
        "model": compaction.summary_model,
        "selectedPath": "dynamic",
        "budgets": _budgets_json(request.limits, None),
        "session": _session_json(request.reconciliation),
        "contributors": [],
        "collection": None,
        "admitted": None,
        "renderedContext": None,
        "compaction": record,
        "summarizerCalls": _plain(outcome.calls),
        "ingress": {"api": "responses", "request": compaction.kind},
        "llmInput": dict(call.llm_input),
        **_billing_json(call),
    }


def _billing_json(call: CallRecord) -> dict[str, Any]:
    """The provider's usage with its prompt-cache figures, and the call's cost where its prices are known."""
    out: dict[str, Any] = {}
    usage = ProviderUsage.of(call.usage)
    if usage is not None:
        out["usage"] = _plain(usage)
    if call.cost is not None:
        out["cost"] = {
            "usd": call.cost.usd,
            "summarizerUsd": call.cost.summarizer_usd,
            "prices": _plain(call.cost.prices) if call.cost.prices is not None else None,
            "unknown": list(call.cost.unknown),
        }
    return out


def _budgets_json(
    limits: ModelLimits, tokens: TokenAccounting | None, context: ContextBudgets | None = None
) -> dict[str, Any]:
    """The model's limits and, when something was assembled, the budgets of contributed context."""
    return {
        "modelMaxTokens": limits.model_max_tokens,
        "outputReserveTokens": limits.output_reserve_tokens,
        "contextWindowTokens": limits.context_window_tokens,
        "effectiveInputTokens": limits.effective_input_tokens,
        "source": limits.source,
        **({"estimator": _estimator_json(tokens)} if tokens is not None else {}),
        **(
            {"promptBudgetTokens": context.prompt_tokens, "messageBudgetTokens": context.message_tokens}
            if context is not None
            else {}
        ),
    }


def _assembly_error_json(error: BaseException, failed: FailedAssembly | None) -> dict[str, Any]:
    """The error the client got for a failed assembly (its OpenAI error body and status), and the stage."""
    if isinstance(error, ProxyError):
        body: dict[str, Any] = {**error.body()["error"], "status": error.status}
    else:  # not a ProxyError: the app answers 500
        body = {"message": f"{type(error).__name__}: {error}", "type": "api_error", "param": None, "code": None}
        body["status"] = 500
    body["stage"] = failed.stage if failed is not None else None
    if failed is not None and failed.shortfall is not None:  # a failure of room: its numbers and settings
        shortfall = failed.shortfall
        body.update(neededTokens=shortfall.needed_tokens, budgetTokens=shortfall.budget_tokens)
        body["settings"] = list(shortfall.settings)
    return body


def _failed_pipeline_json(record: FailedAssembly) -> dict[str, Any]:
    """The stage keys of a failed assembly: the contributors that ran and what they gave, the cap; the
    later stages (admission, rendering, compaction) null."""
    return {
        "contributors": _runs_json(record.runs),
        "collection": _collection_json(record.collection),
        "admitted": None,
        "renderedContext": None,
        "compaction": None,
        "cap": _cap_json(record.cap_dropped_messages, record.cap_max, record.cap_diagnostics),
        "assemblyMs": record.assembly_ms,
    }


def _cap_json(dropped: int, maximum: int | None, diagnostics: Sequence[Any]) -> dict[str, Any]:
    return {"droppedMessages": dropped, "max": maximum, "diagnostics": _plain(list(diagnostics))}


def _session_json(reconciliation: Reconciliation) -> dict[str, Any]:
    return {
        "headHash": reconciliation.head_hash,
        "knownMessages": reconciliation.known_count,
        "newMessages": len(reconciliation.new_messages),
        "forked": reconciliation.forked,
    }


def _estimator_json(tokens: TokenAccounting) -> dict[str, Any]:
    """How this call counted tokens: the estimator, its encoding, and a calibrated route's correction."""
    correction = tokens.correction
    return {
        "name": tokens.name,
        "encoding": tokens.encoding,
        "ratio": correction.ratio if correction else None,
        "margin": correction.margin if correction else None,
        "samples": correction.samples if correction else 0,
    }


def _pipeline_json(record: AssemblyRecord | None) -> dict[str, Any]:
    """The assembly stages; ``null`` (and no contributors) when nothing was assembled or recorded."""
    if record is None:
        return {"contributors": [], "collection": None, "admitted": None, "renderedContext": None, "compaction": None}
    rendered = record.rendered
    trace: dict[str, Any] = {
        "contributors": _contributors_json(record.collection),
        "collection": _collection_json(record.collection),
        "admitted": _plain(record.admitted),
        "renderedContext": None
        if rendered is None
        else {
            "prompt": rendered.prompt.text,
            "sectionIds": list(rendered.prompt.section_ids),
            "callHistory": [dict(m) for m in rendered.call_history],
            "tools": [dict(t) for t in rendered.tools],
            "window": {
                "statistics": _plain(rendered.window.statistics),
                "diagnostics": _plain(rendered.window.diagnostics),
            },
        },
        "compaction": _compaction_json(record.compaction),
    }
    if record.plan_progress is not None:
        trace["planProgress"] = _plain(record.plan_progress)
    trace["cap"] = _cap_json(record.cap_dropped_messages, record.cap_max, record.cap_diagnostics)
    trace["estimatedTokens"] = record.estimated_tokens
    trace["assemblyMs"] = record.assembly_ms
    return trace


def _contributors_json(collection: Collection | None) -> list[dict[str, Any]]:
    return [] if collection is None else _runs_json(collection.runs)


def _runs_json(runs: Sequence[ContributorRun]) -> list[dict[str, Any]]:
    return [
        {
            "id": run.contributor_id,
            "status": run.status,
            "durationMs": run.duration_ms,
            "error": run.error,
            "rawOutput": _plain(run.raw_output),
        }
        for run in runs
    ]


def _collection_json(collection: Collection | None) -> dict[str, Any] | None:
    if collection is None:
        return None
    return {
        "sections": _plain(collection.sections),
        "messages": _plain(collection.messages),
        "attachments": _plain(collection.attachments),
        # Contributor failures and what contributors reported (a skipped skill, a bad option); the
        # budget's cuts are ``admitted.diagnostics``, the window's ``renderedContext.window.diagnostics``.
        "diagnostics": _plain(collection.diagnostics),
    }


def _compaction_json(record: CompactionRecord) -> dict[str, Any]:
    """What the compactor did, the checkpoint in effect, and (on a forced pass) the recovery."""
    trace: dict[str, Any] = _plain(record.pass_record)
    trace["newCheckpoint"] = record.new_checkpoint
    trace["checkpointCovers"] = record.checkpoint_covers
    trace["recollected"] = record.recollected
    if record.forced:
        trace["recovery"] = {"reason": "provider_context_overflow", "statedLimit": record.stated_limit}
    return trace


def _candidate_json(record: CandidateRecord | None) -> dict[str, Any]:
    """What the session assembler added: its summarizer calls, a summarizing back-off, unreadable state."""
    if record is None:
        return {}
    trace: dict[str, Any] = {"summarizerCalls": _plain(record.summarizer_calls)}
    if record.summary_backoff is not None:
        trace["summaryBackoff"] = _plain(record.summary_backoff)
    if record.store_diagnostics:
        trace["storeDiagnostics"] = list(record.store_diagnostics)
    return trace


def _plain(value: Any) -> Any:
    """JSON-ready data: a dataclass's fields under camelCase names, mappings with their own keys."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {_camel(f.name): _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)
