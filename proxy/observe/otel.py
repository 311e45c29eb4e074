"""OpenTelemetry spans, one per model call, following the GenAI semantic conventions.

Needs the ``otel`` extra; ``proxy/observe/telemetry.py`` imports this module only when spans are on.
A span is made from the call's record once the call is finished (``proxy/observe/call_facts.py``), with the
times the record carries (a client's compaction request: a ``context_proxy.compact`` span and its
summarizer children): the call span from the start of the attempt (before assembly) to the end of
the call (for a live stream, its last chunk), an ``assemble`` child for the pipeline's time, and one
child per summarizer call. The summarizer calls ran inside the assembly; their durations are measured but
not their starts, so they are laid end to end from the start of the assembly, in the order they ran.

The tracer provider is the app's (handed to ``create_app``, or made from the environment): nothing is
set globally, so two apps in one process export to their own places.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider

from proxy.kernel.config import ModelRoute
from proxy.kernel.usage import ProviderUsage
from proxy.observe.call_facts import (
    assembly,
    checkpoint_sent,
    compaction_reason,
    endpoint,
    made_model_call,
    now_ns,
    status,
    summarizer_calls,
)
from proxy.runtime.assembly import TurnRequest
from proxy.runtime.trace_record import CallRecord

__all__ = ["SpanObserver", "provider_and_model"]

_MS = 1_000_000  # nanoseconds

# litellm's provider prefixes whose GenAI name differs (the conventions' well-known values).
_PROVIDER_NAMES = {
    "azure": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "bedrock": "aws.bedrock",
    "vertex_ai": "gcp.vertex_ai",
    "gemini": "gcp.gemini",
    "mistral": "mistral_ai",
    "xai": "x_ai",
    "watsonx": "ibm.watsonx.ai",
}


def provider_and_model(model: str, litellm_params: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """The GenAI provider name and the model name the provider receives, from litellm's model string
    (``openai/gpt-4o`` -> ``openai``, ``gpt-4o``); a bare name keeps litellm's own provider guess
    unknown unless the route names ``custom_llm_provider``."""
    prefix, slash, name = model.partition("/")
    provider = (litellm_params or {}).get("custom_llm_provider") or (prefix if slash else "")
    if not slash:
        name = model
    if not provider and name.startswith("claude"):
        provider = "anthropic"
    elif not provider:
        provider = "openai" if name.startswith(("gpt", "o1", "o3", "o4")) else "unknown"
    return _PROVIDER_NAMES.get(str(provider), str(provider)), name


class SpanObserver:
    """Turns each finished model call into a span tree; a ``CallObserver``."""

    def __init__(self, provider: TracerProvider) -> None:
        self._tracer = provider.get_tracer("context-proxy")

    def model_call(self, record: CallRecord) -> None:
        """One ``chat {model}`` span with its ``assemble`` and summarizer children; a client's compaction
        request one ``context_proxy.compact`` span with its summarizer children."""
        if record.compaction is not None:
            self._compaction_span(record)
            return
        if not made_model_call(record):
            return
        end = now_ns()
        pipeline = assembly(record)
        assembly_ns = int(pipeline.assembly_ms * _MS) if pipeline is not None else 0
        start = record.started_ns or end - int((record.provider_ms or 0.0) * _MS) - assembly_ns
        request = record.request
        route = request.route
        provider, model = provider_and_model(route.litellm_model, route.litellm_params)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "gen_ai.conversation.id": request.identity.context_id,
            "context_proxy.route": route.model_name,
            "context_proxy.mode": request.mode,
            "context_proxy.scope": request.identity.scope,
            "context_proxy.endpoint": endpoint(record),
            "context_proxy.turn": request.turn,
            "context_proxy.recovery": record.recovery,
            "http.response.status_code": status(record),
        }
        attributes.update(_usage(record.usage))
        if checkpoint_sent(record):
            attributes["gen_ai.conversation.compacted"] = True
        span = self._tracer.start_span(f"chat {model}", kind=SpanKind.CLIENT, start_time=start, attributes=attributes)
        parent = trace.set_span_in_context(span)
        if pipeline is not None:
            compaction = pipeline.compaction
            child = self._tracer.start_span(
                "context_proxy.assemble",
                context=parent,
                start_time=start,
                attributes={
                    "context_proxy.estimated_tokens": pipeline.estimated_tokens,
                    "context_proxy.compaction.reason": compaction.pass_record.reason or "",
                    "context_proxy.compaction.new_checkpoint": compaction.new_checkpoint,
                },
            )
            child.end(end_time=start + assembly_ns)
        self._summarizer_spans(parent, summarizer_calls(record), start, route)
        if record.provider_error is not None:
            kind = str(record.provider_error.get("code") or record.provider_error.get("type") or status(record))
            span.set_attribute("error.type", kind)
            span.set_status(Status(StatusCode.ERROR, str(record.provider_error.get("message") or kind)))
        span.end(end_time=end)

    def proxy_tool_calls(self, request: TurnRequest, tools: Sequence[str]) -> None:
        """Nothing: the tools' model call already has its span, and the next call has its own."""

    def _compaction_span(self, record: CallRecord) -> None:
        """A client's compaction request (``TurnService.compact``): no assembly, the summarizer answered."""
        assert record.compaction is not None  # checked by the caller; here for the type checker
        end = now_ns()
        start = record.started_ns or end
        request = record.request
        compaction = record.compaction
        attributes: dict[str, Any] = {
            "gen_ai.conversation.id": request.identity.context_id,
            "context_proxy.route": request.route.model_name,
            "context_proxy.scope": request.identity.scope,
            "context_proxy.endpoint": endpoint(record),
            "context_proxy.turn": request.turn,
            "context_proxy.compaction.reason": compaction_reason(record) or "",
            "context_proxy.compaction.request": compaction.kind,
            "context_proxy.compaction.fallback": compaction.outcome.fallback is not None,
            "context_proxy.checkpoint_tokens": compaction.checkpoint_tokens,
        }
        span = self._tracer.start_span("context_proxy.compact", start_time=start, attributes=attributes)
        self._summarizer_spans(trace.set_span_in_context(span), summarizer_calls(record), start, request.route)
        span.end(end_time=end)

    def _summarizer_spans(
        self, parent: Any, calls: Sequence[Mapping[str, Any]], start: int, request_route: ModelRoute
    ) -> None:
        cursor = start
        for call in calls:
            # The summarizer's route may differ from the request's; its record keeps the route's name.
            summary_model = str(call.get("model") or request_route.model_name)
            duration = int(float(call.get("providerMs") or 0.0) * _MS)
            llm_input = call.get("llmInput")
            litellm_model = str(llm_input.get("model")) if isinstance(llm_input, Mapping) else ""
            provider, model = provider_and_model(litellm_model or summary_model)
            child = self._tracer.start_span(
                f"chat {model}",
                context=parent,
                kind=SpanKind.CLIENT,
                start_time=cursor,
                attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.provider.name": provider,
                    "gen_ai.request.model": model,
                    "context_proxy.route": summary_model,
                    "context_proxy.call": "summarizer",
                },
            )
            error = call.get("error")
            if isinstance(error, Mapping):
                kind = str(error.get("code") or error.get("type") or "error")
                child.set_attribute("error.type", kind)
                child.set_status(Status(StatusCode.ERROR, str(error.get("message") or kind)))
            cursor += duration
            child.end(end_time=cursor)


def _usage(usage: Mapping[str, Any] | Any) -> dict[str, int]:
    """``gen_ai.usage.*`` from the provider's usage (a dict, or litellm's object), when it reported one: the
    tokens in and out, and the GenAI conventions' prompt-cache figures."""
    reading = ProviderUsage.of(usage)
    if reading is None:
        return {}
    return {
        "gen_ai.usage.input_tokens": reading.prompt_tokens,
        "gen_ai.usage.output_tokens": reading.completion_tokens,
        "gen_ai.usage.cache_read.input_tokens": reading.cache_read_tokens,
        "gen_ai.usage.cache_creation.input_tokens": reading.cache_write_tokens,
    }
