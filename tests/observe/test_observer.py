"""The observation port: every model call reaches the observers, traces on or off, and a failing observer
never fails the turn (``TurnService`` with a real SQLite store and a ``FunctionBackend``)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from proxy.builder import build_service
from proxy.kernel.config import Settings
from proxy.observe.call_facts import endpoint, status
from proxy.provider.function import FunctionBackend, completion
from proxy.runtime.answers import Completion
from proxy.runtime.assembly import TurnRequest
from proxy.runtime.observers import Observers
from proxy.runtime.trace_record import CallRecord
from proxy.session.sqlite import SqliteSessionStore
from tests.runtime.test_turn import IDENTITY, ROUTE, SECRET, body


class Recording:
    def __init__(self) -> None:
        self.calls: list[CallRecord] = []

    def model_call(self, record: CallRecord) -> None:
        self.calls.append(record)

    def proxy_tool_calls(self, request: TurnRequest, tools: Sequence[str]) -> None:
        raise AssertionError("no proxy tool was run")


class Broken:
    def model_call(self, record: CallRecord) -> None:
        raise RuntimeError("exporter down")

    def proxy_tool_calls(self, request: TurnRequest, tools: Sequence[str]) -> None:
        raise RuntimeError("exporter down")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteSessionStore]:
    opened = SqliteSessionStore(tmp_path / "store.db", lock_timeout_seconds=0.2)
    await opened.open()
    yield opened
    await opened.close()


async def test_a_failing_observer_is_logged_and_the_next_one_still_sees_the_call(
    tmp_path: Path, store: SqliteSessionStore, caplog: pytest.LogCaptureFixture
) -> None:
    recording = Recording()
    settings = Settings(data_dir=tmp_path / "data", models=(ROUTE,), trace_enabled=False, framing_secret=SECRET)
    backend = FunctionBackend(lambda llm_input: completion({"content": "Measured."}))
    observers = Observers([Broken(), recording])
    runner = build_service(settings, store, backend, lambda model: (None, None), SECRET, observer=observers)

    with caplog.at_level(logging.ERROR, logger="context_proxy.observe"):
        result = await runner.run(body(tools=()), IDENTITY, ROUTE)

    assert isinstance(result.answer, Completion) and result.answer.message["content"] == "Measured."
    assert "observer Broken failed on a model call" in caplog.text
    (record,) = recording.calls  # traces are off; the call is observed all the same
    assert (endpoint(record), status(record), record.request.mode) == ("chat", 200, "dynamic")
    assert record.provider_ms is not None and record.started_ns > 0
    assert record.usage is not None and record.usage["prompt_tokens"] > 0
    assert not (tmp_path / "data" / "context-traces").exists()
