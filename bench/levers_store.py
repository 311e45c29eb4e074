"""Two levers of issue 18, each measured in-process, back to back, as milliseconds saved per request.

- ``begin_turn_lever``: a turn starts with ONE store call (``SessionStore.begin_turn``: reconcile, number
  the call, read the branch state, the checkpoints and the route's calibration in one transaction)
  instead of one call per item. It counts the store calls a real ``TurnService`` turn makes for a small
  request, and times ``begin_turn`` against the same work done as separate calls on the same SQLite
  store (the sequence turns made before: reconcile, next turn, branch-turn read and write, calibration,
  three branch-state reads, the request's own proxy steps).
- ``prefix_reuse_lever``: a resent history is hashed once per request, and its unchanged prefix is
  counted by those chain hashes (in the assembly and in the calibration sample) instead of by a digest
  of each message's content; the trace's size of the client's request (``clientTokens``, computed on
  every call, traced or not) is counted the same way instead of by an uncached counter. It times warm
  requests of a real turn at 1,000 and 5,000 messages with the lever on, and with it switched off (the
  store hashes the request again, every message goes through the digest-keyed cache and the client's
  request is counted from scratch, as before).

Both return the lever dicts of bench/README.md (plus their details) for the bench report. The machine the
bench runs on is shared and noisy: each comparison alternates the two variants and reports medians of both.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from proxy.process.offline import prepare_offline_environment

prepare_offline_environment()

from bench.assembly import TOOLS, make_history  # noqa: E402 - after the offline set-up (tiktoken)
from proxy.builder import build_service  # noqa: E402
from proxy.context.estimators import ConservativeTokenEstimator  # noqa: E402
from proxy.context.turn_estimator import TurnEstimator  # noqa: E402
from proxy.kernel.config import ModelRoute, Settings  # noqa: E402
from proxy.runtime.calls import ModelCalls  # noqa: E402
from proxy.runtime.service import TurnService  # noqa: E402
from proxy.runtime.session_identity import SessionIdentity  # noqa: E402
from proxy.session import reconcile as rc  # noqa: E402
from proxy.session.sqlite import SqliteSessionStore  # noqa: E402

SECRET = b"b" * 32
ROUTE = ModelRoute("bench", {"model": "openai/bench"}, max_input_tokens=4_000_000, max_output_tokens=1_000)
_CHANNELS = ("compaction.previewed_refs", "compaction.summary_retry_after", "internal_steps.anchors")


class _Answer:
    """A provider that answers every call at once (the lever measures the proxy, not a model)."""

    def provider_arguments(self, llm_input: dict[str, Any]) -> dict[str, Any]:
        return llm_input

    async def complete(self, llm_input: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": "bench",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1000, "completion_tokens": 1, "total_tokens": 1001},
        }

    async def stream(self, llm_input: dict[str, Any], *, usage_to_caller: bool = True) -> AsyncIterator[dict[str, Any]]:
        raise NotImplementedError("the levers send whole requests")


class _CountingStore:
    """The store with every awaited call counted: one call is one round trip to its thread or server."""

    def __init__(self, inner: SqliteSessionStore) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name == "turn_lock" or not asyncio.iscoroutinefunction(attribute):
            return attribute

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return await attribute(*args, **kwargs)

        return counted


def _runner(folder: Path, store: Any, *, traces: bool, route: ModelRoute = ROUTE) -> TurnService:
    settings = Settings(data_dir=folder / "data", models=(route,), trace_enabled=traces, framing_secret=SECRET)
    return build_service(settings, store, _Answer(), lambda model: (None, None), SECRET)


def _body(messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "bench", "messages": list(messages), "tools": TOOLS, "max_tokens": 64}


async def _with_store(work: Callable[[Path, SqliteSessionStore], Awaitable[Any]]) -> Any:
    with tempfile.TemporaryDirectory(prefix="levers-store-") as name:
        store = SqliteSessionStore(Path(name) / "store.db")
        await store.open()
        try:
            return await work(Path(name), store)
        finally:
            await store.close()


def store_round_trips(*, traces: bool = False) -> list[str]:
    """The store calls one small request (3 messages, a new session) makes through a real turn."""

    async def work(folder: Path, store: SqliteSessionStore) -> list[str]:
        counting = _CountingStore(store)
        runner = _runner(folder, counting, traces=traces)
        messages = [
            {"role": "system", "content": "You are a lab assistant."},
            {"role": "user", "content": "Plan the assay."},
            {"role": "user", "content": "Start with the buffer."},
        ]
        await runner.run(_body(messages), SessionIdentity("lever-small", "header:x-session-id", "main"), ROUTE)
        return counting.calls

    return list(asyncio.run(_with_store(work)))


def begin_turn_lever(repeats: int = 200) -> dict[str, Any]:
    """Milliseconds saved per small request by starting a turn with one store call, and the calls counted."""

    async def work(folder: Path, store: SqliteSessionStore) -> dict[str, Any]:
        messages = [{"role": "user", "content": "Plan the assay."}]
        one, separate = [], []
        for index in range(repeats):
            context_id = f"lever-{index}"
            chain = (await store.reconcile(context_id, "main", messages)).chain_hashes  # the session exists
            started = time.perf_counter()
            await store.begin_turn(
                context_id, "main", messages, _CHANNELS, branch_counter="trace.branch_turns", calibration="route:b"
            )
            one.append(time.perf_counter() - started)
            started = time.perf_counter()
            await store.reconcile(context_id, "main", messages)
            await store.next_turn(context_id)
            await store.branch_view(context_id, chain[:-1], ["trace.branch_turns"])
            await store.put_state(context_id, chain[-1], "trace.branch_turns", 1)
            await store.calibration("route:b")
            for channel in _CHANNELS:
                await store.branch_view(context_id, chain, [channel])
            await store.internal_steps(context_id, f"{chain[-1]}/request")
            separate.append(time.perf_counter() - started)
        return {"one_call_ms": _median_ms(one), "separate_calls_ms": _median_ms(separate)}

    timings = asyncio.run(_with_store(work))
    calls = store_round_trips()
    traced = store_round_trips(traces=True)
    return {
        "lever": "begin_turn: one store round trip per turn",
        "before_ms": timings["separate_calls_ms"],
        "after_ms": timings["one_call_ms"],
        "what": f"median store time of a small turn's start over {repeats} turns (SQLite): the separate calls "
        f"it replaced, then begin_turn; a real turn now makes {len(calls)} store call{'' if len(calls) == 1 else 's'}",
        "saved_ms": round(timings["separate_calls_ms"] - timings["one_call_ms"], 3),
        **timings,
        "store_calls_per_small_request": len(calls),
        "store_calls_before_the_provider_call": calls.index("update_calibration")
        if "update_calibration" in calls
        else len(calls),
        "store_calls": calls,
        "store_calls_traced": traced,
    }


@contextmanager
def _names_off() -> Iterator[None]:
    """As before the lever: every history message counted through the digest-keyed cache (in the assembly
    and in the calibration sample), the client's request sized for the trace by an uncached counter,
    and the store hashing the request again instead of taking the runner's chain hashes."""
    name_messages, given, sizes = TurnEstimator.name_messages, rc.given_or_computed, ModelCalls.sizes

    def computed(context_id: str, messages: Any, hashes: Any, memo: Any) -> list[str]:
        return rc.request_hashes(context_id, messages, memo)

    TurnEstimator.name_messages = lambda self, messages, hashes: None  # type: ignore[method-assign]
    rc.given_or_computed = computed
    ModelCalls.sizes = lambda self, request: ConservativeTokenEstimator()  # type: ignore[method-assign]
    try:
        yield
    finally:
        TurnEstimator.name_messages = name_messages  # type: ignore[method-assign]
        rc.given_or_computed = given
        ModelCalls.sizes = sizes  # type: ignore[method-assign]


def prefix_reuse_lever(sizes: Sequence[int] = (1000, 5000), repeats: int = 9) -> dict[str, Any]:
    """Milliseconds saved per warm request by counting the unchanged prefix by chain hash, per size."""

    async def work(folder: Path, store: SqliteSessionStore) -> list[dict[str, Any]]:
        runner = _runner(folder, store, traces=False)
        rows = []
        for n in sizes:
            history = make_history(n)
            named, digested = [], []
            for index in range(repeats):
                for variant, times in (("named", named), ("digested", digested)):
                    identity = SessionIdentity(f"prefix-{n}-{index}-{variant}", "header:x-session-id", "main")
                    await runner.run(_body(history[:-1]), identity, ROUTE)  # the previous turn: the store is warm
                    with _names_off() if variant == "digested" else _nothing():
                        started = time.perf_counter()
                        await runner.run(_body(history), identity, ROUTE)
                        times.append(time.perf_counter() - started)
            rows.append(
                {
                    "messages": n,
                    "warm_named_ms": _median_ms(named),
                    "warm_digested_ms": _median_ms(digested),
                    "saved_ms": round(_median_ms(digested) - _median_ms(named), 3),
                }
            )
        return rows

    rows = asyncio.run(_with_store(work))
    first, *others = rows
    return {
        "lever": "counts reused for the resent prefix",
        "before_ms": first["warm_digested_ms"],
        "after_ms": first["warm_named_ms"],
        "what": f"median warm turn in-process at {first['messages']:,} messages over {repeats} turns"
        + "".join(
            f"; at {row['messages']:,}: {row['warm_digested_ms']} -> {row['warm_named_ms']} ms" for row in others
        ),
        "saved_ms": {row["messages"]: row["saved_ms"] for row in rows},
        "rows": rows,
        "repeats": repeats,
    }


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _median_ms(seconds: Sequence[float]) -> float:
    return round(statistics.median(seconds) * 1000, 3)


if __name__ == "__main__":
    import json

    print(json.dumps({"begin_turn": begin_turn_lever(), "prefix_reuse": prefix_reuse_lever()}, indent=2))
