"""What metrics and spans read from a model call's record (``CallRecord``): its endpoint, status, outcome,
assembly and summarizer calls.

There is one observation point per model call: the turn service hands each finished call's record to
its observers (``proxy/runtime/observers.py``), whether or not traces are written. Counters and spans are
derived from that record here, not counted where things happen, so a number on a dashboard and a trace
file always describe the same call.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.context.pipeline import AssemblyRecord
from proxy.runtime.trace_record import CallRecord

# The ingress notes' ``api`` names the wire format; the endpoint label names the route family.
_ENDPOINTS = {"anthropic-messages": "messages", "responses": "responses"}


def made_model_call(record: CallRecord) -> bool:
    """Whether the provider was called: a record of an attempt that stopped before the call (its assembly
    failed) has no provider time."""
    return record.provider_ms is not None


def endpoint(record: CallRecord) -> str:
    """The ingress the client used: ``chat``, ``responses`` or ``messages``."""
    ingress = record.request.ingress or {}
    api = ingress.get("api")
    return _ENDPOINTS.get(api, str(api)) if isinstance(api, str) else "chat"


def status(record: CallRecord) -> int:
    """The call's outcome as an HTTP status: 200, or the status of the error it ended with."""
    if record.provider_error is None:
        return 200
    return record.provider_status or 500


def outcome(error: Mapping[str, Any] | None) -> str:
    """``success``, ``overflow`` (the provider refused the request for size) or ``error``."""
    if error is None:
        return "success"
    return "overflow" if error.get("code") == "context_length_exceeded" else "error"


def assembly(record: CallRecord) -> AssemblyRecord | None:
    """The pipeline's record of this call's candidate (``None``: legacy, or an assembler keeping none)."""
    candidate = record.candidate
    return candidate.record.pipeline if candidate is not None and candidate.record is not None else None


def summarizer_calls(record: CallRecord) -> Sequence[Mapping[str, Any]]:
    """The summarizer calls this call made (``model``, ``providerMs``, ``error``): in its assembly, or for a
    client's compaction request."""
    if record.compaction is not None:
        return record.compaction.outcome.calls
    candidate = record.candidate
    return candidate.record.summarizer_calls if candidate is not None and candidate.record is not None else ()


def compaction_reason(record: CallRecord) -> str | None:
    """Why this call compacted: the assembly's pressure pass, or a client's compaction request; ``None``
    when it did not."""
    if record.compaction is not None:
        return "client_compaction_request"
    pipeline = assembly(record)
    return pipeline.compaction.pass_record.reason if pipeline is not None else None


def checkpoint_sent(record: CallRecord) -> bool:
    """Whether the model saw a checkpoint in place of older history (dynamic mode sends the candidate)."""
    pipeline = assembly(record)
    applied = pipeline is not None and pipeline.compaction.checkpoint_covers is not None
    return applied and record.request.mode == "dynamic"


def now_ns() -> int:
    """Wall-clock nanoseconds (when a call is observed, it has just ended)."""
    return time.time_ns()
