"""Prometheus metrics (``GET /metrics``), derived from each model call's record.

The names and labels are the ones ``DESIGN.md`` fixes. A "request" is one model call made for a client:
a proxy-owned tool round and the overflow retry each count, the summarizer's calls are counted apart
(``context_proxy_summarizer_calls_total``). Prompt tokens are the proxy's conservative estimates, all
three counted the same way so they can be set against each other: ``client`` what the client's own
request costs (what a passthrough sends), ``sent`` what the provider received, ``candidate`` what the
assembly produced (in shadow mode, what dynamic mode would have sent); ``cache_read`` and ``cache_write``
are the provider's own figures for its prompt cache (``proxy/kernel/usage.py``).

Each app has its own ``CollectorRegistry``: nothing is registered in prometheus_client's global one, so
several apps (tests, replay) live in one process without sharing or colliding.

Requests and prompt tokens carry a ``team`` label (``default`` for the master key's sessions), bounded by
``CONTEXT_PROXY_METRICS_TEAMS``: the busiest teams by name, the rest as ``other`` (``team_labels.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from proxy.kernel.usage import ProviderUsage
from proxy.observe.call_facts import (
    assembly,
    compaction_reason,
    endpoint,
    made_model_call,
    outcome,
    status,
    summarizer_calls,
)
from proxy.observe.team_labels import TeamLabels
from proxy.runtime.assembly import TurnRequest
from proxy.runtime.trace_record import CallRecord

__all__ = ["CONTENT_TYPE", "PrometheusMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Assembly is milliseconds, seconds when the summarizer runs inside it; a provider call up to minutes.
_ASSEMBLY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_PROVIDER_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


class PrometheusMetrics:
    """The proxy's counters and histograms in a registry of their own; a ``CallObserver``."""

    def __init__(self, teams: int = 10) -> None:
        self.teams = TeamLabels(teams)  # the ``team`` label: the ``teams`` busiest by name, the rest ``other``
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.requests = Counter(
            "context_proxy_requests",
            "Model calls made for clients (proxy tool rounds and overflow retries included), by outcome.",
            ("mode", "scope", "endpoint", "status", "team"),
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "context_proxy_prompt_tokens",
            "Prompt tokens per model call: the client's request, what was sent, the candidate (estimates), and what "
            "the provider read from (cache_read) and wrote to (cache_write) its prompt cache (its own figures).",
            ("kind", "team"),
            registry=registry,
        )
        self.compactions = Counter(
            "context_proxy_compactions",
            "Compactions: an assembly's (pressure, or forced after an overflow) and clients' compaction requests.",
            ("reason",),
            registry=registry,
        )
        self.overflow_retries = Counter(
            "context_proxy_overflow_retries",
            "Forced retries after a provider context overflow, by how the retry ended.",
            ("outcome",),
            registry=registry,
        )
        self.summarizer_calls = Counter(
            "context_proxy_summarizer_calls",
            "Checkpoint summarizer model calls, by outcome.",
            ("outcome",),
            registry=registry,
        )
        self.tool_calls = Counter(
            "context_proxy_proxy_tool_calls",
            "Proxy-owned tool calls the proxy ran for the model.",
            ("tool",),
            registry=registry,
        )
        self.assembly_seconds = Histogram(
            "context_proxy_assembly_seconds",
            "Time the context pipeline took to assemble a model call's candidate.",
            buckets=_ASSEMBLY_BUCKETS,
            registry=registry,
        )
        self.provider_seconds = Histogram(
            "context_proxy_provider_seconds",
            "Time a model call took at the provider (to the first chunk for a stream relayed live).",
            buckets=_PROVIDER_BUCKETS,
            registry=registry,
        )

    def model_call(self, record: CallRecord) -> None:
        """Count one finished model call and what its assembly did."""
        pipeline = assembly(record)
        if pipeline is not None:
            self.assembly_seconds.observe(pipeline.assembly_ms / 1000)
        reason = compaction_reason(record)
        if reason is not None:
            self.compactions.labels(reason=reason).inc()
        for call in summarizer_calls(record):
            self.summarizer_calls.labels(outcome=outcome(call.get("error"))).inc()
        if record.recovery:
            retried = outcome(record.provider_error) if made_model_call(record) else "assembly_failed"
            self.overflow_retries.labels(outcome=retried).inc()
        if not made_model_call(record):
            return
        request = record.request
        team = self.teams.label(request.identity.context_id)
        self.requests.labels(
            mode=request.mode,
            scope=request.identity.scope,
            endpoint=endpoint(record),
            status=str(status(record)),
            team=team,
        ).inc()
        self.provider_seconds.observe((record.provider_ms or 0.0) / 1000)
        self.prompt_tokens.labels(kind="client", team=team).inc(record.client_tokens)
        candidate = self._candidate_tokens(record)
        # Dynamic mode sends the candidate; shadow and legacy forward the client's request.
        sent = candidate if record.request.mode == "dynamic" and candidate is not None else record.client_tokens
        self.prompt_tokens.labels(kind="sent", team=team).inc(sent)
        if candidate is not None:
            self.prompt_tokens.labels(kind="candidate", team=team).inc(candidate)
        usage = ProviderUsage.of(record.usage)
        if usage is not None:  # the provider's own figures: what it read from and wrote to its prompt cache
            self.prompt_tokens.labels(kind="cache_read", team=team).inc(usage.cache_read_tokens)
            self.prompt_tokens.labels(kind="cache_write", team=team).inc(usage.cache_write_tokens)

    def proxy_tool_calls(self, request: TurnRequest, tools: Sequence[str]) -> None:
        """Count the proxy-owned tools run for a model call."""
        for tool in tools:
            self.tool_calls.labels(tool=tool).inc()

    def render(self) -> bytes:
        """The registry in Prometheus' text exposition format."""
        return generate_latest(self.registry)

    def _candidate_tokens(self, record: CallRecord) -> int | None:
        """The candidate's size as the assembly counted it (the trace's ``estimatedTokens``: the turn's
        estimator, the one ``CallRecord.client_tokens`` is counted with, so the kinds compare); ``None``
        in legacy mode. Read, never recounted: a 1,000-message candidate costs milliseconds to count."""
        pipeline = assembly(record)
        return pipeline.estimated_tokens if pipeline is not None else None
