"""``python -m proxy serve`` as operators start it (real processes): one process per SQLite data folder,
no unauthenticated serving beyond loopback unless the operator says so, and resident memory that levels
off under many large, distinct tool outputs instead of growing with the request count."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from proxy.provider.scripted import free_port

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Serving:
    """A running ``serve`` process, its port and its combined output so far."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _env(data_dir: Path, extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCIENCE_AGENT_", "CONTEXT_PROXY_"))}
    return env | {"SCIENCE_AGENT_DATA_DIR": str(data_dir), "LITELLM_LOCAL_MODEL_COST_MAP": "True", **extra}


def _command(port: int, host: str, *flags: str) -> list[str]:
    return [sys.executable, "-m", "proxy", "serve", "--host", host, "--port", str(port), *flags]


@contextmanager
def serving(tmp_path: Path, data_dir: Path, host: str = "127.0.0.1", *flags: str, **env: str) -> Iterator[Serving]:
    """Start ``serve`` and wait until it answers on 127.0.0.1; stop it afterwards."""
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(
            _command(port, host, *flags), env=_env(data_dir, env), cwd=REPO, stdout=handle, stderr=subprocess.STDOUT
        )
    running = Serving(process, port, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"serve exited with {process.returncode}:\n{running.output()}"
            assert time.monotonic() < deadline, f"serve did not come up:\n{running.output()}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health/liveliness", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def refused(tmp_path: Path, data_dir: Path, host: str, *flags: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``serve`` expecting it to stop before serving."""
    return subprocess.run(
        _command(free_port(), host, *flags),
        env=_env(data_dir, env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_process_on_one_sqlite_data_folder_refuses_to_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with serving(tmp_path, data_dir) as first:
        second = refused(tmp_path, data_dir, "127.0.0.1")
        assert first.process.poll() is None  # the first one is unaffected
        assert "without CONTEXT_PROXY_MASTER_KEY" in first.output()  # loopback without a key: a warning

    assert second.returncode == 2, second.stderr
    assert f"in use by another process (pid {first.process.pid})" in second.stderr
    assert "CONTEXT_PROXY_STORE_URL" in second.stderr and "Traceback" not in second.stderr


def test_a_killed_process_leaves_the_data_folder_free(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with serving(tmp_path, data_dir) as crashed:
        crashed.process.kill()  # no clean shutdown: the kernel drops the lock with the process
        crashed.process.wait()
        with serving(tmp_path, data_dir) as restarted:
            assert httpx.get(f"http://127.0.0.1:{restarted.port}/health/readiness").status_code == 200


@pytest.mark.parametrize("host", ["0.0.0.0", "proxy.internal"])  # every kind of address: tests/process/test_exposure.py
def test_serving_beyond_loopback_without_a_master_key_is_refused(tmp_path: Path, host: str) -> None:
    result = refused(tmp_path, tmp_path / "data", host)

    assert result.returncode == 2, result.stderr
    for hint in ("not a loopback address", "CONTEXT_PROXY_MASTER_KEY", "--allow-unauthenticated"):
        assert hint in result.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was created


@pytest.mark.parametrize(
    ("flags", "env"),
    [(("--allow-unauthenticated",), {}), ((), {"CONTEXT_PROXY_ALLOW_UNAUTHENTICATED": "1"})],
    ids=["flag", "env"],
)
def test_the_operator_can_allow_unauthenticated_serving_on_every_address(
    tmp_path: Path, flags: tuple[str, ...], env: dict[str, str]
) -> None:
    with serving(tmp_path, tmp_path / "data", "0.0.0.0", *flags, **env) as server:
        answer = httpx.get(f"http://127.0.0.1:{server.port}/health/liveliness")
        assert answer.status_code == 200 and answer.json() == {"status": "alive"}
        assert "WITHOUT authentication" in server.output()


@pytest.mark.parametrize(
    ("flags", "env"),
    [(("--log-level", "warning"), {}), ((), {"CONTEXT_PROXY_LOG_LEVEL": "WARNING"})],
    ids=["flag", "env"],
)
def test_a_log_level_above_info_drops_the_line_per_request_and_keeps_warnings(
    tmp_path: Path, flags: tuple[str, ...], env: dict[str, str]
) -> None:
    with serving(tmp_path, tmp_path / "default") as default:
        httpx.get(f"http://127.0.0.1:{default.port}/health/readiness").raise_for_status()
    with serving(tmp_path, tmp_path / "quiet", "127.0.0.1", *flags, **env) as quiet:
        httpx.get(f"http://127.0.0.1:{quiet.port}/health/readiness").raise_for_status()

    assert '"GET /health/readiness HTTP/1.1" 200' in default.output()  # uvicorn's access log, on by default
    assert "GET /health/readiness" not in quiet.output()
    assert "without CONTEXT_PROXY_MASTER_KEY" in quiet.output()  # the operator still hears warnings


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _tool_output(session: int, step: int, size: int) -> str:
    # Distinct bytes for every (session, step), as letters-only lines: cheap for the token estimator, so
    # the test spends its time on memory, not on estimation.
    raw = hashlib.shake_256(f"{session}/{step}".encode()).hexdigest(size // 2)
    letters = raw.translate(str.maketrans("0123456789", "ghijklmnop"))
    return "\n".join(letters[i : i + 76] for i in range(0, len(letters), 76))


def _history(session: int, turns: int, size: int) -> list[dict[str, object]]:
    messages: list[dict[str, object]] = [{"role": "user", "content": f"Analyse the blobs of sample {session}."}]
    for step in range(turns):
        call = {"id": f"call_{session}_{step}", "type": "function", "function": {"name": "fetch", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": _tool_output(session, step, size)})
    return messages


def test_resident_memory_levels_off_under_many_large_distinct_tool_outputs(tmp_path: Path, provider) -> None:
    # 240 requests over 40 sessions, each turn adding a distinct 200 KB tool output and resending the whole
    # history (about 50 MB of distinct outputs, 170 MB of requests). A cache keyed by message text, or a
    # memo holding the last requests, keeps most of that alive: RSS then grew by ~0.6 MiB per request
    # (~110 MiB over the measured 180). Bounded by bytes, the process levels off after the warm-up.
    sessions, requests, warm_up, size = 40, 240, 60, 200_000
    bound_mib = 48
    entry = {
        "model_name": "test-model",
        "litellm_params": {"model": "openai/scripted", "api_base": f"{provider.url}/v1", "api_key": "sk-test"},
        "model_info": {"max_input_tokens": 2_000_000, "max_output_tokens": 1_000},
    }
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"model_list": [entry]}))
    with serving(tmp_path, tmp_path / "data", "127.0.0.1", "--config", str(config)) as server:
        pid = server.process.pid
        rss: dict[int, float] = {}
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=60) as http:
            for number in range(requests):
                session, turns = number % sessions, number // sessions + 1
                body = {"model": "test-model", "messages": _history(session, turns, size)}
                answer = http.post("/v1/chat/completions", json=body, headers={"x-session-id": f"mem-{session}"})
                assert answer.status_code == 200, answer.text
                provider.history.clear()  # the provider runs in this process; only the server is measured
                if number + 1 in (warm_up, requests):
                    rss[number + 1] = _rss_mib(pid)
    growth = rss[requests] - rss[warm_up]
    assert growth < bound_mib, f"RSS grew {growth:.0f} MiB over {requests - warm_up} requests: {rss}"


def test_an_output_reserve_that_fills_a_routes_window_stops_start_up(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    entry = {
        "model_name": "lab-small",
        "litellm_params": {"model": "openai/lab-small", "api_base": "http://127.0.0.1:9/v1"},
        "model_info": {"max_input_tokens": 6_000},
    }
    config.write_text(yaml.safe_dump({"model_list": [entry]}))

    result = refused(tmp_path, tmp_path / "data", "127.0.0.1", "--config", str(config), OUTPUT_RESERVE_TOKENS="6500")

    assert result.returncode == 2, result.stderr
    assert "OUTPUT_RESERVE_TOKENS=6500" in result.stderr and "6000 tokens" in result.stderr
    assert "'lab-small'" in result.stderr and "Traceback" not in result.stderr
