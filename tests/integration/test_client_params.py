"""No client can steer the provider call: only OpenAI's fields and a route's allowed extensions reach litellm.

A collector server on loopback stands where a hostile client would point the call; it must receive
nothing, while every steering field is refused with 400 ``unsupported_parameter`` before anything is
stored. What real client libraries send by default (captured bodies in tests/data/client_requests/)
still gets 200, served by the provider fast path.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acompletion_calls import count_acompletion
from tests.integration.conftest import route_to

MODEL = "test-model"
CLIENT_REQUESTS = Path(__file__).parents[1] / "data" / "client_requests"
MESSAGES = [{"role": "user", "content": "Index the peaks."}]


class Collector:
    """An HTTP server that answers nothing useful and records every request that reaches it."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                collector.requests.append((self.command, self.path, dict(self.headers)))
                self.send_response(500)
                self.send_header("content-length", "0")
                self.end_headers()

            do_GET = do_POST = do_PUT = _record

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()
    thread.join(timeout=5)


def steering_fields(collector_url: str) -> dict[str, Any]:
    """Every way a client could try to choose where, how or with what the provider is called."""
    v1 = f"{collector_url}/v1"
    return {
        "base_url": v1,
        "api_base": v1,
        "api_key": "sk-client-own",
        "api_version": "2024-01-01",
        "custom_llm_provider": "openai",
        "extra_headers": {"x-exfiltrate": "1"},
        "headers": {"x-exfiltrate": "1"},
        "extra_body": {"api_base": v1},
        "timeout": 0.001,
        "stream_timeout": 0.001,
        "num_retries": 9,
        "max_retries": 9,
        "mock_response": "canned answer",
        "mock_timeout": True,
        "fallbacks": [{"model": "openai/x", "api_base": v1}],
        "context_window_fallback_dict": {"openai/scripted": "openai/x"},
        "model_list": [{"model_name": MODEL, "litellm_params": {"model": "openai/x", "api_base": v1}}],
        "callbacks": [v1],
        "success_callback": ["langfuse"],
        "litellm_metadata": {"model_group": "x"},
        "litellm_logging_obj": {},
        "logger_fn": "print",
        "deployment_id": "x",
        "organization": "org-x",
        "azure_ad_token": "t",
        "aws_access_key_id": "AKIA",
        "vertex_credentials": "{}",
        "input_cost_per_token": 0,
        "proxy_server_request": {"url": v1},
        "top_k": 5,  # not OpenAI's: refused unless the route allows it
    }


def _stored_sessions(data_dir: Path) -> int:
    database = data_dir / "sessions.sqlite3"
    if not database.exists():
        return 0
    with sqlite3.connect(database) as connection:
        return int(connection.execute("SELECT count(*) FROM sessions").fetchone()[0])


@pytest.mark.parametrize("mode", ["dynamic", "legacy"])
def test_every_steering_field_is_refused_and_reaches_nobody(start_proxy, provider, collector, mode):
    proxy = start_proxy(mode=mode, trace_enabled=True)
    fields = steering_fields(collector.url)
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        for name, value in fields.items():
            body = {"model": MODEL, "messages": MESSAGES, name: value}
            for stream in (False, True):
                response = http.post("/v1/chat/completions", json={**body, "stream": stream})
                assert response.status_code == 400, (name, response.text)
                error = response.json()["error"]
                assert (error["type"], error["code"], error["param"]) == (
                    "invalid_request_error",
                    "unsupported_parameter",
                    name,
                )
                assert repr(name) in error["message"]
    assert collector.requests == []
    assert provider.history == []
    assert _stored_sessions(proxy.settings.data_dir) == 0
    assert not (proxy.settings.data_dir / "context-traces").exists()


def test_a_route_that_allows_top_k_passes_it_to_the_provider(start_proxy, provider):
    route = dataclasses.replace(
        route_to(provider.url), allowed_client_params=frozenset({"top_k", "chat_template_kwargs"})
    )
    proxy = start_proxy(models=(route,))
    extensions = {"top_k": 5, "chat_template_kwargs": {"enable_thinking": False}}
    answer = proxy.client().chat.completions.create(model=MODEL, messages=MESSAGES, extra_body=extensions)
    assert answer.choices[0].message.content == "ok"
    received = provider.history[-1]
    assert received["top_k"] == 5
    assert received["chat_template_kwargs"] == {"enable_thinking": False}
    assert received["model"] == "scripted"  # the route's model, whatever the client called it


def test_session_fields_are_read_and_never_reach_the_provider(start_proxy, provider):
    # An OpenAI catalog model: litellm sends ``user`` only to endpoints known to take it.
    route = route_to(provider.url)
    params = {**route.litellm_params, "model": "openai/gpt-4o-mini"}
    proxy = start_proxy(models=(dataclasses.replace(route, litellm_params=params),))
    client = proxy.client()
    metadata = {"session_id": "meta-run", "run_contract": "Deliver a report.", "experiment": "e7"}
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, metadata=metadata, user="analyst-3", extra_body={"litellm_session_id": "x"}
    )
    assert raw.headers["x-context-id"] == "meta-run"
    received = provider.history[-1]
    assert "metadata" not in received  # no store: OpenAI has no use for it, and it is not litellm's to log
    assert "litellm_session_id" not in received
    assert received["user"] == "analyst-3"
    assert "Deliver a report." in json.dumps(received["messages"])  # the proxy still read its run contract

    client.chat.completions.create(
        model=MODEL, messages=MESSAGES, metadata=metadata, store=True, extra_body={"litellm_session_id": "x"}
    )
    received = provider.history[-1]
    assert received["store"] is True
    assert received["metadata"] == {"experiment": "e7"}  # a stored completion keeps its tags, not the proxy's keys


def _strict_tool() -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": "measure",
            "description": "Measure a sample.",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"sample": {"type": "string"}},
                "required": ["sample"],
                "additionalProperties": False,
            },
        },
    }


def test_what_the_openai_sdk_sends_gets_200(start_proxy, provider):
    proxy = start_proxy()
    client = proxy.client()
    options: dict[str, Any] = {
        "tools": [_strict_tool()],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "temperature": 0.2,
        "top_p": 0.9,
        "max_completion_tokens": 500,
        "seed": 7,
        "stop": ["\n\n\n"],
        "n": 1,
        "user": "u-1",
        "extra_headers": {"x-session-id": "sdk"},
    }
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, **options)
    assert answer.choices[0].message.content == "ok"
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **options
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ok"
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert provider.history[-1]["stream_options"] == {"include_usage": True}
    assert provider.history[-1]["tools"][0]["function"]["strict"] is True


def _captured() -> list[Any]:
    params = []
    for path in sorted(CLIENT_REQUESTS.glob("*.json")):
        captured = json.loads(path.read_text())
        for name, body in captured["requests"].items():
            params.append(pytest.param(body, id=f"{captured['library']}-{captured['version']}-{name}"))
    return params


@pytest.mark.parametrize("body", _captured())
def test_what_client_libraries_send_by_default_gets_200(start_proxy, provider, body, monkeypatch):
    through_acompletion = count_acompletion(monkeypatch)
    proxy = start_proxy()
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        response = http.post("/v1/chat/completions", json={**body, "model": MODEL})
        assert response.status_code == 200, response.text
        if body.get("stream"):
            assert response.text.rstrip().endswith("data: [DONE]")
        else:
            assert response.json()["choices"][0]["message"]["content"] == "ok"
    sent = provider.history[-1]
    asked = {key for key, value in body.items() if key != "model" and value is not False}  # litellm omits defaults
    assert asked <= set(sent)  # nothing the client asked for was lost on the way
    # ... and it took the fast path: LangChain's "stream": false once sent every whole answer through acompletion
    assert through_acompletion == []
