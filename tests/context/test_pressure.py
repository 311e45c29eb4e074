"""Token pressure: threshold, target, and the deeper forced target."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.context.pressure import (
    TARGET_CEILING_PERCENT,
    THRESHOLD_CEILING_PERCENT,
    PressureConfig,
    measure_pressure,
    pressure_levels,
)


def test_below_threshold_needs_nothing() -> None:
    p = measure_pressure(limit=10_000, fixed_tokens=1_000, history_tokens=6_999)
    assert (p.threshold_tokens, p.target_tokens) == (8_000, 5_000)
    assert not p.needed and p.reason is None


def test_fixed_part_counts_towards_the_threshold() -> None:
    # The history alone is small, but system prompt + tools + data push the input over.
    p = measure_pressure(limit=10_000, fixed_tokens=5_000, history_tokens=3_000)
    assert p.needed and p.reason == "pressure"
    assert p.history_target == 0


def test_history_target_is_what_the_fixed_part_leaves() -> None:
    p = measure_pressure(limit=10_000, fixed_tokens=1_200, history_tokens=9_000)
    assert p.history_target == 3_800
    assert p.with_history(100).total_tokens == 1_300


def test_forced_pass_fires_anyway_and_aims_below_the_target() -> None:
    normal = measure_pressure(limit=10_000, fixed_tokens=0, history_tokens=100)
    forced = measure_pressure(limit=10_000, fixed_tokens=0, history_tokens=100, forced=True)
    assert not normal.needed
    assert forced.needed and forced.reason == "forced"
    assert forced.target_tokens < normal.target_tokens


def test_forced_pass_respects_the_stated_limit_minus_reserve() -> None:
    p = measure_pressure(
        limit=100_000, fixed_tokens=0, history_tokens=1, forced=True, stated_limit=16_000, output_reserve=4_000
    )
    assert p.target_tokens < 16_000 - 4_000
    assert p.target_tokens == 16_000 * 35 // 100  # of the stated window, as the other percentages are of ours
    # A small stated window with a large reserve: the target stays below what the reserve leaves, with
    # the targets' margin (75 % of it), not at it.
    tight = measure_pressure(
        limit=100_000, fixed_tokens=0, history_tokens=1, forced=True, stated_limit=5_000, output_reserve=4_000
    )
    assert tight.target_tokens == 750
    # A stated limit larger than ours changes nothing.
    q = measure_pressure(limit=10_000, fixed_tokens=0, history_tokens=1, forced=True, stated_limit=50_000)
    assert q.target_tokens == 3_500


def test_percentages_are_of_the_window_and_never_above_the_effective_limit() -> None:
    # A 16,000-token window with a 2,000-token output reserve: the threshold is 80% of the window (12,800),
    # not 80% of the 14,000 left for input (11,200, which subtracted the reserve twice); the target 50%.
    p = measure_pressure(limit=14_000, fixed_tokens=0, history_tokens=12_799, window=16_000)
    assert (p.threshold_tokens, p.target_tokens) == (12_800, 8_000)
    assert not p.needed
    assert p.with_history(12_800).needed
    # A reserve that takes a quarter of the window: 80 % of it is over the effective limit, so the
    # threshold is the ceiling below the limit (95 % of it), not the limit itself.
    q = measure_pressure(limit=12_000, fixed_tokens=0, history_tokens=1, window=16_000)
    assert (q.threshold_tokens, q.target_tokens) == (11_400, 8_000)
    # After an overflow, the forced target is of the stated window and below it minus the reserve.
    r = measure_pressure(
        limit=14_000,
        fixed_tokens=0,
        history_tokens=1,
        window=16_000,
        forced=True,
        stated_limit=15_000,
        output_reserve=2_000,
    )
    assert r.target_tokens == 15_000 * 35 // 100


def test_custom_percentages() -> None:
    config = PressureConfig(pressure_percent=90, target_percent=60, forced_percent=20)
    p = measure_pressure(limit=1_000, fixed_tokens=0, history_tokens=899, config=config)
    assert not p.needed and p.target_tokens == 600
    assert measure_pressure(limit=1_000, fixed_tokens=0, history_tokens=900, config=config).needed


@pytest.mark.parametrize(
    "kwargs",
    [
        {"pressure_percent": 0},
        {"target_percent": 101},
        {"target_percent": 80},  # not below the threshold
        {"forced_percent": 50},  # not below the target
        {"pressure_percent": True},
    ],
)
def test_bad_config_is_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        PressureConfig(**kwargs)


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        measure_pressure(limit=0, fixed_tokens=0, history_tokens=0)


# (window, output reserve) -> (effective limit, threshold, target): the margin rule at small and large windows.
SMALL_AND_LARGE = [
    pytest.param(8_192, 4_096, (4_096, 3_891, 3_072), id="8k-4k"),
    pytest.param(16_000, 4_000, (12_000, 11_400, 8_000), id="16k-4k"),
    pytest.param(128_000, 16_000, (112_000, 102_400, 64_000), id="128k-16k"),
]


@pytest.mark.parametrize(("window", "reserve", "expected"), SMALL_AND_LARGE)
def test_target_and_threshold_keep_a_margin_below_the_effective_limit(window, reserve, expected) -> None:
    limit = window - reserve
    p = measure_pressure(limit=limit, fixed_tokens=0, history_tokens=1, window=window)
    assert (limit, p.threshold_tokens, p.target_tokens) == expected
    assert p.target_tokens < p.threshold_tokens < p.limit
    assert p.threshold_tokens <= limit * THRESHOLD_CEILING_PERCENT // 100  # at least 5 % below the limit
    assert p.target_tokens <= limit * TARGET_CEILING_PERCENT // 100  # at least 25 % below it
    # A compaction buys room: from the target, the history can grow by a fifth of the limit or more
    # before the threshold is reached again.
    assert p.threshold_tokens - p.target_tokens >= limit // 5


def test_at_8k_with_the_default_reserve_compaction_no_longer_fires_at_the_limit_nor_aims_at_it() -> None:
    # Capped at the effective limit alone, 80 % and 50 % of 8,192 were both 4,096: a history of 4,000
    # tokens needed no compaction, and a compaction aimed at the limit itself.
    p = measure_pressure(limit=4_096, fixed_tokens=0, history_tokens=4_000, window=8_192)
    assert p.needed and p.threshold_tokens == 3_891 and p.target_tokens == 3_072
    assert not p.with_history(3_890).needed


def test_the_defaults_at_128k_are_unchanged() -> None:
    # 128,000-token window, the default 4,096-token reserve: 80 % / 50 % / 35 % of the window, as before.
    p = measure_pressure(limit=128_000 - 4_096, fixed_tokens=0, history_tokens=1, window=128_000)
    assert (p.threshold_tokens, p.target_tokens) == (102_400, 64_000)
    levels = pressure_levels(128_000 - 4_096, 128_000)
    assert not any(level.clamped for level in (levels.threshold, levels.target, levels.forced))
    forced = measure_pressure(limit=128_000 - 4_096, fixed_tokens=0, history_tokens=1, window=128_000, forced=True)
    assert forced.target_tokens == 44_800
    # And where the reserve is 15 % of the window or less (the integration tests' 16k/2k, 7k/1k).
    for window, reserve, threshold, target in ((16_000, 2_000, 12_800, 8_000), (7_000, 1_000, 5_600, 3_500)):
        p = measure_pressure(limit=window - reserve, fixed_tokens=0, history_tokens=1, window=window)
        assert (p.threshold_tokens, p.target_tokens) == (threshold, target)


def test_percentages_that_would_break_the_margin_are_clamped_and_say_so() -> None:
    config = PressureConfig(pressure_percent=100, target_percent=90, forced_percent=85)
    levels = pressure_levels(123_904, 128_000, config)
    assert levels.threshold.clamped and levels.threshold.asked == 128_000 and levels.threshold.tokens == 117_708
    assert levels.target.clamped and levels.target.asked == 115_200 and levels.target.tokens == 92_928
    assert levels.forced.clamped and levels.forced.tokens == 92_928
    p = measure_pressure(limit=123_904, fixed_tokens=0, history_tokens=1, window=128_000, config=config)
    assert (p.threshold_tokens, p.target_tokens) == (117_708, 92_928)


@given(
    window=st.integers(min_value=1_000, max_value=2_000_000),
    reserve_share=st.floats(min_value=0.0, max_value=0.9),
    cap=st.one_of(st.none(), st.integers(min_value=100, max_value=2_000_000)),
    percents=st.lists(st.integers(min_value=1, max_value=100), min_size=3, max_size=3, unique=True).map(sorted),
)
def test_target_below_threshold_below_limit_at_every_window_and_reserve(window, reserve_share, cap, percents) -> None:
    forced_percent, target_percent, pressure_percent = percents
    config = PressureConfig(pressure_percent, target_percent, forced_percent)
    limit = max(1, window - int(window * reserve_share))
    if cap is not None:
        limit = min(limit, cap)
    p = measure_pressure(limit=limit, fixed_tokens=0, history_tokens=1, window=window, config=config)
    assert p.threshold_tokens < p.limit
    assert p.target_tokens <= p.threshold_tokens
    assert p.target_tokens <= limit * TARGET_CEILING_PERCENT // 100
    if p.threshold_tokens == limit * THRESHOLD_CEILING_PERCENT // 100:  # the ceiling set it: a real gap
        assert p.target_tokens < p.threshold_tokens
    forced = measure_pressure(limit=limit, fixed_tokens=0, history_tokens=1, window=window, config=config, forced=True)
    assert forced.target_tokens <= p.target_tokens
