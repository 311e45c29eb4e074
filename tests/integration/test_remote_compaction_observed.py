"""A client's compaction request is a model call like any other: counted in /metrics, spanned, traced.

Codex asks the server to compact (``compaction_trigger``, or ``POST /v1/responses/compact``); the turn
service answers with the summarizer (``TurnService.compact``), and that summarizer call reaches the same
observers and the same trace writer as every turn's calls. Real HTTP, the scripted provider, the
official OpenAI SDK.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from proxy.app import create_app
from proxy.kernel.config import Settings
from proxy.provider.science_script import checkpoint_for, is_summary_request
from proxy.provider.scripted import Reply, serve_in_thread
from tests.integration.conftest import MODEL, ProviderHandle, route_to, validate_traces
from tests.integration.test_metrics import samples, total

SESSION = "compaction-observed"
HISTORY: list[dict[str, Any]] = [
    {"type": "message", "role": "user", "content": "Run the measurement."},
    {"type": "function_call", "call_id": "call_1", "name": "run_step", "arguments": '{"step": 1}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "step=1 ok\n" * 40},
]
TOOLS = [{"type": "function", "name": "run_step", "parameters": {"type": "object", "properties": {}}}]


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield tracer_provider, exporter
    tracer_provider.shutdown()


def _summarizing(summary_fails: bool) -> Any:
    def script(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            if summary_fails:
                return Reply(error_status=500, error_body={"error": {"message": "down", "type": "server_error"}})
            return Reply(content=checkpoint_for(body["messages"][-1]["content"]))
        return Reply(content="ok")

    return script


def _compact(url: str, *, trigger: bool) -> httpx.Response:
    """One compaction request as Codex sends it (a trailing ``compaction_trigger``), or the v1 endpoint."""
    body = {"model": MODEL, "input": HISTORY + ([{"type": "compaction_trigger"}] if trigger else []), "tools": TOOLS}
    path = "/v1/responses" if trigger else "/v1/responses/compact"
    answer = httpx.post(url + path, json=body, headers={"x-session-id": SESSION}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer


@pytest.mark.parametrize("summary_fails", [False, True], ids=["summarized", "summarizer-failed"])
def test_a_compaction_request_is_counted_as_a_summarizer_call_with_its_own_reason(
    provider: ProviderHandle, tmp_path, summary_fails: bool
) -> None:
    provider.script(_summarizing(summary_fails))
    settings = Settings(data_dir=tmp_path / "data", models=(route_to(provider.url),))
    with serve_in_thread(create_app(settings)) as url:
        _compact(url, trigger=True)
        _compact(url, trigger=False)
        found = samples(httpx.get(f"{url}/metrics", timeout=30).text)

    outcome = "error" if summary_fails else "success"
    assert total(found, "context_proxy_summarizer_calls_total", outcome=outcome) == 2
    assert total(found, "context_proxy_summarizer_calls_total") == 2
    assert total(found, "context_proxy_compactions_total", reason="client_compaction_request") == 2
    # A request is a model call made for a client's turn: a compaction is counted apart, not as one.
    assert total(found, "context_proxy_requests_total") == 0


def test_a_compaction_request_is_a_span_with_its_summarizer_call(
    provider: ProviderHandle, spans: tuple[TracerProvider, InMemorySpanExporter], tmp_path
) -> None:
    tracer_provider, exporter = spans
    provider.script(_summarizing(summary_fails=False))
    settings = Settings(data_dir=tmp_path / "data", models=(route_to(provider.url),))
    with serve_in_thread(create_app(settings, tracer_provider=tracer_provider)) as url:
        _compact(url, trigger=True)

    finished = list(exporter.get_finished_spans())
    (root,) = [span for span in finished if span.parent is None]
    assert root.name == "context_proxy.compact"
    attributes = dict(root.attributes or {})
    assert attributes["context_proxy.compaction.reason"] == "client_compaction_request"
    assert attributes["context_proxy.compaction.request"] == "compaction_trigger"
    assert attributes["context_proxy.compaction.fallback"] is False
    assert attributes["gen_ai.conversation.id"] == SESSION
    assert attributes["context_proxy.endpoint"] == "responses"
    (child,) = [span for span in finished if span.parent is not None]
    assert child.parent is not None and child.parent.span_id == root.context.span_id
    assert child.name == "chat scripted"
    assert (child.attributes or {})["context_proxy.call"] == "summarizer"
    assert child.status.status_code is not StatusCode.ERROR
    assert child.start_time is not None and root.start_time is not None and child.start_time >= root.start_time


def test_a_compaction_request_is_traced_like_every_model_call(provider: ProviderHandle, tmp_path) -> None:
    """The trace file is the one writer's (schema-v5, in the session's turn numbering, checked by the
    trace schema), and it says what the summarizer was asked."""
    provider.script(_summarizing(summary_fails=False))
    settings = Settings(data_dir=tmp_path / "data", models=(route_to(provider.url),), trace_enabled=True)
    with serve_in_thread(create_app(settings)) as url:
        httpx.post(
            f"{url}/v1/responses",
            json={"model": MODEL, "input": HISTORY[:1]},
            headers={"x-session-id": SESSION},
            timeout=60,
        ).raise_for_status()
        _compact(url, trigger=True)

    folder = tmp_path / "data" / "context-traces" / SESSION
    names = sorted(path.name for path in folder.glob("turn-*.json"))
    assert names == ["turn-0001.json", "turn-0002.json"]  # the turn, then the compaction: one numbering
    trace = json.loads((folder / "turn-0002.json").read_text())
    assert trace["schemaVersion"] == 5
    assert trace["compaction"]["reason"] == "client_compaction_request"
    assert trace["ingress"] == {"api": "responses", "request": "compaction_trigger"}
    summary = [body for body in provider.history if is_summary_request(body)]
    assert trace["llmInput"]["messages"] == summary[-1]["messages"]
    assert validate_traces(tmp_path / "data" / "context-traces") == 2
