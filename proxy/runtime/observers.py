"""The observation port: every model call the turn service makes is handed, once finished, to its observers.

The service calls ``model_call`` with the call's record (``CallRecord``, ``trace_record.py``) when the call
is finished (for a live stream, when the stream ends), whether or not traces are written; metrics and
spans (``proxy/observe/``) implement it. An observer must never fail a turn: ``Observers`` logs what one
raises and carries on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from proxy.runtime.assembly import TurnRequest
from proxy.runtime.trace_record import CallRecord

log = logging.getLogger("context_proxy.observe")


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
