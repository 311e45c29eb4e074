"""Turns per second through one and through two real proxy replicas sharing one PostgreSQL schema.

Run: ``.venv/bin/python bench/replicas.py [--sessions 30] [--turns 20] [--runs 3]``

Each configuration starts real ``python -m proxy serve`` processes on a fresh schema, points them at a
scripted provider served in this process, and drives ``--sessions`` concurrent tool-loop sessions of
``--turns`` model calls each (every turn resends the whole history plus the new tool result; with two
replicas a session's turns alternate between them). Prints a Markdown table with the median of
``--runs`` runs. Start-up is not timed. Client, provider and replicas share this machine's cores, so
the ratio says how the proxy scales only up to that limit.

The process and load harness here is also what ``tests/integration/test_replicas.py`` drives (it loads
this file by path): the test asserts on the outcome, this script only measures it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from proxy.provider.scripted import Reply, ScriptedProvider, ToolCall, free_port, serve_in_thread

MODEL = "replica-model"
TASK_PREFIX = "replica task "
TOOL_NAME = "lookup"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "Look up the next measurement.",
            "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}, "required": ["step"]},
        },
    }
]
DEFAULT_PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"
_PROXY_ENV_PREFIXES = ("CONTEXT_PROXY_", "SCIENCE_AGENT_", "MODEL_MAX_TOKENS", "OUTPUT_RESERVE_TOKENS")
# A result long enough that a 20-turn history is a few KB, like a real agent's, not a toy.
_RESULT_FILLER = "measured value within tolerance; calibration nominal; " * 6


# --- the scripted model -------------------------------------------------------------------------


def tool_result(session_id: str, step: int) -> str:
    """The client's (deterministic) tool output for ``step`` of a session."""
    return f"result of step {step} for {session_id}: {_RESULT_FILLER}"


def session_of(body: Mapping[str, Any]) -> str | None:
    """The session a provider request belongs to, read from its task message (headers are not forwarded)."""
    for message in body.get("messages", []):
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, str) and content.startswith(TASK_PREFIX):
            return content[len(TASK_PREFIX) :]
    return None


def tool_loop_script(turns: int) -> Any:
    """A model that calls ``lookup`` for steps 1..turns-1, one per call, then answers.

    The next step is read from the last tool result rather than counted, so the script keeps working
    once the proxy windows or compacts older steps away.
    """

    def script(body: dict[str, Any]) -> Reply:
        done = 0
        for message in reversed(body.get("messages", [])):
            if message.get("role") == "tool" and str(message.get("content", "")).startswith("result of step "):
                done = int(str(message["content"]).split()[3])
                break
        if done + 1 < turns:
            return Reply(tool_calls=(ToolCall(TOOL_NAME, {"step": done + 1}),))
        return Reply(content=f"finished after {done} steps")

    return script


# --- PostgreSQL ---------------------------------------------------------------------------------


def pg_candidates() -> list[str]:
    """DSNs to try: ``CONTEXT_PROXY_TEST_PG``, else the default as ``postgres`` and as the current user."""
    configured = os.environ.get("CONTEXT_PROXY_TEST_PG")
    if configured:
        return [configured]
    return [DEFAULT_PG_DSN, DEFAULT_PG_DSN.replace("postgres@", f"{getpass.getuser()}@", 1)]


async def find_postgres() -> tuple[str | None, str]:
    """The first DSN that connects, or ``None`` and why none did."""
    failures = []
    for dsn in dict.fromkeys(pg_candidates()):
        try:
            conn = await asyncpg.connect(dsn, timeout=5)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            failures.append(f"{dsn}: {type(exc).__name__}: {exc}")
            continue
        await conn.close()
        return dsn, ""
    return None, "PostgreSQL is not reachable (" + "; ".join(failures) + ")"


async def drop_schema(dsn: str, schema: str) -> None:
    """Drop a schema the run created (replicas create it on start-up)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    finally:
        await conn.close()


def new_schema(prefix: str) -> str:
    """A fresh schema name (a plain identifier, as the store requires)."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def store_url(dsn: str, schema: str, *, pool_size: int = 4, lock_connections: int = 16) -> str:
    """``CONTEXT_PROXY_STORE_URL`` for ``schema``, with small pools: two replicas then need at most 40 of a
    default server's 100 connections, leaving room for other test runs. Turns beyond a replica's lock
    connections queue for one within the lock wait; alternating sessions keep about half of them on each."""
    separator = "&" if "?" in dsn else "?"
    return f"{dsn}{separator}schema={schema}&pool_size={pool_size}&lock_connections={lock_connections}"


# --- replicas -----------------------------------------------------------------------------------


@dataclass
class Replica:
    """One ``python -m proxy serve`` process and where it keeps its local files."""

    name: str
    url: str
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def trace_dir(self) -> Path:
        """The replica's own trace folder (traces are the only thing a replica keeps locally)."""
        return self.data_dir / "context-traces"

    def log_tail(self, lines: int = 30) -> str:
        """The end of the replica's log, for failure messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Terminate the process; kill it if it does not exit promptly."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def write_config(path: Path, provider_url: str, max_input_tokens: int = 128_000) -> Path:
    """A litellm-proxy style config routing ``MODEL`` to the scripted provider."""
    config = {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {"model": "openai/scripted", "api_base": f"{provider_url}/v1", "api_key": "sk-bench"},
                "model_info": {"max_input_tokens": max_input_tokens, "max_output_tokens": 4_000},
            }
        ]
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def start_replica(name: str, workdir: Path, config: Path, env: Mapping[str, str]) -> Replica:
    """Start one proxy process on a free port, with its own data dir (traces on) and ``env`` on top."""
    data_dir = workdir / name
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # The caller's own proxy settings (a master key, a trace dir, a mode) must not leak into the run.
    child_env = {key: value for key, value in os.environ.items() if not key.startswith(_PROXY_ENV_PREFIXES)}
    child_env.update(
        {"SCIENCE_AGENT_DATA_DIR": str(data_dir), "SCIENCE_AGENT_CONTEXT_TRACE": "1", "PYTHONUNBUFFERED": "1"}
    )
    child_env.update(env)
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port)],
            env=child_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    return Replica(name, f"http://127.0.0.1:{port}", data_dir, log_path, process)


async def wait_ready(replicas: Sequence[Replica], timeout: float = 90.0) -> None:
    """Wait until every replica answers ``/health/readiness`` with 200; raise with its log if one dies."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2.0) as http:
        for replica in replicas:
            while True:
                if replica.process.poll() is not None:
                    raise RuntimeError(
                        f"{replica.name} exited with {replica.process.returncode}:\n{replica.log_tail()}"
                    )
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get(f"{replica.url}/health/readiness")).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{replica.name} not ready after {timeout:.0f}s:\n{replica.log_tail()}")
                await asyncio.sleep(0.1)


# --- the load -----------------------------------------------------------------------------------


class TurnFailed(Exception):
    """A turn got something other than HTTP 200."""


@dataclass
class SessionRun:
    """What one client sent and saw."""

    session_id: str
    sent: list[dict[str, Any]] = field(default_factory=list)  # the messages of the last request
    served_by: list[int] = field(default_factory=list)  # replica index of each turn, in order
    answer: str | None = None


def session_id(prefix: str, index: int) -> str:
    """The ``x-session-id`` of session ``index`` (also its context id: it is folder-safe)."""
    return f"{prefix}-{index:03d}"


AfterTurn = Callable[[SessionRun, int], Awaitable[None]]


async def drive_session(
    clients: Sequence[httpx.AsyncClient], sid: str, turns: int, offset: int, after_turn: AfterTurn | None = None
) -> SessionRun:
    """One agent: up to ``turns`` requests, each resending the whole history plus the new tool result.

    Turn ``k`` goes to ``clients[(offset + k) % len(clients)]``, so with two replicas consecutive turns
    of the session always land on different processes. ``after_turn(run, turn)`` (1-based) runs after
    each answer, before the next request: a test's hook into the gap between two replicas' turns.
    """
    run = SessionRun(sid)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a lab agent. Use lookup until you have every measurement."},
        {"role": "user", "content": TASK_PREFIX + sid},
    ]
    for turn in range(turns):
        index = (offset + turn) % len(clients)
        body = {"model": MODEL, "messages": messages, "tools": TOOLS}
        response = await clients[index].post("/v1/chat/completions", json=body, headers={"x-session-id": sid})
        if response.status_code != 200:
            raise TurnFailed(f"{sid} turn {turn + 1} on replica {index}: HTTP {response.status_code} {response.text}")
        run.sent = messages
        run.served_by.append(index)
        if after_turn is not None:
            await after_turn(run, turn + 1)
        message = response.json()["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        if not calls:
            run.answer = message.get("content")
            return run
        # What agent frameworks send back: content null beside the calls, then one result per call.
        messages = [
            *messages,
            {"role": "assistant", "content": None, "tool_calls": calls},
            *(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": tool_result(sid, json.loads(call["function"]["arguments"])["step"]),
                }
                for call in calls
            ),
        ]
    return run


async def drive(
    urls: Sequence[str], prefix: str, sessions: int, turns: int, after_turn: AfterTurn | None = None
) -> tuple[list[SessionRun], float]:
    """Run every session concurrently against ``urls``; the runs and the wall time in seconds."""
    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits))
            for url in urls
        ]
        started = time.perf_counter()
        runs = await asyncio.gather(
            *(drive_session(clients, session_id(prefix, i), turns, i, after_turn) for i in range(sessions))
        )
        return list(runs), time.perf_counter() - started


@contextlib.contextmanager
def running_replicas(count: int, workdir: Path, config: Path, env: Mapping[str, str]) -> Iterator[list[Replica]]:
    """Start ``count`` replicas; they are stopped however the block ends."""
    replicas: list[Replica] = []
    try:
        for number in range(count):
            replicas.append(start_replica(f"replica-{'ab'[number] if number < 2 else number}", workdir, config, env))
        yield replicas
    finally:
        for replica in replicas:
            replica.stop()


# --- the benchmark ------------------------------------------------------------------------------


async def measure(dsn: str, replicas: int, sessions: int, turns: int, runs: int, provider_url: str) -> list[float]:
    """Turns per second of ``runs`` runs through ``replicas`` processes on a fresh schema."""
    schema = new_schema("bench_replicas")
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
        workdir = Path(tmp)
        config = write_config(workdir / "config.yaml", provider_url)
        env = {"CONTEXT_PROXY_STORE_URL": store_url(dsn, schema)}
        try:
            with running_replicas(replicas, workdir, config, env) as started:
                await wait_ready(started)
                # One untimed warm-up session per replica: first-call imports and connections.
                await drive([r.url for r in started], "warmup", len(started), 2)
                rates = []
                for number in range(runs):
                    finished, seconds = await drive([r.url for r in started], f"run{number}", sessions, turns)
                    total = sum(len(run.served_by) for run in finished)
                    rates.append(total / seconds)
                return rates
        finally:
            await drop_schema(dsn, schema)


async def main(argv: list[str] | None = None) -> int:
    """Measure one and two replicas and print the Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    dsn, why = await find_postgres()
    if dsn is None:
        print(f"bench/replicas.py: {why}; set CONTEXT_PROXY_TEST_PG", file=sys.stderr)
        return 2
    load_before = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    provider = ScriptedProvider(tool_loop_script(args.turns))
    with serve_in_thread(provider.app()) as provider_url:
        one = await measure(dsn, 1, args.sessions, args.turns, args.runs, provider_url)
        two = await measure(dsn, 2, args.sessions, args.turns, args.runs, provider_url)
    median_one, median_two = statistics.median(one), statistics.median(two)
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"{args.sessions} sessions x {args.turns} turns, median of {args.runs} runs, {os.cpu_count()} CPUs")
    # Client, provider and replicas share this host: a busy host moves both rows, and not equally.
    print(f"load average before: {load_before}; after: {load}\n")
    print("| replicas | turns/s (median) | runs |")
    print("|---:|---:|:---|")
    print(f"| 1 | {median_one:.1f} | {', '.join(f'{r:.1f}' for r in one)} |")
    print(f"| 2 | {median_two:.1f} | {', '.join(f'{r:.1f}' for r in two)} |")
    print(f"\nratio 2/1: {median_two / median_one:.2f}")
    return 0


if __name__ == "__main__":
    from proxy.process.offline import prepare_offline_environment

    prepare_offline_environment()
    sys.exit(asyncio.run(main()))
