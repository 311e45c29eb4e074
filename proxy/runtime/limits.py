"""A model's token limits, resolved once per route from the settings, the config and litellm's model map."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from proxy.config import ModelRoute, Settings

# litellm's map does not know custom or self-hosted model names; assume a common modern window and
# say so in the trace (``source``) rather than refusing to serve the model.
FALLBACK_MAX_TOKENS = 128_000
DEFAULT_OUTPUT_RESERVE = 4096

ModelMapLookup = Callable[[str], tuple[int | None, int | None]]  # model -> (max input, max output)


@dataclass(frozen=True)
class ModelLimits:
    """The limits the assembler works within. ``effective_input_tokens`` is what a request may use."""

    model_max_tokens: int
    output_reserve_tokens: int
    context_window_tokens: int | None
    effective_input_tokens: int
    source: str  # where model_max_tokens came from: env, config, model_map, fallback or provider_error

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
    effective = max(1, max_tokens - reserve)
    if settings.context_window_tokens is not None:
        effective = min(effective, settings.context_window_tokens)
    return ModelLimits(
        model_max_tokens=max_tokens,
        output_reserve_tokens=reserve,
        context_window_tokens=settings.context_window_tokens,
        effective_input_tokens=effective,
        source=source,
    )
