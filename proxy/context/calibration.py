"""Token-count calibration: what a provider's ``usage.prompt_tokens`` teaches about the local count.

Every provider answer that reports usage gives one sample, ``provider count / local count`` of the
exact request sent. The correction applied to later estimates is a *recency-weighted* median of
those ratios (``ratio``) times a safety margin taken from their spread (``margin``, over the median:
the larger of the weighted upper quantile and a prediction bound for the next sample), so an estimate
errs high in all but the rarest calls rather than half of them. The upper quantile of a few dozen
samples is little more than their maximum, which the next sample exceeds about once in as many
calls; the prediction bound (the log-ratios' weighted mean plus a Student-t multiple of their spread,
widened by the uncertainty of that mean) is wide while the samples are few and shrinks as they
accumulate. It applies only until the effective sample count reaches ``1 / (1 - QUANTILE)`` (200):
from there the empirical quantile is no longer just the maximum, and unlike a spread it is not moved
far by one odd answer. Recent samples weigh more (a half-life in calls), so a provider that changes
its tokenizer is learned; the upper quantile follows a rise within a few calls (it needs only a sliver of the weight)
and a fall within a few hundred, which is the safe way round.

Pure statistics: the runtime (``proxy/runtime/calibration.py``) loads and stores the state.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

# A sample loses half its weight every this many later calls: a tokenizer change is learned within a
# few hundred calls, while one odd request never moves the median much.
HALF_LIFE_CALLS = 200
# Samples kept per route: the oldest kept one weighs 0.5 ** (400 / 200) = a quarter of the newest.
MAX_SAMPLES = 400
# The upper quantile the margin is taken from: the estimate is meant to be under the provider's count
# in at most 1% of calls. Aiming at 99% exactly misses it about as often as it meets it (the quantile of
# a few hundred weighted samples is itself an estimate: 1.5% of the bench's code requests were under),
# so the margin aims at 99.5%; it costs a few thousandths of the window.
QUANTILE = 0.995
# The prediction bound widens the margin to at most this (the default start margin, what a route with no
# sample at all is given): one odd answer among a few dozen samples would otherwise scale every count
# several times over and refuse requests that fit. The observed quantile itself is not capped: a provider
# whose count rises by 30% is covered by it within a few calls.
MAX_PREDICTED_MARGIN = 1.25
# Even a spread of zero keeps this margin: the next request is never one the route has seen.
MIN_MARGIN = 1.01
# Below this many samples the spread is not known yet; the margin is widened by up to this fraction.
MIN_SAMPLES = 8
FEW_SAMPLES_PAD = 0.05
# A request this small is mostly framing, whose cost differs from provider to provider more than any
# text's; it says little about the requests that approach the window, which are the ones that matter.
MIN_SAMPLE_TOKENS = 500
# Ratios outside this band are not a tokenizer difference but a provider reporting something else
# (cached tokens only, a count of another request): dropped, so one odd answer cannot skew the route.
MIN_RATIO, MAX_RATIO = 0.4, 3.0


@dataclass(frozen=True)
class Correction:
    """How a base count is scaled for one route: ``factor = ratio * margin``; ``samples`` taught it."""

    ratio: float
    margin: float
    samples: int

    @property
    def factor(self) -> float:
        """What a base count is multiplied by."""
        return self.ratio * self.margin


@dataclass(frozen=True)
class Calibration:
    """A route's recent samples (provider count / local count), oldest first."""

    samples: tuple[float, ...] = ()

    def observe(self, local_tokens: int, provider_tokens: int) -> Calibration:
        """This calibration with one more sample; unchanged when the sample teaches nothing."""
        if local_tokens < MIN_SAMPLE_TOKENS or provider_tokens <= 0:
            return self
        ratio = provider_tokens / local_tokens
        if not MIN_RATIO <= ratio <= MAX_RATIO:
            return self
        return Calibration((*self.samples, round(ratio, 6))[-MAX_SAMPLES:])

    def correction(self, start_margin: float) -> Correction:
        """The correction for the next estimate; ``start_margin`` alone while there is no sample."""
        if not self.samples:
            return Correction(ratio=1.0, margin=start_margin, samples=0)
        weights = _weights(len(self.samples))
        median, upper = _weighted_quantiles(self.samples, weights, (0.5, QUANTILE))
        observed = upper / median
        predicted = min(prediction_bound(self.samples, weights) / median, MAX_PREDICTED_MARGIN)
        margin = max(observed, predicted, MIN_MARGIN)
        missing = max(0, MIN_SAMPLES - len(self.samples))
        margin *= 1 + FEW_SAMPLES_PAD * missing / MIN_SAMPLES
        return Correction(ratio=round(median, 4), margin=round(margin, 4), samples=len(self.samples))

    def to_record(self) -> dict[str, Any]:
        """The stored form (JSON)."""
        return {"samples": list(self.samples)}

    @classmethod
    def from_record(cls, record: Mapping[str, Any] | None) -> Calibration:
        """Read the stored form back; anything unreadable is an empty calibration (start again)."""
        raw = record.get("samples") if isinstance(record, Mapping) else None
        if not isinstance(raw, list):
            return cls()
        recent = raw[-MAX_SAMPLES:]
        plain = recent and all(type(x) is float for x in recent)  # as stored: the common case, read every turn
        if plain and min(recent) >= MIN_RATIO and max(recent) <= MAX_RATIO:
            return cls(tuple(recent))
        kept = [
            float(x)
            for x in raw
            if isinstance(x, int | float) and not isinstance(x, bool) and MIN_RATIO <= x <= MAX_RATIO
        ]
        return cls(tuple(kept[-MAX_SAMPLES:]))


@functools.lru_cache(maxsize=4)
def _weights(count: int) -> tuple[float, ...]:
    """The samples' recency weights, oldest first: the same for every route with ``count`` samples (a
    turn reads its route's correction, and a route keeps ``MAX_SAMPLES`` once it is warm)."""
    return tuple(0.5 ** ((count - 1 - index) / HALF_LIFE_CALLS) for index in range(count))


@functools.lru_cache(maxsize=4)
def _effective_count(weights: tuple[float, ...]) -> float:
    """Kish's effective sample count of ``weights``."""
    return sum(weights) ** 2 / sum(w * w for w in weights)


def prediction_bound(values: Sequence[float], weights: Sequence[float], quantile: float = QUANTILE) -> float:
    """An upper bound the next ratio stays under with probability ``quantile``, were the log-ratios
    normal: ``exp(mean + t * sd * sqrt(1 + 1/n))`` over the weighted log-ratios, ``n`` their effective
    count (Kish) and ``t`` Student's quantile with ``n - 1`` degrees of freedom. 0 (no bound) below
    ``MIN_SAMPLES`` samples (the few-samples pad stands in), and from ``1 / (1 - quantile)`` effective samples on (the
    empirical quantile then stands on its own)."""
    if len(values) < MIN_SAMPLES:
        return 0.0
    effective = _effective_count(tuple(weights))
    if effective >= 1 / (1 - quantile):
        return 0.0
    total = sum(weights)
    logs = [math.log(v) for v in values]
    mean = sum(w * x for w, x in zip(weights, logs, strict=True)) / total
    variance = sum(w * (x - mean) ** 2 for w, x in zip(weights, logs, strict=True)) / total
    variance *= effective / (effective - 1)  # the unbiased spread of a sample this small
    spread = math.sqrt(variance) * math.sqrt(1 + 1 / effective)
    return math.exp(mean + student_t_quantile(quantile, max(effective - 1, 2.0)) * spread)


def student_t_quantile(quantile: float, dof: float) -> float:
    """Student's t quantile by the Cornish-Fisher expansion around the normal one (Hill, 1970): within
    1 % from 5 degrees of freedom up and 12 % low at 2, where the few-samples pad adds its own width."""
    z = NormalDist().inv_cdf(quantile)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / dof + g2 / dof**2 + g3 / dof**3


def weighted_quantile(values: Sequence[float], weights: Sequence[float], quantile: float) -> float:
    """The smallest value whose cumulative weight (values ascending) reaches ``quantile`` of the total."""
    return _weighted_quantiles(values, weights, (quantile,))[0]


def _weighted_quantiles(values: Sequence[float], weights: Sequence[float], quantiles: Sequence[float]) -> list[float]:
    """``weighted_quantile`` of each of ``quantiles``, over one sort of the values. Every turn reads its route's
    correction and every answer adds a sample, so this runs on every turn over up to ``MAX_SAMPLES``: the
    values' positions are sorted by value (ties keep their order: older, lighter first) and their weights
    summed in that order in C, where sorting (value, weight) pairs and walking them took twice as long."""
    if len(weights) != len(values):
        raise ValueError(f"{len(values)} values but {len(weights)} weights")
    order = sorted(range(len(values)), key=values.__getitem__)
    cumulative = list(itertools.accumulate([weights[index] for index in order]))
    total = sum(weights)
    last = len(order) - 1
    return [values[order[min(bisect.bisect_left(cumulative, quantile * total), last)]] for quantile in quantiles]
