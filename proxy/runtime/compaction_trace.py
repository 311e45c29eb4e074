"""The trace of a remote compaction: one schema-v5 file, like every other model call of the session.

A compaction request (Codex's ``compaction_trigger``, ``POST /v1/responses/compact``) is answered by the
summarizer, not by a turn, so it has no assembled context: ``collection``, ``admitted`` and
``renderedContext`` are null, ``llmInput`` is the summarizer's request, ``summarizerCalls`` each call
made, and ``compaction`` says what was covered and whether the deterministic fallback was used. The
keys are named by ``proxy/runtime/trace_record.py``, like every trace's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.ingress.identify import SessionIdentity
from proxy.kernel.config import ModelRoute
from proxy.provider.redaction import redact_llm_input
from proxy.runtime.remote_compaction import Compaction, summary_tokens
from proxy.runtime.service import TurnRunner
from proxy.runtime.trace_record import RemoteCompactionRecord, remote_compaction_json
from proxy.session.store import Reconciliation


def compaction_trace(
    runner: TurnRunner,
    route: ModelRoute,
    summary_route: ModelRoute,
    identity: SessionIdentity,
    reconciled: Reconciliation,
    turn: int,
    messages: Sequence[dict[str, Any]],
    outcome: Compaction,
    compact_endpoint: bool,
) -> dict[str, Any]:
    """The trace record (``TraceWriter.write`` adds the schema version)."""
    nonce = runner.framing_nonce(identity.context_id)
    checkpoint_tokens = summary_tokens([outcome.checkpoint.message(nonce)])
    if outcome.calls:
        llm_input = dict(outcome.calls[-1]["llmInput"])
    else:  # nothing was sent; the request that would have been
        llm_input = redact_llm_input({**summary_route.litellm_params, "messages": outcome.summary_request})
    return remote_compaction_json(
        RemoteCompactionRecord(
            identity=identity,
            turn=turn,
            model=summary_route.model_name,
            limits=runner.limits_for(route),
            reconciliation=reconciled,
            tokens_before=summary_tokens(messages),
            tokens_after=checkpoint_tokens,
            summary_source_tokens=summary_tokens(outcome.summary_request),
            checkpoint_tokens=checkpoint_tokens,
            summarizer_calls=outcome.calls,
            rejections=outcome.rejections,
            summarized_messages=outcome.source_messages,
            fallback=outcome.fallback,
            request_kind="responses/compact" if compact_endpoint else "compaction_trigger",
            llm_input=llm_input,
        )
    )
