"""A lever of a warm turn's own CPU, measured in-process on a real turn, back to back.

``sequence_counts_lever``: a turn counts whole message sequences in one pass, recognizes a sequence it
counted already (the validator's composed input, then the calibration sample of what was sent), and does
not name the history again after the calibration named the client's messages (``TurnEstimator.counts``,
``counts_of``). Switched off, every stage counts message by message, as before.

It returns a lever dict of bench/README.md. The machine is shared and noisy: the variants alternate
turn by turn, and each figure is a median.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from proxy.process.offline import prepare_offline_environment

prepare_offline_environment()

from bench.assembly import make_history  # noqa: E402 - after the offline set-up (litellm, tiktoken)
from bench.levers_store import ROUTE, _body, _runner, _with_store  # noqa: E402
from contributors.base import BuiltinContributor  # noqa: E402
from proxy.context import turn_estimator, validator, window, working_history  # noqa: E402
from proxy.context.previews import PreviewMemo  # noqa: E402
from proxy.context.units import SplitMemo, split_units  # noqa: E402
from proxy.edge.request_body import decode_body  # noqa: E402
from proxy.kernel import jsonio  # noqa: E402
from proxy.kernel.config import ModelRoute  # noqa: E402
from proxy.process import startup_gc  # noqa: E402
from proxy.runtime import calibration, calls  # noqa: E402
from proxy.runtime.session_identity import SessionIdentity  # noqa: E402
from proxy.session.sqlite import SqliteSessionStore  # noqa: E402

MESSAGES = 1000


def _alternate(
    variants: Mapping[str, Callable[[], AbstractContextManager[Any]]],
    messages: int,
    repeats: int,
    route: ModelRoute = ROUTE,
    decoded: bool = False,
) -> dict[str, float]:
    """Median milliseconds of a warm turn at ``messages`` messages under each variant, alternated;
    ``decoded``: the turn decodes its body from JSON first, as the edge does (the objects a turn makes)."""

    async def work(folder: Path, store: SqliteSessionStore) -> dict[str, float]:
        runner = _runner(folder, store, traces=False, route=route)
        history = make_history(messages)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for index in range(repeats):
            for name, variant in variants.items():
                identity = SessionIdentity(f"turn-lever-{index}-{name}", "header:x-session-id", "main")
                await runner.run(_body(history[:-1]), identity, route)  # the previous turn: everything is warm
                raw = jsonio.dumps(_body(history)) if decoded else b""
                with variant():
                    started = time.perf_counter()
                    await runner.run(decode_body(raw) if decoded else _body(history), identity, route)
                    times[name].append(time.perf_counter() - started)
        return {name: round(statistics.median(values) * 1000, 3) for name, values in times.items()}

    return asyncio.run(_with_store(work))


def _lever_result(lever: str, figures: Mapping[str, float], before: str, after: str, what: str) -> dict[str, Any]:
    """A lever dict (bench/README.md) of the ``before`` and ``after`` variants' medians in ``figures``."""
    return {
        "lever": lever,
        "before_ms": figures[before],
        "after_ms": figures[after],
        "what": what,
        "saved_ms": round(figures[before] - figures[after], 3),
    }


def _one_by_one(estimator: Any, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    return [estimator.count_message(message) for message in messages]


@contextmanager
def _counts_one_by_one() -> Iterator[None]:
    """As before the lever: each stage counts message by message, and the assembly names its history again."""
    users = (validator, window, working_history, calibration, calls)
    saved = [module.counts_of for module in users]
    name_messages = turn_estimator.TurnEstimator.name_messages

    def name_again(self: turn_estimator.TurnEstimator, messages: Any, chain_hashes: Any) -> None:
        self._last_named = ((), [])
        name_messages(self, messages, chain_hashes)

    for module in users:
        module.counts_of = _one_by_one  # type: ignore[attr-defined]
    turn_estimator.TurnEstimator.name_messages = name_again  # type: ignore[method-assign]
    try:
        yield
    finally:
        for module, original in zip(users, saved, strict=True):
            module.counts_of = original  # type: ignore[attr-defined]
        turn_estimator.TurnEstimator.name_messages = name_messages  # type: ignore[method-assign]


def sequence_counts_lever(messages: int = MESSAGES, repeats: int = 15) -> dict[str, Any]:
    """Milliseconds of a warm turn counting message by message, then by whole sequences."""
    figures = _alternate({"one_by_one": _counts_one_by_one, "sequences": nullcontext}, messages, repeats)
    return _lever_result(
        "whole sequences counted at once",
        figures,
        "one_by_one",
        "sequences",
        f"median warm turn in-process at {messages:,} messages over {repeats} turns each: every stage "
        "counting message by message and the history named twice (before), then sequences counted in one pass "
        "and recognized when counted again (after), alternated",
    )


# A window the bench history overflows, as in part 2 (no model_info: litellm's default for an unknown
# model): every warm turn re-applies earlier previews and the window drops the oldest steps.
COMPACTING = ModelRoute("bench", {"model": "openai/bench"}, max_input_tokens=128_000, max_output_tokens=4_096)


@contextmanager
def _compaction_from_scratch() -> Iterator[None]:
    """As before the lever: previews rendered and histories split anew every turn, the window splitting
    and counting the history the compactor rendered again."""
    named_preview, split = PreviewMemo.named_preview, SplitMemo.split
    apply = window.AtomicHistoryWindowPolicy.apply

    def fresh_preview(self: PreviewMemo, *args: Any, **kwargs: Any) -> Any:
        self._texts.clear()
        return named_preview(self, *args, **kwargs)

    def fresh_split(self: SplitMemo, history: Any, chain_hashes: Any) -> Any:
        return split_units(history)

    def window_alone(self: Any, history: Any, **kwargs: Any) -> Any:
        return apply(self, history, **{**kwargs, "units": None, "costs": None})

    PreviewMemo.named_preview = fresh_preview  # type: ignore[method-assign]
    SplitMemo.split = fresh_split  # type: ignore[method-assign]
    window.AtomicHistoryWindowPolicy.apply = window_alone  # type: ignore[method-assign]
    try:
        yield
    finally:
        PreviewMemo.named_preview = named_preview  # type: ignore[method-assign]
        SplitMemo.split = split  # type: ignore[method-assign]
        window.AtomicHistoryWindowPolicy.apply = apply  # type: ignore[method-assign]


def compaction_memo_lever(messages: int = MESSAGES, repeats: int = 15) -> dict[str, Any]:
    """Milliseconds of a warm compacting turn redoing its previews and splits, then carrying them over."""
    variants = {"from_scratch": _compaction_from_scratch, "memos": nullcontext}
    figures = _alternate(variants, messages, repeats, route=COMPACTING)
    return _lever_result(
        "previews and units carried over",
        figures,
        "from_scratch",
        "memos",
        f"median warm turn in-process at {messages:,} messages over a 128k-token window, {repeats} turns "
        "each: earlier previews rendered again, the history split again and the window splitting and counting "
        "it once more (before), then PreviewMemo, SplitMemo and the compactor's units and counts handed to the "
        "window (after), alternated",
    )


@contextmanager
def _young_threshold(threshold: int) -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(threshold, *saved[1:])
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def young_threshold_lever(messages: int = MESSAGES, repeats: int = 15) -> dict[str, Any]:
    """Milliseconds of a warm turn with young collections every 700 new objects, then every
    ``startup_gc.YOUNG_THRESHOLD``."""
    gc.freeze()  # as the app does once started: the collector walks only what turns make
    variants = {
        "default": lambda: _young_threshold(700),
        "raised": lambda: _young_threshold(startup_gc.YOUNG_THRESHOLD),
    }
    figures = _alternate(variants, messages, repeats, route=COMPACTING, decoded=True)
    return _lever_result(
        f"young collections every {startup_gc.YOUNG_THRESHOLD:,} objects",
        figures,
        "default",
        "raised",
        f"median warm compacting turn in-process at {messages:,} messages, its body decoded from JSON, "
        f"{repeats} turns each, start-up frozen: CPython's young threshold of 700 (before) against "
        f"{startup_gc.YOUNG_THRESHOLD:,} (after), alternated",
    )


@contextmanager
def _contributors_in_tasks() -> Iterator[None]:
    """As before the lever: every built-in contributor in a task of its own, under the collector's timer."""
    BuiltinContributor.runs_inline = False  # type: ignore[misc]
    try:
        yield
    finally:
        BuiltinContributor.runs_inline = True  # type: ignore[misc]


def inline_contributors_lever(messages: int = MESSAGES, repeats: int = 15) -> dict[str, Any]:
    """Milliseconds of a warm compacting turn with each built-in contributor in a task of its own, then
    with them run in the pipeline's task (``runs_inline``)."""
    variants = {"tasks": _contributors_in_tasks, "inline": nullcontext}
    figures = _alternate(variants, messages, repeats, route=COMPACTING)
    return _lever_result(
        "built-in contributors run inline",
        figures,
        "tasks",
        "inline",
        f"median warm turn in-process at {messages:,} messages over a 128k-token window (three contributor "
        f"passes), {repeats} turns each: the ten built-ins each in a task with a timer (before), then in the "
        "pipeline's task one after another (after), alternated",
    )


if __name__ == "__main__":
    import json

    levers = [sequence_counts_lever(), compaction_memo_lever(), young_threshold_lever(), inline_contributors_lever()]
    print(json.dumps(levers, indent=2))
