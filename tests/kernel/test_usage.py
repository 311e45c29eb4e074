"""``ProviderUsage``: one reading of OpenAI's and Anthropic's cache figures; an all-zero usage is no usage."""

from __future__ import annotations

from proxy.kernel.usage import ModelPrices, ProviderUsage


def test_openai_and_anthropic_cache_figures_read_alike() -> None:
    openai = ProviderUsage.of(
        {"prompt_tokens": 2_000, "completion_tokens": 10, "prompt_tokens_details": {"cached_tokens": 1_536}}
    )
    anthropic = ProviderUsage.of(
        {
            "prompt_tokens": 2_000,
            "completion_tokens": 10,
            "cache_read_input_tokens": 1_536,
            "cache_creation_input_tokens": 64,
        }
    )
    assert openai == ProviderUsage(2_000, 10, cache_read_tokens=1_536)
    assert anthropic == ProviderUsage(2_000, 10, cache_read_tokens=1_536, cache_write_tokens=64)
    assert anthropic is not None and anthropic.uncached_tokens == 400


def test_a_usage_of_zeros_is_no_usage() -> None:
    """litellm fills an all-zero usage in where the provider said nothing: priced, it would read as free."""
    assert ProviderUsage.of(None) is None
    assert ProviderUsage.of({}) is None
    assert ProviderUsage.of({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}) is None
    assert ProviderUsage.of({"prompt_tokens": 0, "completion_tokens": 3}) == ProviderUsage(0, 3)


def test_cache_reads_and_writes_cost_their_own_prices() -> None:
    prices = ModelPrices(input=1.0, output=4.0, cache_read=0.1, cache_write=1.25)
    usage = ProviderUsage(1_000, 10, cache_read_tokens=800, cache_write_tokens=100)
    assert abs(prices.cost(usage) - (100 * 1.0 + 800 * 0.1 + 100 * 1.25 + 10 * 4.0)) < 1e-9
    assert ModelPrices(input=1.0, output=0.0).cost(usage) == 1_000  # no cache prices: all at the input price
