"""Token pressure: does this call's input need compaction, and how small should the history become?

Everything the model sees draws on one effective input limit: the system prompt, the tool schemas, the
contributed data (``fixed_tokens``, which the compactor cannot shrink) and the history. Compaction fires
at the pressure threshold (default 80 % of the context window) and aims at the lower target (default
50 %), so one compaction buys many turns and the provider's prompt cache is broken rarely.

The percentages are of the context window, but the input may use only the effective limit (the window
minus the output reserve). Where the reserve is a large part of the window (an 8,192-token model with
the default 4,096-token reserve), 80 % and 50 % of the window are both over the limit; capped there
alone, compaction would fire only at the limit and aim at it, so every turn would compact again and
lean on the provider's overflow. So each level also keeps a margin below the limit, whatever the
window and reserve: the threshold is at most ``THRESHOLD_CEILING_PERCENT`` (95 %) of the effective
limit, every target at most ``TARGET_CEILING_PERCENT`` (75 %) of it, hence target < threshold < limit.
Where the reserve is at most 15 % of the window (16k/2k, 7k/1k, 128k/16k, 128k/4k) the default
percentages are below both ceilings and nothing changes.

A forced pass (after the provider reported an overflow) fires whatever the estimate says and aims
deeper: ``forced_percent`` of the limit, and when the provider stated its window, of that window minus
the output reserve if that is smaller (and at most ``TARGET_CEILING_PERCENT`` of that). The estimate
evidently under-counted, so aiming exactly at the stated limit would only invite a second overflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

Reason: TypeAlias = Literal["pressure", "forced"]

# The margins every level keeps below the effective input limit, in % of it. The threshold's margin is
# for the estimate's error (a calibrated route is under the provider's count in about 1 % of calls, by
# at most about 2 %); the target's leaves room for turns between compactions.
THRESHOLD_CEILING_PERCENT = 95
TARGET_CEILING_PERCENT = 75


@dataclass(frozen=True)
class PressureConfig:
    """Percentages of the context window, each kept below the effective input limit by the ceilings
    above (positive integers, ``forced < target < pressure <= 100``)."""

    pressure_percent: int = 80
    target_percent: int = 50
    forced_percent: int = 35

    def __post_init__(self) -> None:
        for name in ("pressure_percent", "target_percent", "forced_percent"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 100:
                raise ValueError(f"{name} must be an integer in 1..100, got {value!r}")
        if not self.forced_percent < self.target_percent < self.pressure_percent:
            raise ValueError(
                "need forced_percent < target_percent < pressure_percent, got "
                f"{self.forced_percent} / {self.target_percent} / {self.pressure_percent}"
            )


@dataclass(frozen=True)
class Level:
    """One level (threshold, target or forced target) for a window: what its percentage asks for, and the
    ceiling it may not pass (a share of the effective limit). ``tokens`` is what compaction uses."""

    percent: int  # of the window
    ceiling_percent: int  # of the effective limit
    asked: int  # ``percent`` of the window
    ceiling: int  # ``ceiling_percent`` of the effective limit

    @property
    def tokens(self) -> int:
        """The level in tokens: what the percentage asks for, never above the ceiling."""
        return min(self.asked, self.ceiling)

    @property
    def clamped(self) -> bool:
        """True when the ceiling, not the percentage, sets the level."""
        return self.asked > self.ceiling


@dataclass(frozen=True)
class Levels:
    """The threshold and the targets of a window and an effective limit, outside a forced pass."""

    threshold: Level
    target: Level
    forced: Level


def pressure_levels(limit: int, window: int | None = None, config: PressureConfig | None = None) -> Levels:
    """The levels for an effective input ``limit`` and the context ``window`` the percentages are of
    (``None``: the limit itself); what start-up reports when a ceiling, not a percentage, sets one."""
    config = config or PressureConfig()
    basis = max(window, limit) if window is not None else limit

    def level(percent: int, ceiling_percent: int) -> Level:
        return Level(percent, ceiling_percent, basis * percent // 100, limit * ceiling_percent // 100)

    return Levels(
        threshold=level(config.pressure_percent, THRESHOLD_CEILING_PERCENT),
        target=level(config.target_percent, TARGET_CEILING_PERCENT),
        forced=level(config.forced_percent, TARGET_CEILING_PERCENT),
    )


@dataclass(frozen=True)
class Pressure:
    """The measured pressure of one call and the token counts a compaction works towards.

    ``threshold_tokens`` and ``target_tokens`` are totals (fixed part included); ``history_target`` is
    what is left of the target for the history once the fixed part is paid.
    """

    limit: int
    fixed_tokens: int
    history_tokens: int
    threshold_tokens: int
    target_tokens: int
    forced: bool

    @property
    def total_tokens(self) -> int:
        """Estimated size of the whole input."""
        return self.fixed_tokens + self.history_tokens

    @property
    def needed(self) -> bool:
        """True when a compaction pass must run: forced, or at/over the threshold."""
        return self.forced or self.total_tokens >= self.threshold_tokens

    @property
    def reason(self) -> Reason | None:
        """Why a pass runs (for the trace), or ``None`` when none is needed."""
        if self.forced:
            return "forced"
        return "pressure" if self.needed else None

    @property
    def history_target(self) -> int:
        """Tokens the history may use after compaction (never negative)."""
        return max(0, self.target_tokens - self.fixed_tokens)

    def with_history(self, history_tokens: int) -> Pressure:
        """The same pressure for a history of another size (after a compaction step)."""
        return Pressure(
            self.limit, self.fixed_tokens, history_tokens, self.threshold_tokens, self.target_tokens, self.forced
        )


def measure_pressure(
    *,
    limit: int,
    fixed_tokens: int,
    history_tokens: int,
    config: PressureConfig | None = None,
    forced: bool = False,
    stated_limit: int | None = None,
    output_reserve: int = 0,
    window: int | None = None,
) -> Pressure:
    """Pressure of an input of ``fixed_tokens + history_tokens`` against the effective ``limit``.

    ``window`` is the context window the percentages are of (``None``: the limit itself); the threshold
    is capped at ``THRESHOLD_CEILING_PERCENT`` of ``limit``, every target at ``TARGET_CEILING_PERCENT``.
    ``stated_limit`` (the window a provider named in its overflow error) and ``output_reserve`` only
    matter for a forced pass.
    """
    if limit <= 0:
        raise ValueError(f"limit must be positive, got {limit}")
    config = config or PressureConfig()
    levels = pressure_levels(limit, window, config)
    threshold = levels.threshold.tokens
    if forced:
        basis = max(window, limit) if window is not None else limit
        ceiling = limit
        if stated_limit is not None:
            basis = min(basis, stated_limit)
            ceiling = min(ceiling, max(0, stated_limit - output_reserve))
        target = min(basis * config.forced_percent // 100, ceiling * TARGET_CEILING_PERCENT // 100)
    else:
        target = levels.target.tokens
    return Pressure(limit, fixed_tokens, history_tokens, threshold, target, forced)
