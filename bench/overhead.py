"""Part 1: what a small request costs through each path, against calling the provider directly.

Paths: ``direct`` (the scripted provider), ``legacy`` and ``dynamic`` (our proxy), ``litellm-proxy``, and
with ``--against REF`` ``dynamic-against``, that commit's proxy (``bench/against.py``).
Every repeat measures all paths back to back (in a rotated order, so no path always runs first), so
"added latency" and the ours/litellm ratios are taken within one repeat; the report shows medians of
those per-repeat figures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import httpx

from bench import against
from bench.measure import median, percentile, sequential_ms, throughput_rps
from bench.servers import MASTER_KEY, MODEL

CONCURRENCY = 16


def small_body() -> dict[str, Any]:
    """A typical short chat turn."""
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a terse lab assistant."},
            {"role": "user", "content": "Is the 298 K run finished? Answer ok or not yet."},
        ],
        "max_tokens": 16,
    }


def _headers(path: str, repeat: int, phase: str) -> Callable[[int], dict[str, str]]:
    # A new session per request: every request is a first turn, the store work our proxy always does.
    def make(index: int) -> dict[str, str]:
        return {"authorization": f"Bearer {MASTER_KEY}", "x-session-id": f"ovh-{path}-{phase}-{repeat}-{index}"}

    return make


def run_overhead(
    urls: Mapping[str, str], *, requests: int, throughput_requests: int, repeats: int, warmup: int = 30
) -> dict[str, Any]:
    """Measure every path in ``urls`` (which must include ``direct``); returns the report section."""
    paths = list(urls)
    body = small_body()
    per_repeat: list[dict[str, dict[str, float]]] = []
    with httpx.Client(timeout=60.0) as client:
        for path in paths:  # first requests pay imports, connection set-up and JIT-like caches
            sequential_ms(client, _endpoint(urls[path]), [body] * warmup, _headers(path, -1, "warm"))
        for repeat in range(repeats):
            order = paths[repeat % len(paths) :] + paths[: repeat % len(paths)]
            figures: dict[str, dict[str, float]] = {}
            for path in order:
                samples = sequential_ms(client, _endpoint(urls[path]), [body] * requests, _headers(path, repeat, "seq"))
                rps = throughput_rps(
                    _endpoint(urls[path]), body, throughput_requests, CONCURRENCY, _headers(path, repeat, "tput")
                )
                figures[path] = {"p50_ms": percentile(samples, 0.5), "p95_ms": percentile(samples, 0.95), "rps": rps}
            for path in paths:
                figures[path]["added_p50_ms"] = figures[path]["p50_ms"] - figures["direct"]["p50_ms"]
                figures[path]["added_p95_ms"] = figures[path]["p95_ms"] - figures["direct"]["p95_ms"]
            per_repeat.append(figures)
    result: dict[str, Any] = {
        "requests_per_repeat": requests,
        "throughput_requests": throughput_requests,
        "concurrency": CONCURRENCY,
        "repeats": repeats,
        "paths": {
            path: {key: median([r[path][key] for r in per_repeat]) for key in per_repeat[0][path]} for path in paths
        },
        "per_repeat": per_repeat,
    }
    if against.PATH_NAME in urls:
        # Ours against the earlier commit (``--against``): below 1.0 is faster, for throughput above 1.0.
        result["against"] = {
            "added_p50": median(
                [against.ratio(r["dynamic"]["added_p50_ms"], r[against.PATH_NAME]["added_p50_ms"]) for r in per_repeat]
            ),
            "added_p95": median(
                [against.ratio(r["dynamic"]["added_p95_ms"], r[against.PATH_NAME]["added_p95_ms"]) for r in per_repeat]
            ),
            "rps": median([against.ratio(r["dynamic"]["rps"], r[against.PATH_NAME]["rps"]) for r in per_repeat]),
        }
    if "litellm-proxy" in urls:
        ratios: dict[str, float] = {}
        for ours in ("legacy", "dynamic"):
            if ours not in urls:
                continue
            # Ratios per repeat, then the median: both sides of each ratio saw the same machine state.
            ratios[f"{ours}_added_p50_vs_litellm"] = median(
                [_ratio(r[ours]["added_p50_ms"], r["litellm-proxy"]["added_p50_ms"]) for r in per_repeat]
            )
            ratios[f"{ours}_added_p95_vs_litellm"] = median(
                [_ratio(r[ours]["added_p95_ms"], r["litellm-proxy"]["added_p95_ms"]) for r in per_repeat]
            )
            ratios[f"{ours}_rps_vs_litellm"] = median(
                [_ratio(r[ours]["rps"], r["litellm-proxy"]["rps"]) for r in per_repeat]
            )
        result["ratios"] = ratios
    return result


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


def _endpoint(base: str) -> str:
    return f"{base}/v1/chat/completions"
