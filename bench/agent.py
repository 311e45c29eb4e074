"""Part 8: what agents send, through our proxy and the litellm proxy, streamed and not, on all three APIs.

Cases: a shape (``agent``: a 20k-token system prompt, 24 tools, a 12-message history; ``tiny``: two
messages; ``answer``: two messages answered at length, 120 text chunks, streamed only: what relaying an
agent's answer costs), an API (chat, Messages, Responses) and streamed or not. Every request is a new session; the
agent's system prompt and tools are byte-identical across them, as when one agent runs many sessions.
``later``: the same session's next turn (the first turn sent untimed just before), ours only; beside it,
when part 8 serves one (``legacy`` in the urls), our proxy in legacy mode: every step of a turn but the
assembly, the bound a faster assembly alone can reach (``scripts/stack_floor.py`` has it too).

Each request is timed to its first token (the first text delta: a chat chunk's ``delta.content``, a
Messages ``content_block_delta``, a Responses ``response.output_text.delta``) and to its last byte.
The scripted provider speaks chat only, so the direct figure of every API is the chat request of the same
shape sent to it (both proxies translate Messages and Responses to that call); added = path - direct,
per repeat. Throughput: requests/s at concurrency 16, new sessions. Every repeat runs the paths of a case
back to back, in a rotated order; ratios ours/litellm are taken per repeat, then the median.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import orjson

from bench.agent_shapes import APIS, agent_body, answer_body, endpoint, tiny_body
from bench.measure import RequestFailed, median, percentile
from bench.servers import MASTER_KEY

CONCURRENCY = 16
SHAPES = ("tiny", "agent", "answer")
STREAMED_ONLY = frozenset({"answer"})  # a long answer costs a proxy to relay only as a stream
PROXIES = ("dynamic", "litellm-proxy")


def case_name(shape: str, api: str, stream: bool) -> str:
    """``agent/messages/stream``, say."""
    return f"{shape}/{api}/{'stream' if stream else 'json'}"


def _headers(api: str, session: str) -> dict[str, str]:
    headers = {"authorization": f"Bearer {MASTER_KEY}", "x-session-id": session}
    if api == "messages":
        headers["anthropic-version"] = "2023-06-01"
    return headers


def _is_token(api: str, line: bytes) -> bool:
    """Whether an SSE line carries the answer's first text."""
    if not line.startswith(b"data:"):
        return False
    payload = line[5:].strip()
    if not payload or payload == b"[DONE]":
        return False
    event = orjson.loads(payload)
    if api == "chat":
        return any((choice.get("delta") or {}).get("content") for choice in event.get("choices") or [])
    if api == "messages":
        return bool(event.get("type") == "content_block_delta")
    return bool(event.get("type") == "response.output_text.delta")


def timed_request(
    client: httpx.Client, url: str, api: str, body: bytes, stream: bool, session: str
) -> tuple[float | None, float]:
    """(ms to the first token or None, ms to the last byte) of one request."""
    started = time.perf_counter()
    first: float | None = None
    headers = _headers(api, session) | {"content-type": "application/json"}
    with client.stream("POST", url, content=body, headers=headers) as response:
        if response.status_code != 200:
            response.read()
            raise RequestFailed(f"{url} answered {response.status_code}: {response.text[:500]}")
        if stream:
            for line in response.iter_lines():
                if first is None and _is_token(api, line.encode()):
                    first = (time.perf_counter() - started) * 1000
            if first is None:
                raise RequestFailed(f"{url}: the stream carried no text")
        else:
            response.read()
    return first, (time.perf_counter() - started) * 1000


async def _throughput(url: str, api: str, body: bytes, total: int, label: str) -> float:
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(limits=limits, timeout=120.0) as client:
        counter = iter(range(total))

        async def worker() -> None:
            for index in counter:
                headers = _headers(api, f"{label}-{index}") | {"content-type": "application/json"}
                response = await client.post(url, content=body, headers=headers)
                if response.status_code != 200:
                    raise RequestFailed(f"{url} answered {response.status_code}: {response.text[:500]}")

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return total / (time.perf_counter() - started)


def _session(label: str, index: int) -> str:
    return f"{label}-{index}"


def _body(shape: str, api: str, stream: bool, *, later: bool = False) -> bytes:
    if shape == "agent":
        made = agent_body(api, stream, later=later)
    else:
        made = answer_body(api, stream) if shape == "answer" else tiny_body(api, stream)
    return orjson.dumps(made)


def _figures(samples: list[tuple[float | None, float]]) -> dict[str, float]:
    last = [s[1] for s in samples]
    out = {"p50_ms": percentile(last, 0.5), "p95_ms": percentile(last, 0.95)}
    firsts = [s[0] for s in samples if s[0] is not None]
    if firsts:
        out["first_p50_ms"] = percentile(firsts, 0.5)
    return out


def _sequential(
    client: httpx.Client, url: str, api: str, body: bytes, stream: bool, count: int, session: Callable[[int], str]
) -> list[tuple[float | None, float]]:
    return [timed_request(client, url, api, body, stream, session(i)) for i in range(count)]


def run_agent(
    urls: Mapping[str, str],
    *,
    requests: int,
    throughput_requests: int,
    repeats: int,
    shapes: tuple[str, ...] = SHAPES,
    apis: tuple[str, ...] = APIS,
    warmup: int = 5,
) -> dict[str, Any]:
    """Measure every case on the paths in ``urls`` (``direct`` and ``dynamic`` required, ``litellm-proxy``
    optional); returns the report section."""
    run = uuid.uuid4().hex[:8]
    proxies = [p for p in PROXIES if p in urls]
    cases = [
        (shape, api, stream)
        for shape in shapes
        for api in apis
        for stream in (False, True)
        if stream or shape not in STREAMED_ONLY
    ]
    per_repeat: list[dict[str, dict[str, dict[str, float]]]] = []
    sizes = {shape: len(_body(shape, "chat", False)) for shape in shapes}
    with httpx.Client(timeout=120.0) as client:
        for (shape, api, stream), path in itertools.product(cases, ["direct", *proxies]):
            if path == "direct" and api != "chat":
                continue
            url = urls[path] + endpoint(api)
            label = f"w-{run}-{path}"
            _sequential(client, url, api, _body(shape, api, stream), stream, warmup, functools.partial(_session, label))
        for repeat in range(repeats):
            figures: dict[str, dict[str, dict[str, float]]] = {}
            for shape, api, stream in cases:
                name = case_name(shape, api, stream)
                paths = ["direct", *proxies] if api == "chat" else list(proxies)
                order = paths[repeat % len(paths) :] + paths[: repeat % len(paths)]
                row: dict[str, dict[str, float]] = {}
                for path in order:
                    url = urls[path] + endpoint(api)
                    body = _body(shape, api, stream)
                    label = f"{run}-{repeat}-{name}-{path}"
                    session = functools.partial(_session, label)
                    samples = _sequential(client, url, api, body, stream, requests, session)
                    row[path] = _figures(samples)
                    row[path]["rps"] = asyncio.run(_throughput(url, api, body, throughput_requests, label + "-t"))
                figures[name] = row
            for shape, api, stream in cases:
                direct = figures[case_name(shape, "chat", stream)]["direct"]
                for f in figures[case_name(shape, api, stream)].values():
                    f["added_p50_ms"] = f["p50_ms"] - direct["p50_ms"]
                    if "first_p50_ms" in f:
                        f["added_first_p50_ms"] = f["first_p50_ms"] - direct["first_p50_ms"]
            if "agent" in shapes:
                figures.update(_later_turns(client, urls, apis, requests, f"{run}-{repeat}"))
            per_repeat.append(figures)
    return _summary(per_repeat, sizes, requests, throughput_requests, repeats)


def _later_turns(
    client: httpx.Client, urls: Mapping[str, str], apis: tuple[str, ...], count: int, label: str
) -> dict[str, dict[str, dict[str, float]]]:
    """The same session's second turn through ours, against the direct call of that second turn's bytes."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for stream in (False, True):
        direct_body = _body("agent", "chat", stream, later=True)
        direct_url = urls["direct"] + endpoint("chat")
        direct = _figures(_sequential(client, direct_url, "chat", direct_body, stream, count, lambda i: "d"))
        paths = [path for path in ("dynamic", "legacy") if path in urls]
        for api in apis:
            first, later = _body("agent", api, stream), _body("agent", api, stream, later=True)
            samples: dict[str, list[tuple[float | None, float]]] = {path: [] for path in paths}
            for index in range(count):
                for path in paths[index % len(paths) :] + paths[: index % len(paths)]:  # in turn first
                    url, session = urls[path] + endpoint(api), f"later-{label}-{path}-{api}-{stream}-{index}"
                    timed_request(client, url, api, first, stream, session)
                    samples[path].append(timed_request(client, url, api, later, stream, session))
            row = {}
            for path in paths:
                figures = row[path] = _figures(samples[path])
                figures["added_p50_ms"] = figures["p50_ms"] - direct["p50_ms"]
                figures["direct_p50_ms"] = direct["p50_ms"]
            out[case_name("later", api, stream)] = row
    return out


def _summary(
    per_repeat: list[dict[str, dict[str, dict[str, float]]]],
    sizes: dict[str, int],
    requests: int,
    throughput_requests: int,
    repeats: int,
) -> dict[str, Any]:
    cases: dict[str, Any] = {}
    for name, row in per_repeat[0].items():
        entry: dict[str, Any] = {
            path: {key: median([r[name][path][key] for r in per_repeat]) for key in figures}
            for path, figures in row.items()
        }
        if "litellm-proxy" in row:
            ratios = {
                "added_p50": [_ratio(r[name], "added_p50_ms") for r in per_repeat],
                "added_first_p50": [_ratio(r[name], "added_first_p50_ms") for r in per_repeat],
                "rps": [_ratio(r[name], "rps") for r in per_repeat],
            }
            entry["ratios"] = {key: median(values) for key, values in ratios.items() if all(v >= 0 for v in values)}
        if name.startswith("later/"):
            entry["ratios"] = {
                key: round(entry[path]["added_p50_ms"] / entry[path]["direct_p50_ms"], 3)
                for path, key in (("dynamic", "added_p50_vs_direct"), ("legacy", "legacy_added_p50_vs_direct"))
                if path in entry
            }
        cases[name] = entry
    return {
        "requests_per_repeat": requests,
        "throughput_requests": throughput_requests,
        "concurrency": CONCURRENCY,
        "repeats": repeats,
        "chat_body_bytes": sizes,
        "cases": cases,
        "per_repeat": per_repeat,
    }


def _ratio(row: Mapping[str, Mapping[str, float]], key: str) -> float:
    ours, theirs = row["dynamic"].get(key), row["litellm-proxy"].get(key)
    if ours is None or theirs is None:
        return -1.0
    return ours / theirs if theirs else float("inf")
