"""Learned limits: only from a believable overflow, never below the floor, per configured route, for an hour."""

from __future__ import annotations

import pytest

from proxy.builder import check_settings
from proxy.kernel.config import ConfigError, ModelRoute, Settings
from proxy.runtime.limits import (
    LEARNED_LIMIT_SECONDS,
    UNROUTED_CACHE_SIZE,
    ImpossibleLimits,
    RouteLimits,
    check_route_limits,
    resolve_limits,
)

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


def _reserve_settings(tmp_path, reserve: int, window: int) -> Settings:
    config = tmp_path / "config.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: lab-small\n"
        "    litellm_params: {model: openai/lab-small}\n"
        f"    model_info: {{max_input_tokens: {window}}}\n"
        "  - model_name: lab-large\n"
        "    litellm_params: {model: openai/lab-large}\n"
        "    model_info: {max_input_tokens: 200000}\n"
    )
    env = {"OUTPUT_RESERVE_TOKENS": str(reserve), "SCIENCE_AGENT_DATA_DIR": str(tmp_path / "data")}
    return Settings.from_env(env, config_path=config)


@pytest.mark.parametrize("reserve", [6_000, 9_000])
def test_a_reserve_at_or_above_a_configured_window_stops_start_up_naming_both(tmp_path, reserve):
    settings = _reserve_settings(tmp_path, reserve, window=6_000)

    with pytest.raises(ConfigError) as refused:
        check_settings(settings)  # what ``serve`` runs before it listens
    message = str(refused.value)
    assert f"OUTPUT_RESERVE_TOKENS={reserve}" in message and "6000 tokens" in message and "'lab-small'" in message
    # The runner refuses the same settings (an embedding application that skips check_settings).
    with pytest.raises(ConfigError, match=f"OUTPUT_RESERVE_TOKENS={reserve}"):
        check_route_limits(settings, lambda model: (None, None))


def test_a_reserve_below_every_configured_window_starts(tmp_path):
    settings = _reserve_settings(tmp_path, 5_999, window=6_000)
    check_settings(settings)
    route = settings.route("lab-small")
    assert route is not None
    assert resolve_limits(settings, route, lambda model: (None, None)).effective_input_tokens == 1


def test_without_a_route_the_reserve_is_checked_against_the_model_map_window():
    settings = Settings.from_env({"OUTPUT_RESERVE_TOKENS": "40000"})
    route = settings.route("openai/some-model")
    assert route is not None
    with pytest.raises(ImpossibleLimits) as refused:
        resolve_limits(settings, route, lambda model: (32_000, 4_000))
    assert refused.value.status == 400 and refused.value.code == "output_reserve_exceeds_window"
    assert "OUTPUT_RESERVE_TOKENS=40000" in refused.value.message and "32000 tokens" in refused.value.message
