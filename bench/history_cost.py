"""Part 2: the time our proxy adds per turn as the history grows, cold and warm store, with tail latency.

*cold*: the first request of a new session, carrying the whole history (``history[:-1]``).
*warm*: a later request of the same session: ``history``, then, for the sessions that go on, the same
history plus the proxy's answer and one more user message per step (what a running agent sends). A
session carries at most ``n // 200`` warm steps, so a warm request is at most 1% longer than ``n``
messages; enough sessions are opened to reach ``warm_requests`` warm samples per size.
Added time is each proxy latency minus the median latency of the provider for the same bytes sent
directly (measured interleaved, in the same run). Percentiles (p50/p95/p99) are taken over those samples:
a collector pause or another stall shows in p99, not in the median. The in-process stage breakdown comes
from ``bench/assembly.py``.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Sequence
from typing import Any

import httpx

from bench import against
from bench.assembly import TOOLS, assemble, collection, make_history, median_ms
from bench.measure import check, median, percentile
from bench.servers import MASTER_KEY, MODEL
from proxy.context import CachingEstimator, ConservativeTokenEstimator

ANSWER = "ok"  # what the scripted provider answers: the warm steps resend it, as an agent would
MESSAGES_PER_WARM_STEP = 200  # one more warm step per session for each 200 messages of history


def _post_ms(client: httpx.Client, url: str, payload: bytes, session: str) -> float:
    headers = {"authorization": f"Bearer {MASTER_KEY}", "content-type": "application/json", "x-session-id": session}
    started = time.perf_counter()
    check(client.post(f"{url}/v1/chat/completions", content=payload, headers=headers))
    return (time.perf_counter() - started) * 1000


def _payload(messages: list[dict[str, Any]]) -> bytes:
    # Serialized once, outside the clock: the client's JSON encoding is not the proxy's cost.
    return json.dumps({"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 64}).encode()


def session_plan(n: int, warm_requests: int, min_sessions: int) -> tuple[int, int]:
    """(sessions, warm steps per session) for a history of ``n`` messages.

    Small histories get a new session per warm sample (a cold request is cheap there, and each warm
    request is then exactly ``n`` messages); large ones chain a few steps per session, because a cold
    request at 5,000 messages costs most of a second.
    """
    chain = max(1, n // MESSAGES_PER_WARM_STEP)
    sessions = max(min_sessions, math.ceil(warm_requests / chain))
    return sessions, math.ceil(warm_requests / sessions)


def warm_histories(history: list[dict[str, Any]], steps: int) -> list[list[dict[str, Any]]]:
    """The warm requests of one session: ``history``, then each step adds the answer and a user turn."""
    out = [history]
    for step in range(1, steps):
        out.append(out[-1] + [{"role": "assistant", "content": ANSWER}, {"role": "user", "content": f"Next {step}."}])
    return out


def _summary(added: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(added, 0.5), 3),
        "p95": round(percentile(added, 0.95), 3),
        "p99": round(percentile(added, 0.99), 3),
    }


def run_history_cost(
    proxy_url: str,
    direct_url: str,
    *,
    sizes: Sequence[int],
    repeats: int,
    warm_requests: int = 30,
    against_url: str | None = None,
) -> dict[str, Any]:
    """Added cold/warm milliseconds per history size over HTTP (p50/p95/p99), plus the in-process stages.

    ``repeats`` is the least number of cold samples (sessions) per size; ``warm_requests`` the least
    number of warm samples per size. ``against_url``: an earlier commit's proxy (``--against``), sent every
    request right after ours, and its figures set against ours per size.
    """
    rows = []
    run_id = time.time_ns()
    with httpx.Client(timeout=120.0) as client:
        _post_ms(client, proxy_url, _payload(make_history(10)), f"hist-warmup-{run_id}")
        for n in sizes:
            history = make_history(n)
            sessions, steps = session_plan(n, warm_requests, repeats)
            cold_payload = _payload(history[:-1])
            warm_payloads = [_payload(h) for h in warm_histories(history, steps)]
            cold_ms, warm_ms, direct_cold, direct_warm = [], [], [], []
            their_cold: list[float] = []
            their_warm: list[float] = []
            for index in range(sessions):
                session = f"hist-{run_id}-{n}-{index}"
                direct_cold.append(_post_ms(client, direct_url, cold_payload, session))
                cold_ms.append(_post_ms(client, proxy_url, cold_payload, session))
                if against_url is not None:
                    their_cold.append(_post_ms(client, against_url, cold_payload, session))
                for payload in warm_payloads:
                    direct_warm.append(_post_ms(client, direct_url, payload, session))
                    warm_ms.append(_post_ms(client, proxy_url, payload, session))
                    if against_url is not None:
                        their_warm.append(_post_ms(client, against_url, payload, session))
            base_cold, base_warm = median(direct_cold), median(direct_warm)
            cold = _summary([ms - base_cold for ms in cold_ms])
            warm = _summary([ms - base_warm for ms in warm_ms])
            compared: dict[str, Any] = {}
            if against_url is not None:
                their = {"cold": _summary([ms - base_cold for ms in their_cold])}
                their["warm"] = _summary([ms - base_warm for ms in their_warm])
                compared = {
                    "against": {
                        "added_cold_ms": their["cold"]["p50"],
                        "added_warm_ms": their["warm"]["p50"],
                        "added_warm_p99_ms": their["warm"]["p99"],
                        "cold_p50_ratio": against.ratio(cold["p50"], their["cold"]["p50"]),
                        "warm_p50_ratio": against.ratio(warm["p50"], their["warm"]["p50"]),
                        "warm_p99_ratio": against.ratio(warm["p99"], their["warm"]["p99"]),
                    }
                }
            rows.append(
                {
                    "messages": n,
                    "request_bytes": len(warm_payloads[0]),
                    "direct_ms": base_warm,
                    "direct_p99_ms": round(percentile(direct_warm, 0.99), 3),
                    "cold_requests": len(cold_ms),
                    "warm_requests": len(warm_ms),
                    "warm_messages_max": n + 2 * (steps - 1),
                    "added_cold_ms": cold["p50"],
                    "added_cold_p95_ms": cold["p95"],
                    "added_cold_p99_ms": cold["p99"],
                    "added_warm_ms": warm["p50"],
                    "added_warm_p95_ms": warm["p95"],
                    "added_warm_p99_ms": warm["p99"],
                    "added_warm_us_per_message": round(warm["p50"] * 1000 / n, 3),
                    **compared,
                }
            )
    return {
        "repeats": repeats,
        "warm_requests": warm_requests,
        "rows": rows,
        "scaling": _scaling(rows),
        "stages": _stages(sizes, repeats),
    }


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
