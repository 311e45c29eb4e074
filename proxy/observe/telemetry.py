"""An app's observers: its Prometheus metrics always, its OpenTelemetry spans when asked for.

Spans are on when the app is handed a tracer provider (tests inject one with an in-memory exporter), or
when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set and the ``otel`` extra is installed: then the app makes a
provider of its own that exports over OTLP/HTTP (the exporter reads the standard ``OTEL_EXPORTER_OTLP_*``
variables, the resource reads ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``) and shuts it down,
flushing what is pending, when the app stops. Nothing is set as OpenTelemetry's global provider.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from proxy.observe.metrics import PrometheusMetrics
from proxy.runtime.observers import CallObserver, Observers

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

log = logging.getLogger("context_proxy.observe")

ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_ENDPOINT"


class Telemetry:
    """The metrics and the observer the turn service feeds; ``shutdown`` flushes an owned span exporter."""

    def __init__(self, metrics: PrometheusMetrics, observer: Observers, owned_provider: Any = None) -> None:
        self.metrics = metrics
        self.observer = observer
        self._owned_provider = owned_provider

    @classmethod
    def build(cls, tracer_provider: TracerProvider | None, environ: Mapping[str, str], teams: int = 10) -> Telemetry:
        """Metrics (``teams`` of them labelled by name), plus spans to ``tracer_provider`` or, without one, to
        the OTLP endpoint ``environ`` names."""
        metrics = PrometheusMetrics(teams)
        observers: list[CallObserver] = [metrics]
        owned = None
        if tracer_provider is None and environ.get(ENDPOINT_VARIABLE):
            tracer_provider = owned = _otlp_provider()
        if tracer_provider is not None:
            from proxy.observe.otel import SpanObserver  # the otel extra: imported only when spans are on

            observers.append(SpanObserver(tracer_provider))
        return cls(metrics, Observers(observers), owned)

    def shutdown(self) -> None:
        """Export the spans still pending and stop the exporter the app made (blocking: run it off the loop)."""
        if self._owned_provider is not None:
            self._owned_provider.shutdown()


def _otlp_provider() -> Any:
    """A tracer provider exporting over OTLP/HTTP, or ``None`` when the otel extra is missing."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "%s is set but OpenTelemetry is not installed; no spans are exported "
            "(pip install 'science-context-proxy[otel]')",
            ENDPOINT_VARIABLE,
        )
        return None
    resource = Resource.create()  # reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "context-proxy"}))
    provider = SdkTracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider
