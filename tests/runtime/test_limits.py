"""Learned limits: only from a believable overflow, never below the floor, per configured route, for an hour."""

from __future__ import annotations

import pytest

from proxy.config import ModelRoute, Settings
from proxy.runtime.limits import LEARNED_LIMIT_SECONDS, UNROUTED_CACHE_SIZE, RouteLimits

ROUTE = ModelRoute("gpt", {"model": "openai/gpt"}, max_input_tokens=100_000, max_output_tokens=4_000)


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _limits(clock: Clock, lookups: list[str] | None = None) -> RouteLimits:
    def lookup(model: str) -> tuple[int | None, int | None]:
        if lookups is not None:
            lookups.append(model)
        return None, None

    return RouteLimits(Settings(models=(ROUTE,)), lookup, clock)


def test_a_consistent_overflow_is_learned_and_expires_after_an_hour():
    clock = Clock()
    limits = _limits(clock)
    assert limits.learn(ROUTE, stated=60_000, sent_tokens=70_000)
    learned = limits.get(ROUTE)
    assert (learned.model_max_tokens, learned.effective_input_tokens, learned.source) == (
        60_000,
        56_000,
        "provider_error",
    )
    clock.now += LEARNED_LIMIT_SECONDS - 1
    assert limits.get(ROUTE).model_max_tokens == 60_000
    clock.now += 1
    assert (limits.get(ROUTE).model_max_tokens, limits.get(ROUTE).source) == (100_000, "config")


@pytest.mark.parametrize(
    ("stated", "sent"),
    [(60_000, 50_000), (60_000, 60_000), (60_000, None), (None, 70_000), (64, 300), (64, 25_000)],
)
def test_a_statement_the_request_cannot_have_caused_is_not_learned(stated, sent):
    limits = _limits(Clock())
    assert not limits.learn(ROUTE, stated=stated, sent_tokens=sent)
    assert limits.get(ROUTE).source == "config"


@pytest.mark.parametrize(("window", "floor"), [(100_000, 25_000), (2_000, 1_024)])
def test_no_statement_goes_below_the_floor(window, floor):
    route = ModelRoute("gpt", {"model": "openai/gpt"}, max_input_tokens=window, max_output_tokens=500)
    limits = RouteLimits(Settings(models=(route,)), lambda model: (None, None), Clock())
    assert limits.learn(route, stated=10, sent_tokens=window)
    assert limits.get(route).model_max_tokens == floor


def test_a_larger_statement_does_not_undo_a_smaller_learned_one():
    limits = _limits(Clock())
    assert limits.learn(ROUTE, stated=50_000, sent_tokens=70_000)
    assert not limits.learn(ROUTE, stated=80_000, sent_tokens=90_000)
    assert limits.get(ROUTE).model_max_tokens == 50_000


def test_client_model_names_without_a_model_list_are_not_learned_nor_kept():
    lookups: list[str] = []
    limits = RouteLimits(Settings(), lambda model: (lookups.append(model), (None, None))[1], Clock())
    first = Settings().route("model-0")
    assert first is not None
    assert not limits.learn(first, stated=2_000, sent_tokens=9_000)
    for index in range(UNROUTED_CACHE_SIZE * 4):
        route = Settings().route(f"model-{index}")
        assert route is not None and limits.get(route).source == "fallback"
    assert len(limits._unrouted) == UNROUTED_CACHE_SIZE
    limits.get(first)  # long evicted: resolved again
    assert lookups.count("model-0") == 2
