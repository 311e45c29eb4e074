"""Every ingress decodes a large body off the event loop (issue 18, point 2).

A body above ``OFFLOAD_BYTES`` is decoded on the reader's worker thread, whichever API it came in
through, so a megabyte history sent to ``/v1/messages`` or ``/v1/responses`` stalls no other session.
The real ``decode_body`` runs; a wrapper around it notes on which thread, and whether an event loop was
running there, before handing the body back unchanged.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import pytest

from proxy.edge import request_reader, resent_requests
from proxy.edge.request_reader import OFFLOAD_BYTES
from proxy.provider.scripted import Reply

FILLER = "The readings agree within 0.2 %. " * 40  # about 1.3 kB a message


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str, bool]]:
    """(body size, thread name, whether that thread was running an event loop) per decode."""
    seen: list[tuple[int, str, bool]] = []
    real = request_reader.decode_body

    def noting(raw: bytes) -> dict[str, Any]:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        seen.append((len(raw), threading.current_thread().name, on_loop))
        return real(raw)

    monkeypatch.setattr(request_reader, "decode_body", noting)
    monkeypatch.setattr(resent_requests, "decode_body", noting)  # the chat route decodes through its memo
    return seen


def _turns(count: int) -> list[dict[str, str]]:
    turns = [{"role": "user" if n % 2 == 0 else "assistant", "content": f"{n}: {FILLER}"} for n in range(count)]
    return [*turns, {"role": "user", "content": "Go on."}]


@pytest.mark.parametrize("route", ["/v1/messages", "/v1/responses", "/v1/chat/completions"])
def test_a_large_body_is_decoded_off_the_event_loop_and_a_small_one_on_it(start_proxy, provider, decodes, route):
    provider.script(lambda body: Reply(content="ok"))
    proxy = start_proxy()
    large = _turns(400)  # about 530 kB
    small = _turns(0)
    if route == "/v1/responses":
        bodies = [{"model": "test-model", "input": turns} for turns in (large, small)]
    else:
        bodies = [{"model": "test-model", "max_tokens": 64, "messages": turns} for turns in (large, small)]
    raws = [json.dumps(body).encode() for body in bodies]
    with httpx.Client(base_url=proxy.url, timeout=60) as http:
        for index, raw in enumerate(raws):
            headers = {"x-session-id": f"offload-{index}", "content-type": "application/json"}
            response = http.post(route, content=raw, headers=headers)
            assert response.status_code == 200, response.text
    # The large body is the largest decode; the memo of resent requests (chat's and Messages') also decodes
    # parts of it, on the same thread or once its answer is sent on a worker thread: never on the loop.
    large_size, large_thread, large_on_loop = max(decodes)
    assert large_size == len(raws[0]) > OFFLOAD_BYTES > len(raws[1])
    assert not large_on_loop and large_thread.startswith("request-parse")
    assert not any(on_loop for size, _, on_loop in decodes if size > OFFLOAD_BYTES)
    assert (len(raws[1]), True) in [(size, on_loop) for size, _, on_loop in decodes]  # the small one, on it
