"""Recorded provider traffic, pinned: any change in what the provider receives fails here.

Replay is the default (CI has no provider): vcrpy answers litellm's calls from ``cassettes/`` and the
scripted provider must see no request at all. ``CONTEXT_PROXY_RECORD_CASSETTES=1`` re-records them
against the scripted provider; request and response headers are reduced to the content type, so a
re-record of an unchanged product writes byte-identical files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import vcr
from vcr.request import Request as VcrRequest

from proxy.demo.scripted_provider import Reply, ToolCall

CASSETTES = Path(__file__).parents[2] / "cassettes"
RECORDING = os.environ.get("CONTEXT_PROXY_RECORD_CASSETTES") == "1"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "measure",
            "parameters": {"type": "object", "properties": {"sample": {"type": "string"}}, "required": ["sample"]},
        },
    }
]


def provider_recorder(proxy_url: str) -> vcr.VCR:
    """A VCR that records only proxy-to-provider traffic; the client's calls to the proxy pass through."""

    def keep_provider_requests(request: VcrRequest) -> VcrRequest | None:
        if request.uri.startswith(proxy_url):
            return None
        request.headers = {k: v for k, v in request.headers.items() if k.lower() == "content-type"}
        request.uri = "http://scripted-provider" + urlsplit(request.uri).path  # ports differ per run; paths match
        return request

    def stable_response(response: dict[str, Any]) -> dict[str, Any]:
        response["headers"] = {k: v for k, v in response["headers"].items() if k.lower() == "content-type"}
        return response

    recorder = vcr.VCR(
        cassette_library_dir=str(CASSETTES),
        record_mode="all" if RECORDING else "none",
        match_on=["method", "path", "body"],
        filter_headers=["authorization"],
        before_record_request=keep_provider_requests,
        before_record_response=stable_response,
        decode_compressed_response=True,
    )
    return recorder


def use_cassette(proxy_url: str, name: str) -> Any:
    """The named cassette; a re-record starts from an empty file so that it holds this run only."""
    if RECORDING:
        (CASSETTES / name).unlink(missing_ok=True)
    return provider_recorder(proxy_url).use_cassette(name)


@pytest.fixture
def replay_checked(provider):
    """After the test: in replay mode the real provider must not have been called."""
    yield
    if not RECORDING:
        assert provider.history == [], "a provider call was not answered from the cassette"


def _tool_loop_script(body: dict[str, Any]) -> Reply:
    results = [m for m in body["messages"] if m["role"] == "tool"]
    if not results:
        return Reply(tool_calls=(ToolCall("measure", {"sample": "A"}), ToolCall("measure", {"sample": "B"})))
    return Reply(content="A and B measured: " + ", ".join(m["content"] for m in results))


def test_legacy_tool_loop_is_pinned(provider, legacy_proxy, replay_checked):
    provider.script(_tool_loop_script)
    client = legacy_proxy.client()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Measure A and B."}]
    with use_cassette(legacy_proxy.url, "legacy_tool_loop.yaml") as cassette:
        first = client.chat.completions.create(
            model="test-model", messages=messages, tools=TOOLS, extra_headers={"x-session-id": "pinned-loop"}
        )
        calls = first.choices[0].message.tool_calls
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": c.id, "content": f"{c.function.arguments} -> 1.0"} for c in calls]
        final = client.chat.completions.create(
            model="test-model", messages=messages, tools=TOOLS, extra_headers={"x-session-id": "pinned-loop"}
        )
    assert [c.function.name for c in calls] == ["measure", "measure"]
    assert final.choices[0].message.content.startswith("A and B measured")
    sent = [json.loads(request.body) for request in cassette.requests]
    assert [body["messages"] for body in sent] == [messages[:1], messages]  # the provider got what the client sent


def test_legacy_stream_is_pinned(provider, legacy_proxy, replay_checked):
    provider.script(lambda body: Reply(content="streamed answer, pinned in a cassette"))
    client = legacy_proxy.client()
    with use_cassette(legacy_proxy.url, "legacy_stream.yaml"):
        stream = client.chat.completions.create(
            model="test-model",
            messages=[{"role": "user", "content": "Say it."}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == "streamed answer, pinned in a cassette"
    )
    assert chunks[-1].usage is not None and chunks[-1].choices == []
