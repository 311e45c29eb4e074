"""The calibration statistics: recency weighting, the upper-quantile margin, the sample filters, bounded memory."""

from __future__ import annotations

import random

import pytest

from proxy.context.calibration import (
    FEW_SAMPLES_PAD,
    HALF_LIFE_CALLS,
    MAX_RATIO,
    MAX_SAMPLES,
    MIN_MARGIN,
    MIN_RATIO,
    MIN_SAMPLE_TOKENS,
    MIN_SAMPLES,
    QUANTILE,
    Calibration,
    weighted_quantile,
)

LOCAL = 10_000  # a request big enough to teach


def _taught(ratios: list[float], calibration: Calibration | None = None) -> Calibration:
    calibration = calibration or Calibration()
    for ratio in ratios:
        calibration = calibration.observe(LOCAL, round(LOCAL * ratio))
    return calibration


def test_without_samples_the_start_margin_alone_scales_the_base():
    correction = Calibration().correction(1.25)
    assert (correction.ratio, correction.margin, correction.samples, correction.factor) == (1.0, 1.25, 0, 1.25)


def test_identical_samples_keep_the_minimum_margin():
    correction = _taught([1.3] * 50).correction(1.25)
    assert correction.ratio == 1.3 and correction.margin == MIN_MARGIN


def test_few_samples_widen_the_margin_until_the_spread_is_known():
    one = _taught([1.3]).correction(1.25)
    assert one.margin == pytest.approx(MIN_MARGIN * (1 + FEW_SAMPLES_PAD * (MIN_SAMPLES - 1) / MIN_SAMPLES), abs=1e-4)
    enough = _taught([1.3] * MIN_SAMPLES).correction(1.25)
    assert enough.margin == MIN_MARGIN < one.margin


def test_while_samples_are_few_the_margin_covers_the_next_sample_not_just_the_largest_seen():
    # Ratios spread like a real route's (per-message framing is priced differently from request to request).
    rng = random.Random(3)
    ratios = [rng.gauss(1.3, 0.01) for _ in range(600)]
    misses = {}
    for seen in (10, 30, 300):
        calibration = _taught(ratios[:seen])
        factor = calibration.correction(1.25).factor
        # The next 300 answers: how often would the estimate have been under the provider's count?
        misses[seen] = sum(r > factor for r in ratios[seen : seen + 300]) / 300
        # The largest ratio seen is no bound for the next one: ten samples' maximum is exceeded in ~9% of
        # calls, so the margin must reach beyond it while the samples are few.
        assert factor > max(ratios[:seen]) or seen > 200
    assert all(share <= 0.01 for share in misses.values()), misses
    # ...and it narrows as they accumulate (the Student-t factor and the mean's uncertainty shrink).
    assert _taught(ratios[:10]).correction(1.25).margin > _taught(ratios[:30]).correction(1.25).margin


def test_the_margin_comes_from_the_upper_quantile_not_the_mean_nor_the_maximum():
    rng = random.Random(5)
    ratios = [rng.uniform(1.0, 1.1) for _ in range(MAX_SAMPLES - 1)] + [1.6]  # one odd answer, the newest
    correction = _taught(ratios).correction(1.25)

    # The estimate (ratio x margin) is above all but a sliver of what was seen: above the 98th percentile...
    assert correction.factor >= sorted(ratios)[int(0.98 * len(ratios))]
    assert sum(r > correction.factor for r in ratios) <= 0.01 * len(ratios)
    # ...well above the mean (an estimate at the mean is under in half of the calls)...
    assert correction.factor > sum(ratios) / len(ratios) * 1.04
    # ...and one outlier does not set it.
    assert correction.factor < 1.11


def test_recent_samples_weigh_more():
    old, new = [1.0] * (MAX_SAMPLES // 2), [2.0] * (MAX_SAMPLES // 2)
    # Equal counts: the newer half holds two thirds of the weight (a half-life of HALF_LIFE_CALLS), so the
    # median is theirs whichever way round they came.
    assert _taught(old + new).correction(1.25).ratio == 2.0
    assert _taught(new + old).correction(1.25).ratio == 1.0
    assert HALF_LIFE_CALLS == MAX_SAMPLES // 2  # the two-thirds above rests on this


def test_a_provider_side_tokenizer_change_is_learned_within_a_few_hundred_calls():
    settled = _taught([1.0] * MAX_SAMPLES)
    assert settled.correction(1.25).ratio == 1.0

    # A rise is the dangerous way round: the margin covers it within a few calls, well before the median moves.
    risen = _taught([1.3] * 3, settled)
    assert risen.correction(1.25).ratio == 1.0 and risen.correction(1.25).factor >= 1.3

    # The median follows once the new samples hold half the weight: 1 - 0.5 ** (k / 200) = 0.375 of the
    # 400 kept (the oldest already weigh a quarter), k = 136 calls.
    calls, calibration = 3, risen
    while calibration.correction(1.25).ratio != 1.3:
        calibration, calls = _taught([1.3], calibration), calls + 1
        assert calls < 300, "the change was not learned"
    assert 100 <= calls <= 200
    # The old samples' spread no longer widens the margin once they weigh under half a percent.
    calibration = _taught([1.3] * 400, calibration)
    assert calibration.correction(1.25).margin == MIN_MARGIN


def test_a_fall_keeps_the_estimate_on_the_safe_side_while_it_is_learned():
    calibration = _taught([1.3] * MAX_SAMPLES)
    for _ in range(150):
        calibration = _taught([1.0], calibration)
        assert calibration.correction(1.25).factor >= 1.0  # never under the provider's new count


@pytest.mark.parametrize(
    ("local", "provider", "kept"),
    [
        (MIN_SAMPLE_TOKENS - 1, MIN_SAMPLE_TOKENS, False),  # mostly framing: says little about big requests
        (MIN_SAMPLE_TOKENS, MIN_SAMPLE_TOKENS, True),
        (1_000, 0, False),  # no count reported
        (1_000, round(1_000 * MIN_RATIO) - 1, False),  # cached tokens only, or another request's count
        (1_000, round(1_000 * MIN_RATIO), True),
        (1_000, round(1_000 * MAX_RATIO), True),
        (1_000, round(1_000 * MAX_RATIO) + 1, False),
    ],
)
def test_samples_too_small_or_outside_the_ratio_band_teach_nothing(local, provider, kept):
    before = _taught([1.1] * 5)
    after = before.observe(local, provider)
    assert (after is not before) == kept
    assert len(after.samples) == 5 + kept


def test_memory_is_bounded_and_keeps_the_newest():
    calibration = _taught([1.0 + i / 10_000 for i in range(3 * MAX_SAMPLES)])
    assert len(calibration.samples) == MAX_SAMPLES
    assert calibration.samples[-1] == pytest.approx(1.0 + (3 * MAX_SAMPLES - 1) / 10_000)
    assert calibration.samples[0] == pytest.approx(1.0 + 2 * MAX_SAMPLES / 10_000)


def test_the_stored_form_round_trips_and_anything_unreadable_starts_again():
    calibration = _taught([1.2, 1.3, 1.25])
    assert Calibration.from_record(calibration.to_record()) == calibration
    assert Calibration.from_record(None) == Calibration()
    assert Calibration.from_record({"samples": "1.3"}) == Calibration()
    # Junk entries are dropped (a bool is not a ratio, nor is one outside the band); a long list is cut.
    mixed = Calibration.from_record({"samples": [1.2, True, "1.3", 9.0, None, 0.1, 1.4]})
    assert mixed.samples == (1.2, 1.4)
    assert len(Calibration.from_record({"samples": [1.1] * (MAX_SAMPLES + 50)}).samples) == MAX_SAMPLES


def test_weighted_quantile_is_the_smallest_value_reaching_the_weight():
    assert weighted_quantile([3.0, 1.0, 2.0], [1.0, 1.0, 1.0], 0.5) == 2.0
    assert weighted_quantile([1.0, 2.0], [1.0, 3.0], 0.25) == 1.0
    assert weighted_quantile([1.0, 2.0], [1.0, 3.0], 0.26) == 2.0


def test_weighted_quantile_agrees_with_its_definition_on_ties_and_any_weights():
    """Every turn sorts its route's samples for two quantiles: the sorted walk must give exactly what the
    definition says, with repeated values (providers often report the same ratio) and weights in any order."""
    rng = random.Random(11)
    for _ in range(300):
        count = rng.randint(1, 60)
        values = [rng.choice([1.0, 1.1, round(rng.uniform(0.5, 2.0), 6)]) for _ in range(count)]
        weights = [rng.choice([1.0, 0.5, rng.uniform(0.01, 3.0)]) for _ in range(count)]
        for quantile in (0.0, 0.25, 0.5, QUANTILE, 1.0, rng.random()):
            goal = quantile * sum(weights)
            reaching = [v for v in values if sum(w for x, w in zip(values, weights, strict=True) if x <= v) >= goal]
            expected = min(reaching) if reaching else max(values)
            assert weighted_quantile(values, weights, quantile) == expected, (values, weights, quantile)
