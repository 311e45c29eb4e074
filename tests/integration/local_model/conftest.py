"""The real-model tier: llama-cpp-python's server with SmolLM2-135M on loopback, the proxy in front of it.

One server per test session (``n_ctx`` 1,024, one thread; up in a few seconds, stopped at the end), reached
by the proxy through litellm's ``openai/`` route with an ``api_base``, as a local-model user configures it
(``proxy/demo/local_run.py: local_route``). The tests assert what the proxy does, never the model's words,
which vary by build and CPU. Prompts are sized for a shared two-core machine: measured here about 13 prompt
tokens/s under load (the server reuses the common prefix of consecutive prompts, so an appended turn costs
only its new tokens) and a few answer tokens/s, so every call asks for a handful of answer tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.demo.local_run import N_CTX
from proxy.provider.local_model import LocalModel, serve_local_model
from proxy.runtime.calibration import prompt_text


@pytest.fixture(scope="session")
def local_model() -> Iterator[LocalModel]:
    with serve_local_model(N_CTX) as model:
        yield model


def traces(data_dir: Path) -> dict[str, dict[str, Any]]:
    """Every trace the proxy wrote, by file name (``turn-0003.json``, ``turn-0003-recovery-1.json``)."""
    return {path.name: json.loads(path.read_text()) for path in (data_dir / "context-traces").glob("*/turn-*.json")}


def server_tokens(model: LocalModel, messages: list[dict[str, Any]]) -> int:
    """The server's own count of the messages' text (its tokenizer endpoint)."""
    response = httpx.post(f"{model.root}/extras/tokenize", json={"input": prompt_text({"messages": messages})})
    response.raise_for_status()
    return len(response.json()["tokens"])


def sent_directly(model: LocalModel, messages: list[dict[str, Any]]) -> httpx.Response:
    """The server's answer to ``messages`` sent to it without the proxy (null contents as ``""``, which it
    needs): what the client's history alone would get."""
    body = {
        "model": model.model,
        "messages": [{**m, "content": ""} if m.get("content") is None else m for m in messages],
        "max_tokens": 8,
    }
    return httpx.post(f"{model.base_url}/chat/completions", json=body, timeout=600)
