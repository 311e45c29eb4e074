"""The observation port: what the turn runner tells metrics and spans, and what both read from it.

There is one observation point per model call: the runner's ``CallRecord`` (``proxy/runtime/trace_record.py``),
handed over when the call is finished (for a live stream, when the stream ends), whether or not traces are
written. Counters and spans are derived from that record here, not counted where things happen, so a
number on a dashboard and a trace file always describe the same call.

An observer must never fail a turn: ``Observers`` logs what one raises and carries on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from proxy.context.pipeline import AssemblyRecord
from proxy.runtime.assembly import TurnRequest
from proxy.runtime.trace_record import CallRecord

log = logging.getLogger("context_proxy.observe")

# The ingress notes' ``api`` names the wire format; the endpoint label names the route family.
_ENDPOINTS = {"anthropic-messages": "messages", "responses": "responses"}


class CallObserver(Protocol):
    """Receives every model call made for a client, and the proxy-owned tools run between calls."""

    def model_call(self, record: CallRecord) -> None:
        """A model call is finished (answered, failed, or its stream ended)."""

    def proxy_tool_calls(self, request: TurnRequest, tools: Sequence[str]) -> None:
        """The proxy ran these proxy-owned tools (one name per call) for ``request``'s model call."""


class Observers:
    """Several observers as one; a failing observer is logged and never reaches the turn."""

    def __init__(self, observers: Sequence[CallObserver]) -> None:
        self._observers = tuple(observers)

    def model_call(self, record: CallRecord) -> None:
        """Hand the finished call to every observer."""
        for observer in self._observers:
            try:
                observer.model_call(record)
            except Exception:  # an exporter's bug must not turn an answered request into an error
                log.exception("observer %s failed on a model call", type(observer).__name__)

    def proxy_tool_calls(self, request: TurnRequest, tools: Sequence[str]) -> None:
        """Hand the proxy-owned tool calls to every observer."""
        for observer in self._observers:
            try:
                observer.proxy_tool_calls(request, tools)
            except Exception:  # as above
                log.exception("observer %s failed on proxy tool calls", type(observer).__name__)


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
    """The summarizer calls the assembly of this call made (``model``, ``providerMs``, ``error``)."""
    candidate = record.candidate
    return candidate.record.summarizer_calls if candidate is not None and candidate.record is not None else ()


def checkpoint_sent(record: CallRecord) -> bool:
    """Whether the model saw a checkpoint in place of older history (dynamic mode sends the candidate)."""
    pipeline = assembly(record)
    applied = pipeline is not None and pipeline.compaction.checkpoint_covers is not None
    return applied and record.request.mode == "dynamic"


def now_ns() -> int:
    """Wall-clock nanoseconds (when a call is observed, it has just ended)."""
    return time.time_ns()
