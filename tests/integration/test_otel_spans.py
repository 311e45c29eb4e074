"""OpenTelemetry spans through real HTTP: one GenAI span per model call, assembly and summarizer as children.

The app gets its own tracer provider with an in-memory exporter (nothing global); the run is the one of
``test_metrics.py``: the science agent compacting, one overflow retry whose forced pass summarizes, and
the read-back round. A second test sets ``OTEL_EXPORTER_OTLP_ENDPOINT`` and receives the export on a
loopback OTLP/HTTP endpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.app import create_app
from proxy.kernel.config import Settings
from proxy.observe.otel import provider_and_model
from proxy.provider.science_script import ScienceModel, is_summary_request
from proxy.provider.scripted import serve_in_thread
from tests.integration.test_metrics import STEPS, WINDOW, refusing_once, run_agent, science_route

SESSION = "spans-run"


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield tracer_provider, exporter
    tracer_provider.shutdown()


def test_each_model_call_is_a_genai_span_with_assembly_and_summarizer_children(provider, spans, tmp_path):
    tracer_provider, exporter = spans
    model = ScienceModel(STEPS)
    provider.script(refusing_once(model, at=STEPS // 2), context_window=WINDOW)
    settings = Settings(data_dir=tmp_path / "data", models=(science_route(provider.url),), mode="dynamic")
    app = create_app(settings, tracer_provider=tracer_provider)
    with serve_in_thread(app) as url, openai.OpenAI(base_url=f"{url}/v1", api_key="sk-client", max_retries=0) as sdk:
        run_agent(sdk, STEPS, SESSION)

    finished = list(exporter.get_finished_spans())
    by_id = {span.context.span_id: span for span in finished}
    calls = [s for s in finished if s.parent is None]
    agent_bodies = [body for body in provider.history if not is_summary_request(body)]
    counted = [
        t for body, t in zip(provider.history, provider.provider.prompt_tokens, strict=True) if body in agent_bodies
    ]
    # One root span per model call made for the client, in the order the provider saw them.
    assert [s.name for s in calls] == ["chat scripted"] * len(agent_bodies)
    for span, tokens in zip(calls, counted, strict=True):
        attributes = span.attributes or {}
        assert span.kind == SpanKind.CLIENT
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == "openai"
        assert attributes["gen_ai.request.model"] == "scripted"
        assert attributes["gen_ai.conversation.id"] == SESSION
        if span.status.status_code is not StatusCode.ERROR:
            assert attributes["gen_ai.usage.input_tokens"] == tokens  # what the provider reported
            assert attributes["gen_ai.usage.output_tokens"] > 0

    refused = [s for s in calls if s.status.status_code is StatusCode.ERROR]
    assert len(refused) == 1
    assert (refused[0].attributes or {})["error.type"] == "context_length_exceeded"
    assert (refused[0].attributes or {})["http.response.status_code"] == 400
    retry = calls[calls.index(refused[0]) + 1]
    assert (retry.attributes or {})["context_proxy.recovery"] == 1

    def children(parent: ReadableSpan) -> list[ReadableSpan]:
        return [s for s in finished if s.parent is not None and s.parent.span_id == parent.context.span_id]

    for call in calls:  # every call was assembled; the assembly lies within its call
        (assembled,) = [s for s in children(call) if s.name == "context_proxy.assemble"]
        assert call.start_time <= assembled.start_time <= assembled.end_time <= call.end_time
    summarizer = [s for s in finished if (s.attributes or {}).get("context_proxy.call") == "summarizer"]
    assert len(summarizer) == model.summaries >= 1
    for span in summarizer:
        assert span.name == "chat scripted" and span.parent is not None
        assert by_id[span.parent.span_id] in calls
    # From the first call whose assembly summarized on, the model sees the checkpoint.
    first = next(index for index, call in enumerate(calls) if any(s in children(call) for s in summarizer))
    compacted = [bool((s.attributes or {}).get("gen_ai.conversation.compacted")) for s in calls]
    assert compacted == [False] * first + [True] * (len(calls) - first)


def test_an_otlp_endpoint_in_the_environment_receives_the_spans(start_proxy, provider, monkeypatch):
    received: list[tuple[str, bytes]] = []

    async def collect(request: Request) -> Response:
        received.append((request.url.path, await request.body()))
        return Response(b"", media_type="application/x-protobuf")

    collector = Starlette(routes=[Route("/v1/traces", collect, methods=["POST"])])
    with serve_in_thread(collector) as collector_url:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector_url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "proxy-under-test")
        proxy = start_proxy(mode="dynamic", trace_enabled=False)
        proxy.client().chat.completions.create(
            model="test-model", messages=[{"role": "user", "content": "hi"}], extra_headers={"x-session-id": "otlp"}
        )
        proxy.stop()  # the app's provider flushes its batch when the app stops
    assert [path for path, _ in received] == ["/v1/traces"]
    body = received[0][1]
    for expected in (
        b"chat scripted",
        b"context_proxy.assemble",
        b"gen_ai.conversation.id",
        b"otlp",
        b"proxy-under-test",
    ):
        assert expected in body


@pytest.mark.parametrize(
    ("model", "params", "expected"),
    [
        ("openai/gpt-4o", {}, ("openai", "gpt-4o")),
        ("anthropic/claude-sonnet-4-5", {}, ("anthropic", "claude-sonnet-4-5")),
        ("bedrock/anthropic.claude-3", {}, ("aws.bedrock", "anthropic.claude-3")),
        ("claude-opus-4-1", {}, ("anthropic", "claude-opus-4-1")),
        ("my-model", {"custom_llm_provider": "vertex_ai"}, ("gcp.vertex_ai", "my-model")),
        ("my-model", {}, ("unknown", "my-model")),
    ],
)
def test_provider_names_follow_the_genai_conventions(model: str, params: dict[str, Any], expected: tuple[str, str]):
    assert provider_and_model(model, params) == expected
