"""Part 5: one session's very large request must not stall the others.

A request of ``messages`` messages (20,000 by default) is sent to a fresh session; while the proxy
serves it, small requests of another session are sent one after another. Reported: the large
request's time, the small requests' latencies during it, and the same small request's latency on
an idle proxy, so "answered in well under the large request's time" is a number.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx

from bench.measure import median
from bench.servers import MASTER_KEY, MODEL


def large_history(messages: int) -> list[dict[str, Any]]:
    """An agent transcript of exactly ``messages`` messages: a task, then tool steps and short answers."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Task: reconcile the instrument logs."}]
    step = 0
    while len(history) < messages - 1:
        if len(history) + 3 <= messages - 1:
            call = f"call_{step}"
            arguments = json.dumps({"file": f"log_{step:05d}.csv"})
            function = {"name": "read_file", "arguments": arguments}
            history.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": call, "type": "function", "function": function}],
                }
            )
            history.append(
                {"role": "tool", "tool_call_id": call, "content": f"rows {step}: " + "0.125, 3.5, 17; " * 12}
            )
        history.append({"role": "assistant", "content": f"Step {step}: the readings agree within 0.2 %."})
        step += 1
    history.append({"role": "user", "content": "Continue."})
    return history[:messages]


def _post(client: httpx.Client, url: str, payload: bytes, session: str) -> float:
    headers = {"authorization": f"Bearer {MASTER_KEY}", "content-type": "application/json", "x-session-id": session}
    started = time.perf_counter()
    response = client.post(f"{url}/v1/chat/completions", content=payload, headers=headers)
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"{response.status_code}: {response.text[:300]}")
    return elapsed * 1000


def run_isolation(proxy_url: str, *, messages: int = 20_000, idle_samples: int = 5) -> dict[str, Any]:
    """The small request's latency while a ``messages``-message request is served, against idle."""
    run_id = time.time_ns()
    large = json.dumps({"model": MODEL, "messages": large_history(messages), "max_tokens": 64}).encode()
    small = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 8}).encode()
    with httpx.Client(timeout=600.0) as client:
        idle = [_post(client, proxy_url, small, f"iso-idle-{run_id}-{i}") for i in range(idle_samples)]
    done = threading.Event()
    result: dict[str, Any] = {}

    def send_large() -> None:
        try:
            with httpx.Client(timeout=600.0) as client:
                result["large_ms"] = _post(client, proxy_url, large, f"iso-large-{run_id}")
        finally:
            done.set()

    sender = threading.Thread(target=send_large, name="isolation-large")
    started = time.perf_counter()
    sender.start()
    during: list[float] = []
    with httpx.Client(timeout=600.0) as client:
        time.sleep(0.2)  # the large body is on its way
        number = 0
        while not done.is_set():
            latency = _post(client, proxy_url, small, f"iso-small-{run_id}-{number}")
            if not done.is_set():  # only what was answered while the large request was still open
                during.append(latency)
            number += 1
    sender.join()
    if "large_ms" not in result:
        raise RuntimeError("the large request failed")
    return {
        "messages": messages,
        "request_bytes": len(large),
        "large_ms": round(result["large_ms"], 1),
        "wall_ms": round((time.perf_counter() - started) * 1000, 1),
        "small_idle_ms": round(median(idle), 1),
        "small_during_count": len(during),
        "small_during_median_ms": round(median(during), 1) if during else None,
        "small_during_max_ms": round(max(during), 1) if during else None,
    }
