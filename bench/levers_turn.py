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
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from proxy.offline import prepare_offline_environment

prepare_offline_environment()

from bench.assembly import make_history  # noqa: E402 - after the offline set-up (litellm, tiktoken)
from bench.levers_store import ROUTE, _body, _runner, _with_store  # noqa: E402
from proxy.context import compactor, turn_estimator, validator, window  # noqa: E402
from proxy.identity import SessionIdentity  # noqa: E402
from proxy.runtime import calibration, turn  # noqa: E402
from proxy.session.sqlite import SqliteSessionStore  # noqa: E402

MESSAGES = 1000


def _alternate(
    variants: Mapping[str, Callable[[], AbstractContextManager[Any]]], messages: int, repeats: int
) -> dict[str, float]:
    """Median milliseconds of a warm turn at ``messages`` messages under each variant, alternated."""

    async def work(folder: Path, store: SqliteSessionStore) -> dict[str, float]:
        runner = _runner(folder, store, traces=False)
        history = make_history(messages)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for index in range(repeats):
            for name, variant in variants.items():
                identity = SessionIdentity(f"turn-lever-{index}-{name}", "header:x-session-id", "main")
                await runner.run(_body(history[:-1]), identity, ROUTE)  # the previous turn: everything is warm
                with variant():
                    started = time.perf_counter()
                    await runner.run(_body(history), identity, ROUTE)
                    times[name].append(time.perf_counter() - started)
        return {name: round(statistics.median(values) * 1000, 3) for name, values in times.items()}

    return asyncio.run(_with_store(work))


def _one_by_one(estimator: Any, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    return [estimator.count_message(message) for message in messages]


@contextmanager
def _counts_one_by_one() -> Iterator[None]:
    """As before the lever: each stage counts message by message, and the assembly names its history again."""
    users = (validator, window, compactor, calibration, turn)
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
    return {
        "lever": "whole sequences counted at once",
        "before_ms": figures["one_by_one"],
        "after_ms": figures["sequences"],
        "what": f"median warm turn in-process at {messages:,} messages over {repeats} turns each: every stage "
        "counting message by message and the history named twice (before), then sequences counted in one pass "
        "and recognized when counted again (after), alternated",
        "saved_ms": round(figures["one_by_one"] - figures["sequences"], 3),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(sequence_counts_lever(), indent=2))
