"""``TurnService.compact``: a client's compaction request through the one front door of a model call.

The summarizer call is made by the service, under the session's lock, and handed to the same observers
and the same trace serializer and writer as every turn's call; the checkpoint is issued as a token the
service reads back. A real SQLite store and a ``FunctionBackend``: no HTTP, no litellm.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from proxy.builder import build_service
from proxy.kernel.config import ModelRoute, Settings
from proxy.kernel.errors import SessionConflict
from proxy.provider.function import FunctionBackend, completion
from proxy.provider.science_script import checkpoint_for, is_summary_request
from proxy.runtime.assembly import TurnRequest
from proxy.runtime.remote_compaction import CompactionRequest
from proxy.runtime.service import TurnService
from proxy.runtime.session_identity import SessionIdentity
from proxy.runtime.trace import SCHEMA_VERSION
from proxy.runtime.trace_record import CallRecord, trace_json
from proxy.session.sqlite import SqliteSessionStore

SECRET = b"k" * 32
ROUTE = ModelRoute(
    model_name="m", litellm_params={"model": "openai/m"}, max_input_tokens=16_000, max_output_tokens=2_000
)
IDENTITY = SessionIdentity("ctx-compact", "header:x-session-id", "main")
CALL = {"id": "c1", "type": "function", "function": {"name": "measure", "arguments": "{}"}}
HISTORY = [
    {"role": "user", "content": "Measure sample 7."},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "step=1 measured 0.42 ref=to_1\n" * 20},
]


class Recorded:
    """An observer keeping what it was handed."""

    def __init__(self) -> None:
        self.records: list[CallRecord] = []

    def model_call(self, record: CallRecord) -> None:
        self.records.append(record)

    def proxy_tool_calls(self, request: TurnRequest, tools: Sequence[str]) -> None:
        """Not part of a compaction."""


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteSessionStore]:
    opened = SqliteSessionStore(tmp_path / "store.db", lock_timeout_seconds=0.2)
    await opened.open()
    yield opened
    await opened.close()


def _summarize(llm_input: dict[str, Any]) -> dict[str, Any]:
    assert is_summary_request(llm_input)
    return completion({"content": checkpoint_for(llm_input["messages"][-1]["content"])})


def _service(tmp_path: Path, store: SqliteSessionStore, observer: Recorded, backend: FunctionBackend) -> TurnService:
    settings = Settings(data_dir=tmp_path / "data", models=(ROUTE,), trace_enabled=True, framing_secret=SECRET)
    return build_service(settings, store, backend, lambda model: (None, None), SECRET, observer=observer)


async def test_the_summarizer_call_is_observed_and_traced_by_the_one_serializer(tmp_path, store) -> None:
    observer, backend = Recorded(), FunctionBackend(_summarize)
    service = _service(tmp_path, store, observer, backend)
    result = await service.compact(CompactionRequest(IDENTITY, ROUTE, HISTORY, None, "compaction_trigger"))

    (record,) = observer.records  # the observers saw exactly this one call
    assert record.compaction is not None and len(record.compaction.outcome.calls) == 1
    (written,) = (tmp_path / "data" / "context-traces" / IDENTITY.context_id).glob("turn-*.json")
    # The file is the one serializer's rendering of the very record the observers were handed.
    assert json.loads(written.read_text()) == json.loads(
        json.dumps({"schemaVersion": SCHEMA_VERSION, **trace_json(record)}, default=str)
    )
    assert len(backend.history) == 1 and is_summary_request(backend.history[0])

    issued = await service.issued_checkpoints([result.token, "cpx1.not-ours"])
    assert list(issued) == [result.token]  # a token this proxy did not issue is left out
    assert issued[result.token].message["content"].startswith("<checkpoint")
    assert result.checkpoint_tokens == len(issued[result.token].message["content"]) // 4


async def test_a_compaction_waits_for_the_session_lock_like_a_turn(tmp_path, store) -> None:
    observer, backend = Recorded(), FunctionBackend(_summarize)
    service = _service(tmp_path, store, observer, backend)
    async with store.turn_lock(IDENTITY.context_id):  # a turn of the session is running
        with pytest.raises(SessionConflict):
            await service.compact(CompactionRequest(IDENTITY, ROUTE, HISTORY, None, "responses/compact"))
    assert backend.history == [] and observer.records == []  # nothing was asked of the model


@pytest.mark.parametrize(("attempts", "calls"), [(None, 2), (1, 1), (3, 3)])
async def test_remote_compaction_makes_as_many_attempts_as_the_setting_allows(tmp_path, store, attempts, calls) -> None:
    backend = FunctionBackend(lambda llm_input: completion({"content": "Sorry, I cannot help with that."}))
    env = {"SCIENCE_AGENT_SUMMARY_MAX_ATTEMPTS": str(attempts)} if attempts is not None else {}
    settings = Settings(
        data_dir=tmp_path / "data",
        models=(ROUTE,),
        framing_secret=SECRET,
        summary_max_attempts=Settings.from_env(env).summary_max_attempts,
    )
    service = build_service(settings, store, backend, lambda model: (None, None), SECRET, observer=Recorded())
    await service.compact(CompactionRequest(IDENTITY, ROUTE, HISTORY, None, "compaction_trigger"))
    assert len(backend.history) == calls and all(is_summary_request(body) for body in backend.history)
