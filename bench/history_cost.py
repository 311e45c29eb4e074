"""Part 2: the time our proxy adds per turn as the history grows, cold and warm store.

*cold*: the first request of a new session, carrying the whole history (``history[:-1]``).
*warm*: the same session's next request, one message longer (``history``): what a running agent sends.
Added time is the proxy's latency minus the provider's for the same bytes sent directly, both
measured in the same repeat. The in-process stage breakdown comes from ``bench/assembly.py``.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Sequence
from typing import Any

import httpx

from bench.assembly import TOOLS, assemble, collection, make_history, median_ms
from bench.measure import check, median
from bench.servers import MASTER_KEY, MODEL
from proxy.context import CachingEstimator, ConservativeTokenEstimator

WARM_GOAL_MS_AT_1000 = 20.0


def _post_ms(client: httpx.Client, url: str, payload: bytes, session: str) -> float:
    headers = {"authorization": f"Bearer {MASTER_KEY}", "content-type": "application/json", "x-session-id": session}
    started = time.perf_counter()
    check(client.post(f"{url}/v1/chat/completions", content=payload, headers=headers))
    return (time.perf_counter() - started) * 1000


def _payload(messages: list[dict[str, Any]]) -> bytes:
    # Serialized once, outside the clock: the client's JSON encoding is not the proxy's cost.
    return json.dumps({"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 64}).encode()


def run_history_cost(proxy_url: str, direct_url: str, *, sizes: Sequence[int], repeats: int) -> dict[str, Any]:
    """Added cold/warm milliseconds per history size over HTTP, plus the in-process stage timings."""
    rows = []
    run_id = time.time_ns()
    with httpx.Client(timeout=120.0) as client:
        _post_ms(client, proxy_url, _payload(make_history(10)), f"hist-warmup-{run_id}")
        for n in sizes:
            history = make_history(n)
            previous, current = _payload(history[:-1]), _payload(history)
            cold, warm, direct_prev, direct_cur = [], [], [], []
            for repeat in range(repeats):
                session = f"hist-{run_id}-{n}-{repeat}"
                d_prev = _post_ms(client, direct_url, previous, session)
                p_cold = _post_ms(client, proxy_url, previous, session)
                d_cur = _post_ms(client, direct_url, current, session)
                p_warm = _post_ms(client, proxy_url, current, session)
                cold.append(p_cold - d_prev)
                warm.append(p_warm - d_cur)
                direct_prev.append(d_prev)
                direct_cur.append(d_cur)
            rows.append(
                {
                    "messages": n,
                    "request_bytes": len(current),
                    "direct_ms": median(direct_cur),
                    "added_cold_ms": median(cold),
                    "added_warm_ms": median(warm),
                    "added_warm_us_per_message": median([w * 1000 / n for w in warm]),
                }
            )
    return {"repeats": repeats, "rows": rows, "scaling": _scaling(rows), "stages": _stages(sizes, repeats)}


def _scaling(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Growth exponent between consecutive sizes: 1.0 is linear, below is better, above is worse."""
    out = []
    for a, b in itertools.pairwise(rows):
        entry: dict[str, Any] = {"from": a["messages"], "to": b["messages"]}
        for key in ("added_cold_ms", "added_warm_ms"):
            if a[key] > 0 and b[key] > 0:
                entry[key.replace("added_", "exponent_").replace("_ms", "")] = round(
                    math.log(b[key] / a[key]) / math.log(b["messages"] / a["messages"]), 2
                )
        out.append(entry)
    return out


def _stages(sizes: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    """The pure assembly stages in-process (``bench/assembly.py``): what the pipeline itself costs."""
    collected = collection()
    rows = []
    for n in sizes:
        history = make_history(n)
        cold = median_ms(
            lambda h=history: assemble(h, collected, CachingEstimator(ConservativeTokenEstimator())), repeats
        )
        warmed = []
        for _ in range(repeats):
            estimator = CachingEstimator(ConservativeTokenEstimator())
            assemble(history[:-1], collected, estimator)
            warmed.append(estimator)
        pool = iter(warmed)
        warm = median_ms(lambda h=history, p=pool: assemble(h, collected, next(p)), repeats)
        rows.append({"messages": n, "cold_ms": round(cold, 3), "warm_ms": round(warm, 3)})
    return rows
