"""Timing helpers shared by the parts: percentiles, medians over repeats, sequential and concurrent load."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx


class RequestFailed(RuntimeError):
    """A benchmark request got a non-200 answer; the bench stops rather than time error pages."""


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The ``fraction`` percentile (nearest rank), e.g. 0.95 for p95."""
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def median(values: Sequence[float]) -> float:
    """The median, rounded for the report."""
    return round(statistics.median(values), 3)


def check(response: httpx.Response) -> httpx.Response:
    """The response, if it is a success."""
    if response.status_code != 200:
        raise RequestFailed(f"{response.request.url} answered {response.status_code}: {response.text[:500]}")
    return response


def sequential_ms(
    client: httpx.Client, url: str, bodies: Sequence[dict[str, Any]], headers: Callable[[int], dict[str, str]]
) -> list[float]:
    """Send ``bodies`` one after the other; the latency of each in milliseconds."""
    samples = []
    for index, body in enumerate(bodies):
        started = time.perf_counter()
        check(client.post(url, json=body, headers=headers(index)))
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def _throughput(
    url: str, body: dict[str, Any], total: int, concurrency: int, headers: Callable[[int], dict[str, str]]
) -> float:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60.0) as client:
        counter = iter(range(total))

        async def worker() -> None:
            for index in counter:  # the shared iterator hands each request out exactly once
                check(await client.post(url, json=body, headers=headers(index)))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return total / (time.perf_counter() - started)


def throughput_rps(
    url: str, body: dict[str, Any], total: int, concurrency: int, headers: Callable[[int], dict[str, str]]
) -> float:
    """Requests per second for ``total`` requests at ``concurrency`` (httpx.AsyncClient, keep-alive)."""
    return asyncio.run(_throughput(url, body, total, concurrency, headers))
