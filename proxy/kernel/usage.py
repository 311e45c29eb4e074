"""What a model call cost: the provider's usage with its prompt-cache figures, priced at the route's prices.

Providers report caching differently and litellm keeps both forms in the chat usage: OpenAI counts cached
input inside ``prompt_tokens`` and names it in ``prompt_tokens_details.cached_tokens``; Anthropic bills a
cache read (a tenth of an input token) and a cache write (1.25x) apart, ``cache_read_input_tokens`` and
``cache_creation_input_tokens`` beside a ``prompt_tokens`` that litellm (and the native codecs) make the sum
of all three. ``ProviderUsage`` is the one reading of both; the trace, ``/metrics``, the spans and the
report take it from here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ProviderUsage:
    """A call's tokens as the provider billed them: every input token, of which read from and written to its
    prompt cache, and the output (of which reasoning)."""

    prompt_tokens: int
    completion_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def uncached_tokens(self) -> int:
        """Input billed at the full input price."""
        return max(0, self.prompt_tokens - self.cache_read_tokens - self.cache_write_tokens)

    @classmethod
    def of(cls, usage: Mapping[str, Any] | Any) -> ProviderUsage | None:
        """The reading of a chat-form usage (a dict, or litellm's object); ``None`` when there is none.

        A usage whose every figure is zero is none: litellm fills an all-zero usage in where the provider
        reported nothing (a stream the client did not ask usage of), and no model answers from no input,
        so pricing it would state a cost of $0 that nobody knows."""
        if usage is None:
            return None
        get: Callable[[str], Any] = usage.get if isinstance(usage, Mapping) else lambda key: getattr(usage, key, None)
        prompt_details = _mapping(get("prompt_tokens_details"))
        completion_details = _mapping(get("completion_tokens_details"))
        read = _int(get("cache_read_input_tokens")) or _int(prompt_details.get("cached_tokens"))
        write = _int(get("cache_creation_input_tokens")) or _int(prompt_details.get("cache_write_tokens"))
        reading = cls(
            prompt_tokens=_int(get("prompt_tokens")),
            completion_tokens=_int(get("completion_tokens")),
            cache_read_tokens=read,
            cache_write_tokens=write,
            reasoning_tokens=_int(completion_details.get("reasoning_tokens")),
        )
        return None if reading == _NOTHING else reading


_NOTHING = ProviderUsage(0, 0)


@dataclass(frozen=True)
class ModelPrices:
    """Dollars per token (litellm's model cost map): input, output, and a cache read and write where the
    provider bills them apart (else at the input price)."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None

    def cost(self, usage: ProviderUsage) -> float:
        """What ``usage`` costs at these prices."""
        read = self.cache_read if self.cache_read is not None else self.input
        write = self.cache_write if self.cache_write is not None else self.input
        return (
            usage.uncached_tokens * self.input
            + usage.cache_read_tokens * read
            + usage.cache_write_tokens * write
            + usage.completion_tokens * self.output
        )


# The prices of a litellm model string, or None where the cost map does not know it.
PriceLookup = Callable[[str], ModelPrices | None]


def no_prices(model: str) -> ModelPrices | None:
    """A ``PriceLookup`` that knows no model (a backend without a cost map)."""
    return None


def _mapping(value: Any) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    dumped = getattr(value, "__dict__", None)
    return dumped if isinstance(dumped, Mapping) else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
