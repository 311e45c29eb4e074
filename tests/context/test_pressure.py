"""Token pressure: threshold, target, and the deeper forced target."""

import pytest

from proxy.context.pressure import PressureConfig, measure_pressure


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
    # A small stated window with a large reserve: the target stays below what the reserve leaves.
    tight = measure_pressure(
        limit=100_000, fixed_tokens=0, history_tokens=1, forced=True, stated_limit=5_000, output_reserve=4_000
    )
    assert tight.target_tokens == 1_000
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
    # A reserve that takes a quarter of the window: the threshold is the effective limit itself.
    q = measure_pressure(limit=12_000, fixed_tokens=0, history_tokens=1, window=16_000)
    assert (q.threshold_tokens, q.target_tokens) == (12_000, 8_000)
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
