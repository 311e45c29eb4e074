"""The servers under test, each in its own process: the scripted provider, our proxy, the litellm proxy.

Separate processes keep the load generator off the servers' GIL, as in production where the client,
the gateway and the provider never share an interpreter. Every process gets a log file in the run's
scratch folder, so a failed start-up can be reported with its own words.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from proxy.provider.scripted import free_port

REPO = Path(__file__).resolve().parent.parent
LITELLM_VENV = REPO / "bench" / ".venv-litellm-proxy"
MODEL = "bench-model"
# Both proxies get a master key: the litellm proxy refuses to start without one, and checking a key is
# part of what a real deployment pays per request.
MASTER_KEY = "sk-bench-" + secrets.token_hex(24)


class ServerFailed(RuntimeError):
    """A server did not come up; the message carries the tail of its log."""


@dataclass
class Server:
    """A running server process and how to reach it."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        """The server's process id (the profiler attaches to it)."""
        return self.process.pid


def model_list(provider_url: str, max_input_tokens: int | None = None) -> dict[str, object]:
    """The litellm-proxy style config both proxies read: one model pointing at the scripted provider."""
    entry: dict[str, object] = {
        "model_name": MODEL,
        "litellm_params": {"model": "openai/scripted", "api_base": f"{provider_url}/v1", "api_key": "sk-provider"},
    }
    if max_input_tokens is not None:
        entry["model_info"] = {"max_input_tokens": max_input_tokens, "max_output_tokens": 4096}
    return {"model_list": [entry]}


def write_config(folder: Path, provider_url: str, max_input_tokens: int | None = None) -> Path:
    """Write the shared config file and return its path."""
    path = folder / "model_list.yaml"
    path.write_text(yaml.safe_dump(model_list(provider_url, max_input_tokens)), encoding="utf-8")
    return path


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_ready(name: str, url: str, process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerFailed(f"{name} exited with code {process.returncode} during start-up:\n{_tail(log)}")
        try:
            if httpx.get(f"{url}/health/liveliness", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise ServerFailed(f"{name} did not answer /health/liveliness within {timeout:.0f} s:\n{_tail(log)}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)  # its own process group: uvicorn workers go too
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@contextmanager
def _serve(
    name: str, command: list[str], env: Mapping[str, str], port: int, scratch: Path, timeout: float = 60.0
) -> Iterator[Server]:
    log = scratch / f"{name}.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(
            command, env=dict(env), cwd=scratch, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(name, url, process, log, timeout)
        yield Server(name, url, process, log)
    finally:
        _stop(process)


def _base_env(our_code: bool = True) -> dict[str, str]:
    """The parent's environment minus our settings, offline; ``our_code`` puts the repo on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCIENCE_AGENT_", "CONTEXT_PROXY_", "LITELLM_"))}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env.pop("PYTHONPATH", None)
    if our_code:
        env["PYTHONPATH"] = str(REPO)
    return env


@contextmanager
def scripted_provider(
    scratch: Path, script: str = "ok", context_window: int | None = None, keep_history: bool = False
) -> Iterator[Server]:
    """The scripted provider (``bench.scripted_server``) in its own process."""
    port = free_port()
    command = [sys.executable, "-m", "bench.scripted_server", "--port", str(port), "--script", script]
    if context_window is not None:
        command += ["--context-window", str(context_window)]
    if keep_history:
        command.append("--keep-history")
    with _serve(f"provider-{script}", command, _base_env(), port, scratch) as server:
        yield server


@contextmanager
def our_proxy(
    scratch: Path,
    config: Path,
    mode: str,
    extra_env: Mapping[str, str] | None = None,
    name: str | None = None,
    launcher: Sequence[str] | None = None,
) -> Iterator[Server]:
    """``python -m proxy serve`` in ``mode`` with its own data dir, exactly as operators start it; ``launcher``:
    what runs the CLI instead of ``python -m proxy`` (``scripts/turn_stages.py`` times its stages)."""
    port = free_port()
    label = name or f"proxy-{mode}"
    data_dir = scratch / f"data-{label}"
    env = _base_env() | {
        "SCIENCE_AGENT_CONTEXT_MODE": mode,
        "SCIENCE_AGENT_DATA_DIR": str(data_dir),
        "CONTEXT_PROXY_MASTER_KEY": MASTER_KEY,
        **(extra_env or {}),
    }
    # Errors only, as the litellm proxy runs here (LITELLM_LOG=ERROR): neither writes a line per request.
    command = [*(launcher or (sys.executable, "-m", "proxy")), "serve", "--config", str(config), "--port", str(port)]
    command += ["--log-level", "error"]
    with _serve(label, command, env, port, scratch) as server:
        yield server


def ensure_litellm_proxy_venv(log: Path) -> Path:
    """The ``litellm`` executable of a separate venv with ``litellm[proxy]``, created on first use.

    A separate venv keeps the proxy's many extras out of ours. pip may resolve an older litellm than
    ours when the newest one pins a ``litellm-proxy`` release the index lacks; the report names both.
    """
    executable = LITELLM_VENV / "bin" / "litellm"
    if executable.exists():
        return executable
    with log.open("ab") as handle:
        subprocess.run(["python3", "-m", "venv", str(LITELLM_VENV)], check=True, stdout=handle, stderr=handle)
        subprocess.run(
            [str(LITELLM_VENV / "bin" / "pip"), "install", "-q", "litellm[proxy]"],
            check=True,
            stdout=handle,
            stderr=handle,
        )
    if not executable.exists():
        raise ServerFailed(f"pip installed litellm[proxy] but {executable} is missing:\n{_tail(log)}")
    return executable


def litellm_proxy_version() -> str | None:
    """The litellm version installed in the separate venv, if any."""
    for meta in (LITELLM_VENV / "lib").glob("python*/site-packages/litellm-*.dist-info"):
        return meta.name.removeprefix("litellm-").removesuffix(".dist-info")
    return None


def write_bridged_config(folder: Path, provider_url: str, max_input_tokens: int | None = None) -> Path:
    """The litellm proxy's config for the Messages and Responses APIs in front of a chat-only provider: the
    same route with ``use_chat_completions_api`` (its Responses endpoint would otherwise call the
    provider's ``/v1/responses``). Our proxy's config refuses that key, hence a file of its own."""
    config = model_list(provider_url, max_input_tokens)
    for entry in config["model_list"]:  # type: ignore[attr-defined]
        entry["litellm_params"]["use_chat_completions_api"] = True
    path = folder / "model_list_bridged.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


# The litellm proxy's Messages endpoint calls a non-Anthropic provider through its chat bridge only with this.
LITELLM_BRIDGE_ENV = {"LITELLM_USE_CHAT_COMPLETIONS_URL_FOR_ANTHROPIC_MESSAGES": "True"}


@contextmanager
def litellm_proxy(
    scratch: Path, config: Path, extra_env: Mapping[str, str] | None = None, name: str = "litellm-proxy"
) -> Iterator[Server]:
    """The real litellm proxy (one worker, no database) on the same ``model_list``."""
    executable = ensure_litellm_proxy_venv(scratch / "litellm-proxy-install.log")
    port = free_port()
    env = _base_env(our_code=False) | {"LITELLM_MASTER_KEY": MASTER_KEY, "LITELLM_LOG": "ERROR", **(extra_env or {})}
    command = [str(executable), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--num_workers", "1"]
    with _serve(name, command, env, port, scratch, timeout=120.0) as server:
        yield server
