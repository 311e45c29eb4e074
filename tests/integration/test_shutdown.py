"""Shutdown through a real uvicorn server: in-flight answers finish within the grace, and a stream still
open when it is over ends with an error event and ``[DONE]`` instead of a cut connection."""

from __future__ import annotations

import gc
import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import yaml

from proxy.app import create_app
from proxy.kernel.config import Settings
from proxy.process.drain import DrainingServer, server_for
from proxy.provider.scripted import Reply, free_port

from .conftest import route_to
from .test_serve import serving

MESSAGES = [{"role": "user", "content": "Stream the long report."}]


@contextmanager
def _serving(settings: Settings) -> Iterator[tuple[str, DrainingServer, threading.Thread]]:
    app = create_app(settings)
    port = free_port()
    server = server_for(app, app.state.drain, "127.0.0.1", port, log_level="warning", loop="asyncio")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", server, thread
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _stream_lines(url: str, stop: DrainingServer, headers: dict[str, str]) -> tuple[list[str], float]:
    """Read a stream, asking the server to stop (as SIGTERM does) after the first chunk."""
    with httpx.Client(base_url=url, timeout=30) as http:
        body = {"model": "test-model", "messages": MESSAGES, "stream": True}
        with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            read = [next(lines)]
            stop.should_exit = True
            started = time.monotonic()
            read += list(lines)
    return [line for line in read if line], time.monotonic() - started


def test_a_stream_that_ends_within_the_grace_finishes_normally(tmp_path: Path, provider):
    provider.script(lambda body: Reply(content="y" * 160), chunk_delay=0.05)  # 10 chunks, about 0.5 s
    settings = Settings(data_dir=tmp_path / "data", models=(route_to(provider.url),), shutdown_grace_seconds=10)
    with _serving(settings) as (url, server, thread):
        lines, _ = _stream_lines(url, server, {"x-session-id": "drains"})
        thread.join(timeout=15)
        assert not thread.is_alive()
    assert lines[-1] == "data: [DONE]"
    assert not any(line.startswith("event: error") for line in lines)
    text = "".join(
        (c["choices"][0]["delta"].get("content") or "") if c.get("choices") else ""
        for c in (json.loads(line[6:]) for line in lines if line.startswith("data: {"))
    )
    assert text == "y" * 160
    assert provider.provider.streams_finished == 1


def test_a_stream_still_open_after_the_grace_ends_with_an_error_event(tmp_path: Path, provider):
    provider.script(lambda body: Reply(content="z" * 1_600), chunk_delay=0.1)  # 100 chunks, about 10 s
    settings = Settings(data_dir=tmp_path / "data", models=(route_to(provider.url),), shutdown_grace_seconds=1)
    with _serving(settings) as (url, server, thread):
        lines, seconds = _stream_lines(url, server, {"x-session-id": "cut-short"})
        thread.join(timeout=15)
        assert not thread.is_alive()
    assert seconds < 5  # the grace (1 s), not the stream's 10 s
    assert lines[-1] == "data: [DONE]"
    assert lines[-3] == "event: error"
    error = json.loads(lines[-2][len("data: ") :])["error"]
    assert error["code"] == "server_shutting_down"
    deadline = time.monotonic() + 5
    while provider.provider.streams_abandoned == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert provider.provider.streams_abandoned == 1  # the provider call was closed, not left running


def _open_sockets_to(url: str) -> set[int]:
    """The file descriptors of this process's open sockets connected to ``url``'s port."""
    port = httpx.URL(url).port
    found = set()
    for candidate in gc.get_objects():
        if isinstance(candidate, socket.socket) and candidate.fileno() != -1:
            try:
                peer = candidate.getpeername()
            except OSError:  # not connected
                continue
            if isinstance(peer, tuple) and peer[1] == port:
                found.add(candidate.fileno())
    return found


def test_a_stopped_proxy_leaves_no_provider_connection_open(start_proxy, provider):
    before = _open_sockets_to(provider.url)  # other proxies' connections are not this test's business
    proxy = start_proxy()
    with httpx.Client(base_url=proxy.url) as http:
        answer = http.post("/v1/chat/completions", json={"model": "test-model", "messages": MESSAGES})
    assert answer.status_code == 200, answer.text
    assert _open_sockets_to(provider.url) - before  # litellm keeps the connection alive for the next call
    proxy.stop()
    # litellm caches that client per event loop and never closes it: a proxy that stopped without
    # closing it left the socket open until the cache dropped the client, and the collector then
    # found it unclosed (a ResourceWarning in whatever test happened to be running).
    assert _open_sockets_to(provider.url) - before == set()


def test_sigterm_drains_with_readiness_down_and_503_for_new_requests_then_exits_0(tmp_path: Path, provider):
    """``serve`` as operators run it, sent SIGTERM while a turn waits on the provider: the server keeps
    listening, so the readiness check says 503 ``draining`` (a load balancer fails over) and a new request
    gets 503 ``server_shutting_down`` in its API's shape (Messages: 529 ``overloaded_error``) instead of a
    refused connection; the turn in flight is answered; then the process exits 0 (uvicorn re-raised the
    signal: exit -15)."""
    provider.provider.latency = 3.0
    entry = {
        "model_name": "test-model",
        "litellm_params": {"model": "openai/scripted", "api_base": f"{provider.url}/v1", "api_key": "sk-test"},
        "model_info": {"max_input_tokens": 16_000, "max_output_tokens": 1_000},
    }
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"model_list": [entry]}))
    grace = "30"
    with serving(
        tmp_path, tmp_path / "data", "127.0.0.1", "--config", str(config), CONTEXT_PROXY_SHUTDOWN_GRACE_SECONDS=grace
    ) as server:
        url = f"http://127.0.0.1:{server.port}"
        answers: list[str | None] = []

        def in_flight() -> None:
            with openai.OpenAI(base_url=f"{url}/v1", api_key="sk-client", max_retries=0, timeout=60) as client:
                answer = client.chat.completions.create(model="test-model", messages=MESSAGES)
            answers.append(answer.choices[0].message.content)

        sender = threading.Thread(target=in_flight)
        sender.start()
        deadline = time.monotonic() + 30
        while not provider.history:  # the turn is waiting on the provider
            assert time.monotonic() < deadline and sender.is_alive()
            time.sleep(0.02)
        server.process.send_signal(signal.SIGTERM)
        with httpx.Client(base_url=url, timeout=10) as http:
            deadline = time.monotonic() + 5
            while (ready := http.get("/health/readiness")).status_code == 200:
                assert time.monotonic() < deadline, "readiness still 200 after SIGTERM"
                time.sleep(0.02)
            assert ready.status_code == 503 and ready.json()["status"] == "draining"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-client", max_retries=0)
        with client, pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "new"}])
        assert refused.value.status_code == 503
        assert refused.value.body["code"] == "server_shutting_down"  # type: ignore[index]
        claude = anthropic.Anthropic(base_url=url, api_key="sk-client", max_retries=0)
        with claude, pytest.raises(anthropic.APIStatusError) as refused_messages:
            claude.messages.create(model="test-model", max_tokens=100, messages=[{"role": "user", "content": "new"}])
        # Anthropic's words for a server that cannot take the request now (proxy/ingress/messages/errors.py).
        assert refused_messages.value.status_code == 529
        assert refused_messages.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
        sender.join(timeout=30)
        answered = time.monotonic()
        assert answers == ["ok"]  # the turn in flight was answered
        assert server.process.wait(timeout=25) == 0, server.output()
        # It stopped once nothing was in flight (then a few seconds of shutdown), not after the 30 s grace.
        assert time.monotonic() - answered < 15
        assert len(provider.history) == 1  # the refused requests never reached the provider
        assert "Traceback" not in server.output()
