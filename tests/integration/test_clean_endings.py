"""Every answer ends cleanly through real HTTP: the session lock is always released, a trace that cannot
be written changes nothing the client sees, a stream that fails ends with an error event and
``[DONE]``, and an unexpected error is a JSON 500 on a connection that stays usable."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from proxy.app import create_app
from proxy.kernel.config import Settings
from proxy.provider.scripted import Reply, serve_in_thread
from proxy.runtime.assembly import Candidate, TurnRequest

from .conftest import route_to

SCHEMAS = json.loads((Path(__file__).parents[1] / "data" / "openai-chat-schemas.json").read_text())
ERROR_SCHEMA = jsonschema.Draft202012Validator(SCHEMAS["schemas"]["ErrorResponse"])
LONG = "".join(f"part {i:03d}. " for i in range(60))  # 600 characters: 38 chunks of 16


def _body(content: str = "Analyse the spectra.", *, stream: bool = False) -> dict[str, Any]:
    return {"model": "test-model", "messages": [{"role": "user", "content": content}], "stream": stream}


def _events(lines: list[str]) -> list[tuple[str | None, str]]:
    """(event name, data) of each server-sent event, in order."""
    events, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            events.append((name, line[len("data: ") :]))
            name = None
    return events


def _content(events: list[tuple[str | None, str]]) -> str:
    text = []
    for name, data in events:
        if name is None and data != "[DONE]":
            for choice in json.loads(data).get("choices") or []:
                text.append(choice["delta"].get("content") or "")
    return "".join(text)


def test_unwritable_trace_folder_mid_stream_changes_nothing_for_the_client(start_proxy, provider, caplog):
    proxy = start_proxy(mode="dynamic", trace_enabled=True, session_lock_seconds=1)
    provider.script(lambda body: Reply(content=LONG), chunk_delay=0.01)
    headers = {"x-session-id": "trace-breaks"}
    traces = proxy.settings.resolved_trace_dir
    with caplog.at_level(logging.WARNING, logger="context_proxy.trace"), httpx.Client(base_url=proxy.url) as http:
        with http.stream("POST", "/v1/chat/completions", json=_body(stream=True), headers=headers) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            first = [next(lines)]
            # The trace folder becomes a file: every trace write of this turn now fails.
            shutil.rmtree(traces, ignore_errors=True)
            traces.parent.mkdir(parents=True, exist_ok=True)
            traces.write_text("not a folder")
            events = _events(first + list(lines))
        assert events[-1] == (None, "[DONE]")
        assert not [e for e in events if e[0] == "error"]
        assert _content(events) == LONG
        follow_up = {"model": "test-model", "messages": [*_body()["messages"], {"role": "assistant", "content": LONG}]}
        follow_up["messages"].append({"role": "user", "content": "And now?"})
        again = http.post("/v1/chat/completions", json=follow_up, headers=headers)  # at once: no 409
    assert again.status_code == 200, again.text
    assert any("not written" in record.getMessage() for record in caplog.records)


def test_provider_stream_breaking_mid_way_ends_with_an_error_event_and_done(start_proxy, provider):
    proxy = start_proxy(mode="dynamic", session_lock_seconds=1)
    provider.script(lambda body: Reply(content=LONG, break_after=5))
    headers = {"x-session-id": "stream-breaks"}
    with httpx.Client(base_url=proxy.url) as http:
        with http.stream("POST", "/v1/chat/completions", json=_body(stream=True), headers=headers) as response:
            assert response.status_code == 200
            events = _events(list(response.iter_lines()))
        assert events[-1] == (None, "[DONE]")
        name, data = events[-2]
        assert name == "error"
        ERROR_SCHEMA.validate(json.loads(data))
        assert LONG.startswith(_content(events)) and _content(events)  # what came before the break
        provider.script(lambda body: Reply(content="whole"))
        again = http.post("/v1/chat/completions", json=_body(), headers=headers)
    assert again.status_code == 200, again.text
    assert again.json()["choices"][0]["message"]["content"] == "whole"


def test_openai_sdk_raises_the_error_event_of_a_broken_stream(start_proxy, provider):
    import openai

    proxy = start_proxy(mode="legacy")
    provider.script(lambda body: Reply(content=LONG, break_after=4))
    stream = proxy.client().chat.completions.create(model="test-model", messages=_body()["messages"], stream=True)
    received = []
    with pytest.raises(openai.APIError):
        for chunk in stream:
            received.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    assert LONG.startswith("".join(received))


class _ExplodingAssembler:
    """A test assembler: raises RuntimeError (a bug, not a ProxyError) when asked about "explode"."""

    channels: tuple[str, ...] = ()  # it reads no branch state

    async def assemble(self, request: TurnRequest) -> Candidate:
        messages = request.body["messages"]
        if messages[-1]["content"] == "explode":
            raise RuntimeError("an unexpected bug")
        return Candidate(messages=list(messages), tools=None)


@pytest.mark.parametrize("stream", [False, True])
def test_unexpected_error_is_json_and_the_same_connection_serves_the_next_request(tmp_path, provider, stream):
    settings = Settings(data_dir=tmp_path / "data", models=(route_to(provider.url),))
    with serve_in_thread(create_app(settings, assembler=_ExplodingAssembler())) as url:
        connections: list[Any] = []
        transport = httpx.HTTPTransport()
        with httpx.Client(base_url=url, transport=transport, timeout=10) as http:

            def record_connection(response: httpx.Response) -> None:
                connections.append(response.extensions["network_stream"].get_extra_info("socket").getsockname())

            http.event_hooks["response"] = [record_connection]
            failed = http.post("/v1/chat/completions", json=_body("explode", stream=stream))
            assert failed.status_code == 500
            ERROR_SCHEMA.validate(failed.json())
            assert failed.json()["error"]["code"] == "internal_error"
            fine = http.post("/v1/chat/completions", json=_body("hello", stream=False))
    assert fine.status_code == 200, fine.text
    assert connections[0] == connections[1]  # one keep-alive connection served both
