"""The trace of a remote compaction: one schema-v5 file, like every other model call of the session.

A compaction request (Codex's ``compaction_trigger``, ``POST /v1/responses/compact``) is answered by the
summarizer, not by a turn, so it has no assembled context: ``collection``, ``admitted`` and
``renderedContext`` are null, ``llmInput`` is the summarizer's request, ``summarizerCalls`` each call
made, and ``compaction`` says what was covered and whether the deterministic fallback was used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.config import ModelRoute
from proxy.identity import SessionIdentity
from proxy.ingress.compaction import Compaction, summary_tokens
from proxy.runtime.trace import redact_llm_input
from proxy.runtime.turn import TurnRunner
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
    limits = runner.limits_for(route)
    nonce = runner.framing_nonce(identity.context_id)
    checkpoint_tokens = summary_tokens([outcome.checkpoint.message(nonce)])
    if outcome.calls:
        llm_input = dict(outcome.calls[-1]["llmInput"])
    else:  # nothing was sent; the request that would have been
        llm_input = redact_llm_input({**summary_route.litellm_params, "messages": outcome.summary_request})
    return {
        "contextId": identity.context_id,
        "contextIdSource": identity.source,
        "turn": turn,
        "mode": "dynamic",
        "scope": identity.scope,
        "model": summary_route.model_name,
        "selectedPath": "dynamic",
        "budgets": {
            "modelMaxTokens": limits.model_max_tokens,
            "outputReserveTokens": limits.output_reserve_tokens,
            "contextWindowTokens": limits.context_window_tokens,
            "effectiveInputTokens": limits.effective_input_tokens,
            "source": limits.source,
        },
        "session": {
            "headHash": reconciled.head_hash,
            "knownMessages": reconciled.known_count,
            "newMessages": len(reconciled.new_messages),
            "forked": reconciled.forked,
        },
        "contributors": [],
        "collection": None,
        "admitted": None,
        "renderedContext": None,
        "compaction": {
            "reason": "client_compaction_request",
            "tokens_before": summary_tokens(messages),
            "tokens_after": checkpoint_tokens,
            "compacted_refs": [],
            "summary_source_tokens": summary_tokens(outcome.summary_request),
            "checkpoint_tokens": checkpoint_tokens,
            "attempts": len(outcome.calls),
            "rejections": outcome.rejections,
            "summarized_messages": outcome.source_messages,
            **({"fallback": {"kind": "deterministic", "reason": outcome.fallback}} if outcome.fallback else {}),
        },
        "summarizerCalls": outcome.calls,
        "ingress": {
            "api": "responses",
            "request": "responses/compact" if compact_endpoint else "compaction_trigger",
        },
        "llmInput": llm_input,
    }
