"""The served app returns what a large request freed to the OS: its heap trimmer runs after one."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from proxy.app import create_app
from proxy.kernel.config import Settings
from proxy.process.heap_trim import LARGE_BODY_BYTES, HeapTrimmer
from proxy.provider.scripted import serve_in_thread


def test_a_large_request_body_is_followed_by_a_trim_and_small_ones_are_not(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path / "data"))
    trimmer: HeapTrimmer = app.state.heap_trimmer
    trimmer.interval = 0.05

    def refused(client: httpx.Client, text_bytes: int) -> None:
        # A message of an unknown role: refused with a 400 after the body was read and decoded.
        message = {"role": "nobody", "content": "x" * text_bytes}
        answer = client.post("/v1/chat/completions", json={"model": "m", "messages": [message]})
        assert answer.status_code == 400, answer.text

    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(5):
            refused(client, 10_000)
        time.sleep(0.3)
        assert trimmer.trims == 0
        refused(client, LARGE_BODY_BYTES)
        deadline = time.monotonic() + 5
        while trimmer.trims == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert trimmer.trims == 1
