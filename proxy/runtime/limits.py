"""A model's token limits: resolved per route from the settings, the config and litellm's model map, then
corrected for an hour by what a provider states in an overflow error, when the statement is believable.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from proxy.kernel.config import ConfigError, ModelRoute, Settings
from proxy.kernel.errors import InvalidRequest

# litellm's map does not know custom or self-hosted model names; assume a common modern window and
# say so in the trace (``source``) rather than refusing to serve the model.
FALLBACK_MAX_TOKENS = 128_000
DEFAULT_OUTPUT_RESERVE = 4096

ModelMapLookup = Callable[[str], tuple[int | None, int | None]]  # model -> (max input, max output)

# A limit a provider stated is believed for an hour: long enough to stop re-overflowing every turn,
# short enough that a transient or wrong statement (a proxy in front of the provider, a redeploy with a
# larger window) heals without a restart.
LEARNED_LIMIT_SECONDS = 3600.0
# No statement shrinks a window below this many tokens, nor below a quarter of the configured window.
MIN_LEARNED_TOKENS = 1024
# Client model names resolved without a model_list: any string a client sends, so only a few are kept.
UNROUTED_CACHE_SIZE = 32


class ImpossibleLimits(InvalidRequest):
    """The output reserve leaves nothing of the model's window for the input (400 for a request; at
    start-up, for a configured route, a ``ConfigError``)."""

    code = "output_reserve_exceeds_window"


@dataclass(frozen=True)
class ModelLimits:
    """The limits the assembler works within. ``effective_input_tokens`` is what a request may use."""

    model_max_tokens: int
    output_reserve_tokens: int
    context_window_tokens: int | None
    effective_input_tokens: int
    source: str  # where model_max_tokens came from: env, config, model_map, fallback or provider_error

    @property
    def window_tokens(self) -> int:
        """The window compaction's percentages are of: the model's context window, or the operator's
        ``SCIENCE_AGENT_CONTEXT_WINDOW_TOKENS`` when that is smaller (see ``proxy/context/pressure.py``)."""
        if self.context_window_tokens is None:
            return self.model_max_tokens
        return min(self.model_max_tokens, self.context_window_tokens)

    def with_model_max(self, model_max_tokens: int, source: str) -> ModelLimits:
        """These limits for a smaller context window (e.g. one a provider stated in an overflow error)."""
        effective = max(1, model_max_tokens - self.output_reserve_tokens)
        if self.context_window_tokens is not None:
            effective = min(effective, self.context_window_tokens)
        return ModelLimits(model_max_tokens, self.output_reserve_tokens, self.context_window_tokens, effective, source)


def resolve_limits(settings: Settings, route: ModelRoute, lookup: ModelMapLookup) -> ModelLimits:
    """Effective input limit = min(SCIENCE_AGENT_CONTEXT_WINDOW_TOKENS when set, MODEL_MAX_TOKENS - reserve)."""
    mapped_input, mapped_output = (None, None)
    needs_map = settings.model_max_tokens is None or settings.output_reserve_tokens is None
    if needs_map and (route.max_input_tokens is None or route.max_output_tokens is None):
        mapped_input, mapped_output = lookup(route.litellm_model)
    if settings.model_max_tokens is not None:
        max_tokens, source = settings.model_max_tokens, "env"
    elif route.max_input_tokens is not None:
        max_tokens, source = route.max_input_tokens, "config"
    elif mapped_input is not None:
        max_tokens, source = mapped_input, "model_map"
    else:
        max_tokens, source = FALLBACK_MAX_TOKENS, "fallback"
    max_output = route.max_output_tokens or mapped_output
    reserve = settings.output_reserve_tokens or min(DEFAULT_OUTPUT_RESERVE, max_output or DEFAULT_OUTPUT_RESERVE)
    if reserve >= max_tokens:
        # Clamping the input limit to a token would refuse or mangle every request; say why instead.
        given = (
            f"OUTPUT_RESERVE_TOKENS={reserve}"
            if settings.output_reserve_tokens is not None
            else f"the default output reserve ({reserve}; set OUTPUT_RESERVE_TOKENS)"
        )
        window = f"MODEL_MAX_TOKENS={max_tokens}" if source == "env" else f"{max_tokens} tokens, from {source}"
        raise ImpossibleLimits(
            f"{given} is not below the context window of model {route.model_name!r} ({window}): "
            "nothing would be left for the input",
            param="model",
        )
    effective = max_tokens - reserve
    if settings.context_window_tokens is not None:
        effective = min(effective, settings.context_window_tokens)
    return ModelLimits(
        model_max_tokens=max_tokens,
        output_reserve_tokens=reserve,
        context_window_tokens=settings.context_window_tokens,
        effective_input_tokens=effective,
        source=source,
    )


def check_route_limits(settings: Settings, lookup: ModelMapLookup) -> None:
    """Start-up check: every configured route leaves room for input after the output reserve; raises
    ``ConfigError`` naming the reserve and the window."""
    for route in settings.models:
        try:
            resolve_limits(settings, route, lookup)
        except ImpossibleLimits as exc:
            raise ConfigError(exc.message) from None


class RouteLimits:
    """Each route's limits, and the smaller windows providers stated in believable overflow errors.

    The window learned is the stated one, raised to the floor ``max(MIN_LEARNED_TOKENS, configured
    window / 4)``; it is learned only when it is consistent with the request that overflowed (below the
    estimated size of what was sent: an error that cannot be true of that request teaches nothing),
    only for a route of the operator's ``model_list`` (client-chosen model names must not grow state),
    and for ``LEARNED_LIMIT_SECONDS``.
    """

    def __init__(self, settings: Settings, lookup: ModelMapLookup, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._lookup = lookup
        self._clock = clock
        self._configured = {route.model_name for route in settings.models}
        self._resolved: dict[str, ModelLimits] = {}  # routes of the model_list: bounded by it
        self._unrouted: OrderedDict[str, ModelLimits] = OrderedDict()
        self._learned: dict[str, tuple[int, float]] = {}  # route name -> (model max tokens, expiry)

    def get(self, route: ModelRoute) -> ModelLimits:
        """The route's limits now: the configured ones, or a learned smaller window until it expires."""
        base = self._base(route)
        learned = self._learned.get(route.model_name)
        if learned is None:
            return base
        limit, expires_at = learned
        if self._clock() >= expires_at:
            del self._learned[route.model_name]
            return base
        return base.with_model_max(limit, source="provider_error")

    def learn(self, route: ModelRoute, stated: int | None, sent_tokens: int | None) -> bool:
        """Remember a window a provider stated after ``sent_tokens`` (estimated) overflowed it; True
        when the route's limit is now smaller."""
        if stated is None or sent_tokens is None or route.model_name not in self._configured:
            return False
        base = self._base(route)
        limit = max(stated, MIN_LEARNED_TOKENS, base.model_max_tokens // 4)
        if limit <= base.output_reserve_tokens:
            return False  # a window the reserve fills leaves no input: believing it would refuse every request
        if limit >= sent_tokens:
            return False  # that request fits the window to learn: the statement cannot be about it
        if limit >= self.get(route).model_max_tokens:
            return False
        self._learned[route.model_name] = (limit, self._clock() + LEARNED_LIMIT_SECONDS)
        return True

    def _base(self, route: ModelRoute) -> ModelLimits:
        configured = route.model_name in self._configured
        cache = self._resolved if configured else self._unrouted
        limits = cache.get(route.model_name)
        if limits is None:
            limits = cache[route.model_name] = resolve_limits(self._settings, route, self._lookup)
            if len(self._unrouted) > UNROUTED_CACHE_SIZE:
                self._unrouted.popitem(last=False)  # the oldest client-chosen name
        return limits
