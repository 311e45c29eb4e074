"""What a session would have cost without the proxy: its client's own requests priced as a passthrough.

The report puts the proxy's cost (the traces' ``cost``, read in ``proxy/report/traces.py``) beside this
estimate. Shadow and legacy calls sent the client's request: their cost is the passthrough's. A dynamic
call's is estimated from the client's tokens (in the provider's count) at the route's prices, as if the
provider had cached the whole previous request (a passthrough's history only grows), read at the
cache-read price, and written the rest (at the cache-write price where there is one): the passthrough at
its cheapest, so the proxy is never credited with a saving that caching would have made anyway. The
proxy's own tool rounds count as calls of the client's (a passthrough would not have made them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.report.traces import TurnSummary

# A provider caches no prefix shorter than this (Anthropic's and OpenAI's smallest).
CACHE_MIN_TOKENS = 1_024


def passthrough_usd(turns: Sequence[TurnSummary]) -> float | None:
    """The session's calls priced as a passthrough (see the module docstring); ``None`` when any is unknown."""
    total, previous = 0.0, 0.0
    for turn in turns:
        if not turn.answered:
            continue
        if turn.mode != "dynamic":
            if turn.cost_usd is None:
                return None
            total += turn.cost_usd
            continue
        estimate = passthrough_estimate(turn, previous)
        if estimate is None:
            return None
        total += estimate[0]
        previous = estimate[1]
    return total


def passthrough_estimate(turn: TurnSummary, previous_client_tokens: float) -> tuple[float, float] | None:
    """A dynamic call's client request priced at its route's prices, and its size in the provider's tokens;
    ``None`` when the prices or the answer's size are unknown.

    The client's request is counted by the proxy's estimator, like the candidate; scaled by what the provider
    counted of the candidate, it is in the provider's tokens, whatever the estimator's error."""
    if turn.prices is None or turn.usage is None or turn.client_tokens is None:
        return None
    prices = turn.prices
    scale = turn.usage.prompt_tokens / turn.candidate_tokens if turn.candidate_tokens else 1.0
    client = turn.client_tokens * scale
    cached = min(previous_client_tokens, client) if prices.cache_read is not None else 0.0
    cached = cached if cached >= CACHE_MIN_TOKENS else 0.0
    fresh = client - cached
    read = prices.cache_read if prices.cache_read is not None else prices.input
    written = prices.cache_write if prices.cache_write is not None else prices.input
    return cached * read + fresh * written + turn.usage.completion_tokens * prices.output, client
