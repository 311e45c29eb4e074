"""A tiny scripted OpenAI-compatible server on loopback, and litellm imported once per session.

Each test scripts its own replies under a fresh path prefix (``add`` returns the ``api_base``), so
tests never see each other's replies and the one server serves the whole session.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from proxy.process.offline import prepare_offline_environment
from proxy.provider.litellm_backend import close_loop_clients
from proxy.provider.scripted import serve_in_thread


@dataclass
class Reply:
    """One scripted answer: ``body`` (dict/list as JSON, str as is) or, for stream requests, ``chunks`` as SSE
    (OpenAI's: ``data:`` lines ending with ``[DONE]``) or ``events`` as Anthropic's SSE (each event named by
    its ``type``, no ``[DONE]``)."""

    status: int = 200
    body: Any = None
    chunks: list[dict[str, Any]] | None = None
    events: list[dict[str, Any]] | None = None
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


class ScriptedProvider:
    """The server's script and what it received."""

    def __init__(self) -> None:
        self.port = 0
        self._replies: dict[str, Reply] = {}
        self.received: dict[str, list[dict[str, Any]]] = {}
        self.requests: dict[str, list[tuple[str, dict[str, str]]]] = {}  # each request's path and headers
        self.bodies: dict[str, list[bytes]] = {}  # each request's body, as it came over the socket
        self._names = itertools.count()
        self._lock = threading.Lock()

    def add(self, **reply: Any) -> str:
        """Script a ``Reply(**reply)`` under a new prefix and return the ``api_base`` that reaches it."""
        with self._lock:
            name = f"s{next(self._names)}"
            self._replies[name] = Reply(**reply)
            self.received[name] = []
            self.requests[name] = []
            self.bodies[name] = []
        return f"http://127.0.0.1:{self.port}/{name}/v1"

    def answer(
        self,
        name: str,
        request: dict[str, Any],
        path: str = "",
        headers: dict[str, str] | None = None,
        raw: bytes = b"",
    ) -> Reply | None:
        with self._lock:
            if name in self.received:
                self.received[name].append(request)
                self.bodies[name].append(raw)
                self.requests[name].append((path, {key.lower(): value for key, value in (headers or {}).items()}))
            return self._replies.get(name)


def _handler(script: ScriptedProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            request = json.loads(raw or b"{}")
            reply = script.answer(self.path.split("/")[1], request, self.path, dict(self.headers), raw)
            if reply is None:
                self._send(404, b'{"error": {"message": "no script"}}', "application/json", {})
                return
            time.sleep(reply.delay)
            if request.get("stream") and reply.events is not None:
                events = "".join(f"event: {event.get('type')}\ndata: {json.dumps(event)}\n\n" for event in reply.events)
                self._send(reply.status, events.encode(), "text/event-stream", reply.headers)
            elif request.get("stream") and reply.chunks is not None:
                events = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in reply.chunks) + "data: [DONE]\n\n"
                self._send(reply.status, events.encode(), "text/event-stream", reply.headers)
            elif isinstance(reply.body, str):
                self._send(reply.status, reply.body.encode(), reply.content_type or "text/plain", reply.headers)
            else:
                payload = json.dumps(reply.body).encode()
                self._send(reply.status, payload, reply.content_type or "application/json", reply.headers)

        def _send(self, status: int, payload: bytes, content_type: str, headers: dict[str, str]) -> None:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(payload)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a timed-out client has gone
                self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            pass

    return Handler


@pytest.fixture(scope="session")
def provider() -> Iterator[ScriptedProvider]:
    """The running scripted provider, shared by the session."""
    script = ScriptedProvider()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(script))
    server.daemon_threads = True
    script.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield script
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture(scope="session")
def litellm() -> ModuleType:
    """litellm, imported once (it takes seconds), offline, without its debug banner on every error."""
    prepare_offline_environment()
    import litellm as module

    module.suppress_debug_info = True
    return module


@pytest.fixture(autouse=True)
async def _close_litellm_clients() -> AsyncIterator[None]:
    """After each test, close what litellm cached on its event loop: the provider connections would
    otherwise stay open until the collector finds them, unclosed, in some later test."""
    yield
    module = sys.modules.get("litellm")
    if module is not None:
        await close_loop_clients(module)
        # litellm makes its module-level client (Anthropic's streams go through it) once per process, in the
        # loop of its first use, and keeps it on the module: closed above with that loop's clients, it would
        # serve the next test's loop with connections nobody closes. The next use makes it afresh.
        vars(module).pop("module_level_aclient", None)


@pytest.fixture(scope="session")
def schemas() -> dict[str, Any]:
    """OpenAI's chat-completions JSON Schemas (a copy of ../shared/data/openai-chat-schemas.json)."""
    data = json.loads((Path(__file__).parent / "data" / "openai-chat-schemas.json").read_text("utf-8"))
    return dict(data["schemas"])


class Loopback:
    """One uvicorn server for the session; each test mounts its own stand-in's app on it (starting a server
    per test costs a fifth of a second)."""

    def __init__(self) -> None:
        self.url = ""
        self.app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)

    @contextlib.contextmanager
    def mount(self, app: Any) -> Iterator[str]:
        """Serve ``app`` for the duration; yields the base URL."""
        self.app = app
        try:
            yield self.url
        finally:
            self.app = None


@pytest.fixture(scope="session")
def loopback() -> Iterator[Loopback]:
    """The session's loopback server for stand-in apps."""
    server = Loopback()
    with serve_in_thread(server, lifespan="off") as url:
        server.url = url
        yield server
