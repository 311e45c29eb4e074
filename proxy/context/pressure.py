"""Token pressure: does this call's input need compaction, and how small should the history become?

Everything the model sees draws on one effective input limit: the system prompt, the tool schemas, the
contributed data (``fixed_tokens``, which the compactor cannot shrink) and the history. Compaction fires
at the pressure threshold (default 80 % of the limit) and aims at the lower target (default 50 %), so
one compaction buys many turns and the provider's prompt cache is broken rarely.

A forced pass (after the provider reported an overflow) fires whatever the estimate says and aims
deeper: ``forced_percent`` of the limit, and when the provider stated its window, of that window minus
the output reserve if that is smaller. The estimate evidently under-counted, so aiming exactly at the
stated limit would only invite a second overflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

Reason: TypeAlias = Literal["pressure", "forced"]


@dataclass(frozen=True)
class PressureConfig:
    """Percentages of the context window, each capped at the effective input limit (positive integers,
    ``forced < target < pressure <= 100``)."""

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

    ``window`` is the context window the percentages are of (``None``: the limit itself); every
    threshold and target is capped at ``limit``. ``stated_limit`` (the window a provider named in its
    overflow error) and ``output_reserve`` only matter for a forced pass.
    """
    if limit <= 0:
        raise ValueError(f"limit must be positive, got {limit}")
    config = config or PressureConfig()
    basis = max(window, limit) if window is not None else limit
    threshold = min(basis * config.pressure_percent // 100, limit)
    if forced:
        ceiling = limit
        if stated_limit is not None:
            basis = min(basis, stated_limit)
            ceiling = min(ceiling, max(0, stated_limit - output_reserve))
        target = min(basis * config.forced_percent // 100, ceiling)
    else:
        target = min(basis * config.target_percent // 100, limit)
    return Pressure(limit, fixed_tokens, history_tokens, threshold, target, forced)
