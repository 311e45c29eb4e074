#!/usr/bin/env python3
"""Run the real Codex CLI and Claude Code against a base URL, or record what they send.

Not a test (pytest collects only ``tests/``): the agents are npm packages of a few hundred MB, so this
script installs them into a cache folder on first use and is run by hand, stdlib only:

    python3 scripts/real_agents.py                                  # both agents -> http://127.0.0.1:4000
    python3 scripts/real_agents.py --agent codex --base-url http://127.0.0.1:4000
    python3 scripts/real_agents.py --capture --isolate --out tests/data/agents
    .venv/bin/python scripts/real_agents.py --scripted-proxy --isolate  # through the real proxy, offline

Each agent gets a short task that needs one shell tool call and a final answer, with every telemetry,
update and error-reporting channel switched off, in a temporary home so the user's own configuration
never leaks in. ``--capture`` starts a scripted server on loopback instead of using ``--base-url``: it
answers in each wire format well enough for the agent to finish, and records every request and the
answer it gave (the fixtures under tests/data/agents/). ``--isolate`` re-runs the script in a network
namespace with only loopback (``unshare -n``, root), so nothing can leave the machine.
``--scripted-proxy`` starts the real proxy in front of the scripted provider for each scenario
(``scripts/scripted_proxy.py``, so it needs the project's virtualenv) and runs the agents through it:
a one-step task, eight big-output steps in a small window, and Codex's remote compaction
(tests/data/agents/REAL_RUNS.md has their output). With ``--native`` the proxy's routes are native
(``anthropic/`` for Claude Code, ``api: responses`` for Codex) in front of the strict stand-ins, Claude Code
thinks (``MAX_THINKING_TOKENS``, ``alwaysThinkingEnabled``) and Codex reasons (``model_reasoning_effort``,
``model_reasoning_summary``).
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CODEX_PACKAGE = "@openai/codex"
CLAUDE_PACKAGE = "@anthropic-ai/claude-code"
CODEX_VERSION = "0.171.0"
CLAUDE_VERSION = "2.1.197"
DEFAULT_BASE_URL = "http://127.0.0.1:4000"
DEFAULT_CACHE = Path.home() / ".cache" / "context-proxy-agents"
API_KEY = "test"
CODEX_MODEL = "gpt-5.5"
TASK = "Run the shell command `echo hello` with your shell tool, then answer with one line saying what it printed."
FINAL_TEXT = "The command printed: hello"
CHECKPOINT_SUMMARY = "Checkpoint: `echo hello` ran and printed hello; only the final answer remains."
# The first words of the prompt Codex sends when it compacts locally (a provider it does not take for OpenAI).
LOCAL_COMPACTION_PROMPT = "CONTEXT CHECKPOINT COMPACTION"
# Headers whose values are credentials; fixtures keep the name so a replay knows it was sent.
SECRET_HEADERS = {"authorization", "x-api-key", "proxy-authorization", "cookie", "openai-organization"}


# ---------------------------------------------------------------------------------------------------
# Installing the agents


@dataclass(frozen=True)
class Agents:
    """Command prefixes that start each installed agent."""

    codex: list[str]
    claude: list[str]


def install_agents(cache: Path, codex_version: str, claude_version: str) -> Agents:
    """Install both npm packages into ``cache`` unless the wanted versions are already there."""
    cache.mkdir(parents=True, exist_ok=True)
    wanted = {CODEX_PACKAGE: codex_version, CLAUDE_PACKAGE: claude_version}
    missing = [f"{name}@{version}" for name, version in wanted.items() if _installed(cache, name) != version]
    if missing:
        print(f"installing {' '.join(missing)} into {cache}", flush=True)
        if not (cache / "package.json").exists():
            (cache / "package.json").write_text('{"name": "agents-cache", "private": true}\n')
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(cache), *missing], check=True)
    modules = cache / "node_modules"
    # Claude Code's postinstall only copies its native binary over a placeholder; npm may refuse to
    # run install scripts, so start it through the wrapper that resolves the binary itself.
    return Agents(
        codex=["node", str(modules / CODEX_PACKAGE / "bin" / "codex.js")],
        claude=["node", str(modules / CLAUDE_PACKAGE / "cli-wrapper.cjs")],
    )


def _installed(cache: Path, name: str) -> str | None:
    manifest = cache / "node_modules" / name / "package.json"
    if not manifest.exists():
        return None
    version: str = json.loads(manifest.read_text())["version"]
    return version


# ---------------------------------------------------------------------------------------------------
# Running the agents


@dataclass
class Run:
    """What one agent run did: its command line, exit code and output."""

    agent: str
    scenario: str
    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float


def codex_config(
    base_url: str,
    extra: str = "",
    provider_name: str = "context proxy",
    model: str = CODEX_MODEL,
    show_reasoning: bool = False,
) -> str:
    """A config.toml that points Codex at ``base_url`` with every phone-home channel off.

    Codex compacts remotely only for a provider it takes for OpenAI, which it decides by the name
    ``OpenAI`` (or Azure); under any other name it sends its summarization prompt as a normal turn.
    """
    return f"""\
model = "{model}"
model_provider = "proxy"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
hide_agent_reasoning = {"false" if show_reasoning else "true"}
{extra}
[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
log_user_prompt = false

[model_providers.proxy]
name = "{provider_name}"
base_url = "{base_url.rstrip("/")}/v1"
wire_api = "responses"
env_key = "CONTEXT_PROXY_API_KEY"
request_max_retries = 1
stream_max_retries = 1
"""


def run_codex(
    agents: Agents,
    base_url: str,
    scenario: str,
    extra_config: str = "",
    provider_name: str = "context proxy",
    model: str = CODEX_MODEL,
    timeout: int = 120,
    task: str = TASK,
    show_reasoning: bool = False,
) -> Run:
    """``codex exec`` the task in a fresh CODEX_HOME and work folder (printing the reasoning summaries it gets
    when ``show_reasoning``)."""
    with tempfile.TemporaryDirectory(prefix="codex-") as tmp:
        home, work = Path(tmp) / "home", Path(tmp) / "work"
        home.mkdir()
        work.mkdir()
        (home / "config.toml").write_text(codex_config(base_url, extra_config, provider_name, model, show_reasoning))
        env = _clean_env(tmp) | {"CODEX_HOME": str(home), "CONTEXT_PROXY_API_KEY": API_KEY}
        argv = [*agents.codex, "exec", "--skip-git-repo-check", "--color", "never", "-C", str(work), task]
        return _run("codex", scenario, argv, env, work, timeout)


def run_claude(
    agents: Agents,
    base_url: str,
    scenario: str,
    extra_env: dict[str, str] | None = None,
    model: str | None = None,
    timeout: int = 120,
    task: str = TASK,
    settings: dict[str, Any] | None = None,
) -> Run:
    """``claude -p`` the task with a temporary HOME and config folder (holding ``settings`` as its
    settings.json when given)."""
    with tempfile.TemporaryDirectory(prefix="claude-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        if settings is not None:
            (Path(tmp) / "claude").mkdir()
            (Path(tmp) / "claude" / "settings.json").write_text(json.dumps(settings) + "\n")
        env = (
            _clean_env(tmp)
            | {
                "ANTHROPIC_BASE_URL": base_url.rstrip("/"),
                "ANTHROPIC_API_KEY": API_KEY,
                "CLAUDE_CONFIG_DIR": str(Path(tmp) / "claude"),
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_TELEMETRY": "1",
                "DISABLE_ERROR_REPORTING": "1",
                "DISABLE_AUTOUPDATER": "1",
                "DISABLE_BUG_COMMAND": "1",
                "CLAUDE_CODE_MAX_RETRIES": "1",
            }
            | (extra_env or {})
        )
        argv = [*agents.claude, "-p", task, *(["--model", model] if model else []), "--allowedTools", "Bash"]
        return _run("claude-code", scenario, argv, env, work, timeout)


def _clean_env(home: str) -> dict[str, str]:
    """The parent's PATH and locale only: no provider keys or proxies of the user's leak into a run."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR")
    return {k: os.environ[k] for k in keep if k in os.environ} | {"HOME": home, "NO_COLOR": "1"}


def _run(agent: str, scenario: str, argv: list[str], env: dict[str, str], cwd: Path, timeout: int) -> Run:
    start = time.monotonic()
    try:
        done = subprocess.run(
            argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = None, _text(exc.stdout), _text(exc.stderr) + f"\n[timed out after {timeout}s]"
    return Run(agent, scenario, argv, code, out, err, round(time.monotonic() - start, 1))


def _text(value: bytes | str | None) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value or ""


# ---------------------------------------------------------------------------------------------------
# The capture server: scripted answers in both wire formats, every exchange recorded


@dataclass
class Exchange:
    """One request as the agent sent it and the answer the capture server gave."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    response: dict[str, Any] = field(default_factory=dict)


Event = tuple[str, dict[str, Any]]


class Script:
    """Decides the answer to each request; ``fail`` turns model calls into a chosen error."""

    def __init__(self, fail: str | None = None) -> None:
        self.fail = fail
        self._ids = 0

    def next_id(self, prefix: str) -> str:
        """A short, deterministic id so recaptures diff cleanly."""
        self._ids += 1
        return f"{prefix}_{self._ids:04d}"

    # -- OpenAI Responses ---------------------------------------------------------------------------

    def responses(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | list[Event]]:
        """Stream a tool call, then the final text; a compaction item when Codex asks to compact."""
        if self.fail:
            return _openai_error(self.fail)
        items = body.get("input") or []
        tool = _codex_shell_tool(body.get("tools") or [])
        if items and items[-1].get("type") == "compaction_trigger":
            output = [self._compaction_item()]
        elif LOCAL_COMPACTION_PROMPT in _text_of(items[-1] if items else {}):
            output = [self._message(CHECKPOINT_SUMMARY)]
        elif tool is None or _task_done(items):
            output = [self._message(FINAL_TEXT)]
        else:
            output = [self._function_call(tool)]
        response = self._response(body, output)
        if not body.get("stream"):
            return 200, response
        return 200, list(self._response_events(response))

    def compact(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """``POST /responses/compact``: Codex replaces its history with the returned ``output`` items."""
        if self.fail:
            status, error = _openai_error(self.fail)
            return status, error
        retained = [i for i in body.get("input") or [] if i.get("type") == "message" and i.get("role") == "user"]
        return 200, {"output": [*retained, self._compaction_item()]}

    def _compaction_item(self) -> dict[str, Any]:
        # Opaque to Codex: it stores the item and sends it back verbatim at the head of later inputs.
        return {"type": "compaction", "id": self.next_id("cmp"), "encrypted_content": "capture-checkpoint-1"}

    def _message(self, text: str) -> dict[str, Any]:
        return {
            "type": "message",
            "id": self.next_id("msg"),
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        }

    def _function_call(self, tool: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "function_call",
            "id": self.next_id("fc"),
            "call_id": self.next_id("call"),
            "name": tool["name"],
            "arguments": json.dumps(_shell_arguments(tool), separators=(",", ":")),
            "status": "completed",
        }

    def _response(self, body: dict[str, Any], output: list[dict[str, Any]]) -> dict[str, Any]:
        # Usage is a plausible estimate so Codex's own auto-compaction threshold can be reached on purpose.
        input_tokens = len(json.dumps(body)) // 4
        return {
            "id": self.next_id("resp"),
            "object": "response",
            "created_at": 1_700_000_000,
            "status": "completed",
            "model": body.get("model", CODEX_MODEL),
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", False),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": [],
            "usage": {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 12,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens + 12,
            },
        }

    def _response_events(self, response: dict[str, Any]) -> Iterator[Event]:
        started = response | {"status": "in_progress", "output": [], "usage": None}
        seq = iter(range(1_000_000))
        yield "response.created", {"type": "response.created", "sequence_number": next(seq), "response": started}
        yield (
            "response.in_progress",
            {"type": "response.in_progress", "sequence_number": next(seq), "response": started},
        )
        for index, item in enumerate(response["output"]):
            where = {"output_index": index, "item_id": item["id"]}
            if item["type"] == "message":
                text = item["content"][0]["text"]
                empty = item | {"status": "in_progress", "content": []}
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                yield _ev("response.output_item.added", seq, output_index=index, item=empty)
                yield _ev("response.content_part.added", seq, **where, content_index=0, part=part)
                for chunk in _chunks(text):
                    yield _ev("response.output_text.delta", seq, **where, content_index=0, delta=chunk, logprobs=[])
                yield _ev("response.output_text.done", seq, **where, content_index=0, text=text, logprobs=[])
                yield _ev("response.content_part.done", seq, **where, content_index=0, part=item["content"][0])
            elif item["type"] == "function_call":
                args = item["arguments"]
                yield _ev("response.output_item.added", seq, output_index=index, item=item | {"arguments": ""})
                for chunk in _chunks(args):
                    yield _ev("response.function_call_arguments.delta", seq, **where, delta=chunk)
                yield _ev("response.function_call_arguments.done", seq, **where, arguments=args)
            else:
                yield _ev("response.output_item.added", seq, output_index=index, item=item)
            yield _ev("response.output_item.done", seq, output_index=index, item=item)
        yield _ev("response.completed", seq, response=response)

    # -- Anthropic Messages -------------------------------------------------------------------------

    def messages(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | list[Event]]:
        """Stream a Bash tool_use, then the final text; plain text for side requests without tools."""
        if self.fail:
            return _anthropic_error(self.fail)
        messages = body.get("messages") or []
        bash = next((t for t in body.get("tools") or [] if t.get("name") == "Bash"), None)
        if bash is None or _last_user_has_tool_result(messages):
            content = [{"type": "text", "text": FINAL_TEXT if bash else "Echo hello"}]
            stop = "end_turn"
        else:
            command = {"command": "echo hello", "description": "Print hello"}
            content = [
                {"type": "text", "text": "I'll run it."},
                {"type": "tool_use", "id": self.next_id("toolu"), "name": "Bash", "input": command},
            ]
            stop = "tool_use"
        input_tokens = len(json.dumps(body)) // 4
        message = {
            "id": self.next_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "output_tokens": 12,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        if not body.get("stream"):
            return 200, message
        return 200, list(self._message_events(message))

    def count_tokens(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """``POST /v1/messages/count_tokens``: a rough estimate, the shape is what matters."""
        return 200, {"input_tokens": len(json.dumps(body)) // 4}

    def _message_events(self, message: dict[str, Any]) -> Iterator[Event]:
        usage = message["usage"]
        start = message | {"content": [], "stop_reason": None, "usage": usage | {"output_tokens": 1}}
        yield "message_start", {"type": "message_start", "message": start}
        yield "ping", {"type": "ping"}
        for index, block in enumerate(message["content"]):
            if block["type"] == "text":
                first, deltas = (
                    {"type": "text", "text": ""},
                    [{"type": "text_delta", "text": c} for c in _chunks(block["text"])],
                )
            else:
                first = block | {"input": {}}
                deltas = [{"type": "input_json_delta", "partial_json": c} for c in _chunks(json.dumps(block["input"]))]
            yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": first}
            for delta in deltas:
                yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
            yield "content_block_stop", {"type": "content_block_stop", "index": index}
        yield (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        )
        yield "message_stop", {"type": "message_stop"}


def _ev(kind: str, seq: Iterator[int], **fields: Any) -> Event:
    return kind, {"type": kind, "sequence_number": next(seq), **fields}


def _chunks(text: str, size: int = 8) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _task_done(items: list[dict[str, Any]]) -> bool:
    """The one tool call has run, or a compaction (which only follows it) replaced the history."""
    done_types = {"function_call_output", "custom_tool_call_output", "compaction"}
    return any(i.get("type") in done_types or CHECKPOINT_SUMMARY in _text_of(i) for i in items)


def _text_of(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def _last_user_has_tool_result(messages: list[dict[str, Any]]) -> bool:
    if not messages or messages[-1].get("role") != "user" or isinstance(messages[-1].get("content"), str):
        return False
    return any(block.get("type") == "tool_result" for block in messages[-1]["content"])


def _codex_shell_tool(tools: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Codex's command tool under whichever name this version offers."""
    functions = {t.get("name"): t for t in tools if t.get("type") == "function"}
    return next((functions[n] for n in ("exec_command", "shell_command", "shell") if n in functions), None)


def _shell_arguments(tool: dict[str, Any]) -> dict[str, Any]:
    properties = (tool.get("parameters") or {}).get("properties") or {}
    if "cmd" in properties:
        return {"cmd": "echo hello"}
    if (properties.get("command") or {}).get("type") == "array":
        return {"command": ["bash", "-lc", "echo hello"]}
    return {"command": "echo hello"}


_ERRORS = {
    "bad_request": (400, "invalid_request_error", "Invalid value for 'input'."),
    "overflow": (400, "invalid_request_error", "prompt is too long: 250000 tokens > 200000 maximum"),
    "rate_limit": (429, "rate_limit_error", "Rate limit reached. Please try again later."),
    "server_error": (500, "api_error", "The server had an error while processing your request."),
    "overloaded": (529, "overloaded_error", "Overloaded"),
}


def _openai_error(kind: str) -> tuple[int, dict[str, Any]]:
    status, kind_type, message = _ERRORS[kind]
    code = "context_length_exceeded" if kind == "overflow" else kind
    if kind == "overflow":
        message = "Your input exceeds the context window of this model. Please adjust your input and try again."
    error_type = "invalid_request_error" if status == 400 else kind_type
    return status, {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def _anthropic_error(kind: str) -> tuple[int, dict[str, Any]]:
    status, kind_type, message = _ERRORS[kind]
    return status, {"type": "error", "error": {"type": kind_type, "message": message}}


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Agents drop idle keep-alive connections when they exit; that reset is not an error worth a trace.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class CaptureServer:
    """A loopback HTTP server answering with ``Script`` and keeping every exchange."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._server = _QuietServer(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """Where the agents are pointed."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> CaptureServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any] | list[Event]]:
        """Route one request to the script; anything unknown gets a 404 the agent can log and skip."""
        route = path.split("?", 1)[0].rstrip("/")
        payload = body if isinstance(body, dict) else {}
        routes: dict[str, Callable[[dict[str, Any]], tuple[int, Any]]] = {
            "/v1/responses": self.script.responses,
            "/v1/responses/compact": self.script.compact,
            "/v1/messages": self.script.messages,
            "/v1/messages/count_tokens": self.script.count_tokens,
        }
        if method == "POST" and route in routes:
            return routes[route](payload)
        return 404, {"error": {"message": f"{method} {route} is not served here", "type": "not_found", "code": None}}

    def record(self, exchange: Exchange) -> None:
        """Keep one exchange, in arrival order."""
        with self._lock:
            self.exchanges.append(exchange)

    def _handler_class(self) -> type[http.server.BaseHTTPRequestHandler]:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self._handle()

            def do_POST(self) -> None:
                self._handle()

            def do_HEAD(self) -> None:
                self._handle()

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body: Any
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = {"undecoded_bytes": len(raw), "content_encoding": self.headers.get("Content-Encoding")}
                exchange = Exchange(self.command, self.path, dict(self.headers.items()), body)
                status, answer = server.answer(self.command, self.path, body)
                if isinstance(answer, list):
                    exchange.response = {
                        "status": status,
                        "content_type": "text/event-stream",
                        "events": [{"event": e, "data": d} for e, d in answer],
                    }
                    self._stream(status, answer)
                else:
                    exchange.response = {"status": status, "content_type": "application/json", "body": answer}
                    self._json(status, answer)
                server.record(exchange)

            def _json(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("request-id", f"req_{uuid.uuid4().hex[:12]}")
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, status: int, events: list[Event]) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for name, data in events:
                    frame = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        return Handler


# ---------------------------------------------------------------------------------------------------
# Fixtures


def write_fixtures(exchanges: list[Exchange], folder: Path) -> list[Path]:
    """One JSON file per exchange, ``NN-<endpoint>.json``, credentials replaced by REDACTED."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for number, exchange in enumerate(exchanges, start=1):
        endpoint = exchange.path.split("?", 1)[0].removeprefix("/v1/").strip("/").replace("/", "-") or "root"
        path = folder / f"{number:02d}-{endpoint}.json"
        headers = {k: ("REDACTED" if k.lower() in SECRET_HEADERS else v) for k, v in exchange.headers.items()}
        record = {
            "method": exchange.method,
            "path": exchange.path,
            "headers": headers,
            "body": exchange.body,
            "response": exchange.response,
        }
        path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
        written.append(path)
    return written


# ---------------------------------------------------------------------------------------------------
# Command line

# Codex scenarios: the plain task; the same with a tiny auto-compaction limit, once under a provider name
# Codex compacts locally for (a summarization prompt as an ordinary turn) and once under the name
# "OpenAI", for which it compacts remotely (compaction v2: a ``compaction_trigger`` input item on
# /responses; 0.171 lists the v1 ``POST /responses/compact`` path as a removed feature).
_TINY_LIMIT = "model_context_window = 200000\nmodel_auto_compact_token_limit = 3000\n"
CODEX_SCENARIOS: dict[str, tuple[str, str]] = {
    "task": ("", "context proxy"),
    "compact-local": (_TINY_LIMIT, "context proxy"),
    "compact-remote": (_TINY_LIMIT, "OpenAI"),
}


def report(run: Run, exchanges: list[Exchange] | None = None) -> None:
    """Print what a run did: exit code, time, the agent's output and the requests it made."""
    status = "timed out" if run.returncode is None else f"exit {run.returncode}"
    print(f"\n=== {run.agent} [{run.scenario}]: {status} in {run.seconds}s")
    if exchanges is not None:
        for ex in exchanges:
            print(f"  {ex.method} {ex.path} -> {ex.response.get('status')}")
    for label, text in (("stdout", run.stdout), ("stderr", run.stderr)):
        lines = _fold_numbers([line for line in text.strip().splitlines() if line.strip()])
        if lines:
            shown = lines if len(lines) <= 80 else [*lines[:30], f"... {len(lines) - 60} lines ...", *lines[-30:]]
            print(f"  --- {label}")
            print("\n".join(f"  | {line}" for line in shown))


def _fold_numbers(lines: list[str]) -> list[str]:
    """Runs of bare numbers (the printed ``seq`` output of the long scenarios) as one line each."""
    folded: list[str] = []
    run: list[str] = []
    for line in [*lines, ""]:
        if line.strip().isdigit():
            run.append(line.strip())
            continue
        if len(run) > 4:
            folded += [run[0], f"[... {len(run) - 2} more numbers ...]", run[-1]]
        else:
            folded += run
        run = []
        if line:
            folded.append(line)
    return folded


CLAUDE_SCENARIOS: dict[str, str | None] = {"task": None, "sonnet-4-5": "claude-sonnet-4-5"}


def capture(agents: Agents, args: argparse.Namespace) -> int:
    """Run each chosen agent against a fresh capture server per scenario and write the fixtures.

    The plain task lands in ``<out>/<agent>-<version>/``, every other scenario in a subfolder of it,
    and a ``--fail`` run in ``error-<kind>/``.
    """
    jobs: list[tuple[str, str, Callable[[str], Run]]] = []
    if args.agent in ("codex", "both"):
        for name, (extra, provider) in CODEX_SCENARIOS.items():

            def start_codex(url: str, n: str = name, e: str = extra, p: str = provider) -> Run:
                return run_codex(agents, url, n, e, p, CODEX_MODEL, args.timeout)

            jobs.append((f"codex-{args.codex_version}", name, start_codex))
    if args.agent in ("claude", "both"):
        for name, model in CLAUDE_SCENARIOS.items():

            def start_claude(url: str, n: str = name, m: str | None = model) -> Run:
                return run_claude(agents, url, n, None, m, args.timeout)

            jobs.append((f"claude-code-{args.claude_version}", name, start_claude))
    if args.fail:
        jobs = [job for job in jobs if job[1] == "task"]
    failures = 0
    for folder, scenario, start in jobs:
        with CaptureServer(Script(fail=args.fail)) as server:
            run = start(server.base_url)
        report(run, server.exchanges)
        failures += run.returncode != 0
        target = Path(args.out) / folder
        if args.fail:
            target /= f"error-{args.fail}"
        elif scenario != "task":
            target /= scenario
        if target.exists():
            for old in target.glob("*.json"):
                old.unlink()
        for path in write_fixtures(server.exchanges, target):
            print(f"  wrote {path}")
        (target / "run.json").write_text(json.dumps(run.__dict__ | {"argv": _portable(run.argv)}, indent=2) + "\n")
    return 1 if failures and not args.fail else 0


# ---------------------------------------------------------------------------------------------------
# The agents through the real proxy in front of the scripted provider (scripts/scripted_proxy.py)

LONG_TASK = (
    "Run each shell command you are asked to, one at a time, with your shell tool; when no command is left, "
    "answer with one line."
)


@dataclass(frozen=True)
class ProxyScenario:
    """One run of an agent through the scripted proxy: what the model does and how the agent is set up."""

    name: str
    agent: str  # "codex" or "claude"
    steps: int = 1
    command: str = "echo hello"
    context_window_tokens: int | None = None  # SCIENCE_AGENT_CONTEXT_WINDOW_TOKENS for the proxy
    prompt_percent: int | None = None  # SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT: Codex's prompt alone is ~10k tokens
    codex_extra: str = ""
    codex_provider: str = "context proxy"
    task: str = TASK
    claude_model: str | None = None  # the model Claude Code asks for (None: --claude-model, else its default)
    native_only: bool = False  # a scenario of --native runs only


PROXY_SCENARIOS = [
    ProxyScenario("task", "codex"),
    ProxyScenario("task", "claude"),
    # Claude Code's default model thinks adaptively; Sonnet 4.5 takes a budget (MAX_THINKING_TOKENS).
    ProxyScenario("task-sonnet-4-5", "claude", claude_model="claude-sonnet-4-5", native_only=True),
    # Big tool outputs (`seq 1 5000`: about 24 KB each) in a 40k-token window: the proxy previews old
    # outputs and checkpoints old steps. The agents' own prompts are large (Codex ~10k tokens of
    # instructions, Claude Code ~20k of tools), hence a window this size and a 40% prompt budget.
    ProxyScenario("long", "codex", 8, "seq 1 5000", 40_000, 40, task=LONG_TASK),
    ProxyScenario("long", "claude", 8, "seq 1 5000", 40_000, 40, task=LONG_TASK),
    # Codex compacts remotely (provider named "OpenAI") once its usage passes a small limit: the proxy
    # answers the compaction_trigger with its own checkpoint, and the turn goes on with that item.
    ProxyScenario(
        "long-remote-compaction",
        "codex",
        8,
        "seq 1 5000",
        40_000,
        40,
        codex_extra="model_context_window = 200000\nmodel_auto_compact_token_limit = 15000\n",
        codex_provider="OpenAI",
        task=LONG_TASK,
    ),
]


# --native: what turns thinking and reasoning on. Claude Code 2.1.197 thinks unless settings say
# ``alwaysThinkingEnabled: false``; ``MAX_THINKING_TOKENS`` > 0 asks for a budget (``thinking: enabled``) on
# the models that take one. Codex asks for reasoning with its config's effort and summary.
NATIVE_CLAUDE_ENV = {"MAX_THINKING_TOKENS": "3000"}
NATIVE_CLAUDE_SETTINGS = {"alwaysThinkingEnabled": True}
NATIVE_CODEX_CONFIG = 'model_reasoning_effort = "high"\nmodel_reasoning_summary = "auto"\n'


@contextlib.contextmanager
def scripted_proxy(scenario: ProxyScenario, native: bool = False) -> Iterator[tuple[str, Path]]:
    """Start ``scripts/scripted_proxy.py`` (the real proxy and the scripted provider, or with ``native`` the
    strict stand-ins behind native routes); yield its URL and data."""
    kind = "native" if native else "scripted"
    data = Path(tempfile.mkdtemp(prefix=f"{kind}-proxy-{scenario.agent}-{scenario.name}-"))
    argv = [sys.executable, str(Path(__file__).with_name("scripted_proxy.py")), "--data-dir", str(data)]
    argv += ["--steps", str(scenario.steps), "--command", scenario.command, *(["--native"] if native else [])]
    if scenario.context_window_tokens:
        argv += ["--context-window-tokens", str(scenario.context_window_tokens)]
    if scenario.prompt_percent:
        argv += ["--prompt-percent", str(scenario.prompt_percent)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("READY "):
            raise SystemExit(f"scripted proxy did not start (run this script with the project's .venv python): {line}")
        yield line.split()[1], data
    finally:
        process.terminate()
        process.wait(timeout=60)


def run_through_proxy(agents: Agents, args: argparse.Namespace) -> int:
    """Each scenario: a fresh proxy, the agent on its task, and what the proxy and its provider saw."""
    failures = 0
    chosen = [
        s
        for s in PROXY_SCENARIOS
        if args.agent in (s.agent, "both")
        and (not args.scenario or s.name in args.scenario)
        and (args.native or not s.native_only)
    ]
    native = args.native
    for scenario in chosen:
        with scripted_proxy(scenario, native) as (url, data):
            if scenario.agent == "codex":
                run = run_codex(
                    agents,
                    url,
                    scenario.name,
                    scenario.codex_extra + (NATIVE_CODEX_CONFIG if native else ""),
                    scenario.codex_provider,
                    CODEX_MODEL,
                    args.timeout,
                    scenario.task,
                    show_reasoning=native,
                )
            else:
                run = run_claude(
                    agents,
                    url,
                    scenario.name,
                    NATIVE_CLAUDE_ENV if native else None,
                    scenario.claude_model or args.claude_model,
                    args.timeout,
                    scenario.task,
                    NATIVE_CLAUDE_SETTINGS if native else None,
                )
        report(run)
        print(f"  proxy data: {data}")
        print(f"  command: {shlex.join(_portable(run.argv))}")
        provider = json.loads((data / "provider.json").read_text()) if (data / "provider.json").exists() else {}
        print(f"  scripted model answered: {' '.join(provider.get('answers', []))}")
        if native:
            failures += _report_native(provider)
        traces = sorted((data / "store").glob("context-traces/*/*.json"))
        records = [json.loads(t.read_text()) for t in traces]
        compactions = sum(1 for r in records if (r.get("compaction") or {}).get("reason"))
        print(f"  proxy traces: {len(traces)} model calls, {compactions} with a compaction", end="")
        if native:
            passed = sum(1 for r in records if (r.get("ingress") or {}).get("passage") == "native")
            asked = sum(1 for r in records if (r.get("compaction") or {}).get("reason") == "client_compaction_request")
            summarized = sum(len(r.get("summarizerCalls") or []) for r in records)
            print(f"; {passed} passed natively, {asked} compaction request(s) of the agent", end="")
            print(f", {summarized} summarizer call(s)", end="")
        print()
        failures += run.returncode != 0
    return 1 if failures else 0


def _report_native(provider: dict[str, Any]) -> int:
    """Print what the strict stand-ins received (native fields, thinking and reasoning sent back); 1 when
    one of them refused a request."""
    received = provider.get("native") or []
    refused = int(provider.get("refused") or 0)
    print(f"  stand-ins received: {len(received)} model requests, {refused} refused")
    shown: list[str] = []
    for request in received:
        fields = {k: v for k, v in request.items() if k not in ("thinking_blocks_sent", "encrypted_reasoning_sent")}
        line = json.dumps(fields, sort_keys=True)
        if line not in shown:
            shown.append(line)
    for line in shown:
        print(f"    {line}")
    thinking = [r["thinking_blocks_sent"] for r in received]
    reasoning = [r["encrypted_reasoning_sent"] for r in received]
    print(f"  signed thinking blocks sent back per request: {thinking}")
    print(f"  encrypted reasoning items sent back per request: {reasoning}")
    return 1 if refused else 0


def _portable(argv: list[str]) -> list[str]:
    """The command line without this machine's cache path, so fixtures do not change per machine."""
    return [Path(a).name if os.sep in a and Path(a).exists() else a for a in argv]


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, install the agents if needed and run them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--base-url", default=DEFAULT_BASE_URL, help="proxy to run the agents against")
    parser.add_argument("--agent", choices=["codex", "claude", "both"], default="both")
    parser.add_argument("--capture", action="store_true", help="start the capture server instead of --base-url")
    parser.add_argument("--out", default="tests/data/agents", help="fixture folder for --capture")
    parser.add_argument("--fail", choices=sorted(_ERRORS), help="with --capture: answer model calls with this error")
    parser.add_argument("--isolate", action="store_true", help="run in a network namespace with only loopback")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the npm packages are installed")
    parser.add_argument("--codex-version", default=CODEX_VERSION)
    parser.add_argument("--claude-version", default=CLAUDE_VERSION)
    parser.add_argument("--timeout", type=int, default=120, help="seconds before an agent run is killed")
    parser.add_argument("--codex-model", default=CODEX_MODEL, help="model name Codex asks for")
    parser.add_argument(
        "--codex-provider-name",
        default="context proxy",
        help='provider name in config.toml; "OpenAI" makes Codex compact remotely (compaction_trigger)',
    )
    parser.add_argument("--claude-model", default=None, help="model name Claude Code asks for (its default if unset)")
    parser.add_argument(
        "--scripted-proxy",
        action="store_true",
        help="run the agents through the real proxy in front of the scripted provider (needs the project's .venv)",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="with --scripted-proxy: native routes (anthropic/, api: responses) in front of the strict stand-ins,"
        " Claude Code thinking and Codex reasoning",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=sorted({s.name for s in PROXY_SCENARIOS}),
        help="with --scripted-proxy: only these scenarios (default: all)",
    )
    args = parser.parse_args(argv)

    # Installing needs the registry, so it happens before the network is cut off.
    agents = install_agents(args.cache, args.codex_version, args.claude_version)
    if args.isolate and os.environ.get("REAL_AGENTS_ISOLATED") != "1":
        return _reexec_isolated(argv if argv is not None else sys.argv[1:])
    if args.capture:
        return capture(agents, args)
    if args.scripted_proxy:
        return run_through_proxy(agents, args)
    runs = []
    if args.agent in ("codex", "both"):
        runs.append(
            run_codex(
                agents,
                args.base_url,
                "task",
                provider_name=args.codex_provider_name,
                model=args.codex_model,
                timeout=args.timeout,
            )
        )
    if args.agent in ("claude", "both"):
        runs.append(run_claude(agents, args.base_url, "task", model=args.claude_model, timeout=args.timeout))
    for run in runs:
        report(run)
    return 1 if any(r.returncode != 0 for r in runs) else 0


def _reexec_isolated(argv: list[str]) -> int:
    if platform.system() != "Linux" or not shutil.which("unshare"):
        sys.exit("--isolate needs Linux with unshare(1)")
    inner = f"ip link set lo up && exec {sys.executable} {' '.join(map(_quote, [__file__, *argv]))}"
    env = os.environ | {"REAL_AGENTS_ISOLATED": "1"}
    return subprocess.run(["unshare", "--net", "sh", "-c", inner], env=env).returncode


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


if __name__ == "__main__":
    sys.exit(main())
