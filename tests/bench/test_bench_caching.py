"""Part 9 at a tiny size: the caching stand-ins bill a compacting session through the proxy and straight to them."""

from __future__ import annotations

from bench.caching import run_caching
from bench.report import render_markdown

MACHINE = {"cpu": "x", "cores": 2, "platform": "p", "python": "3", "litellm": "1", "commit": "c"}


def test_the_caching_part_measures_both_paths_under_both_rules() -> None:
    result = run_caching(steps=8, window=16_000)
    for rules in result["rules"].values():
        proxy, passthrough = rules["proxy"], rules["passthrough"]
        assert rules["client_calls"]["proxy"] == rules["client_calls"]["passthrough"] == 9
        assert proxy["requests"] >= 9 and passthrough["requests"] == 9
        # The passthrough only appends: after its first call, nearly all it sends was cached.
        assert passthrough["cache_read_share"] > 0.7 and passthrough["caching_saves"] > 0.5
        # The proxy compacted (fewer tokens), and its calls still read the cache.
        assert proxy["prompt_tokens"] < passthrough["prompt_tokens"] and proxy["cache_read_tokens"] > 0
        assert (
            proxy["prompt_tokens"]
            == proxy["cache_read_tokens"] + proxy["cache_write_tokens"] + proxy["uncached_tokens"]
        )
        assert 0 < rules["proxy_vs_passthrough"] < 1.5
    assert result["rules"]["anthropic_messages"]["proxy"]["cache_write_tokens"] > 0
    assert result["rules"]["openai_responses"]["proxy"]["cache_write_tokens"] == 0  # OpenAI bills no writes
    page = render_markdown({"date": "d", "quick": True, "plan": {}, "machine": MACHINE, "parts": {"caching": result}})
    assert "## 9. Prompt caching: 8 steps" in page and "proxy / passthrough" in page
    assert "(n/a: fewer than 100 steps)" in page  # the goal is judged on its own run only


def test_the_caching_part_judges_the_uncompacted_turns_and_the_turns_passthrough_fits() -> None:
    """Issue 38's other two goals have figures of their own: cache reads on turns the proxy did not compact
    (read from its traces), and the cost ratio over the calls where the passthrough still fit the window."""
    result = run_caching(8, window=16_000)
    for rules in result["rules"].values():
        share = rules["uncompacted_read_share"]
        assert 0 < share["turns"] < 10 and 0 < share["share"] < 1
        fits = rules["while_passthrough_fits"]
        assert 0 < fits["client_calls"] <= rules["client_calls"]["passthrough"] and fits["ratio"] > 0
    page = render_markdown({"date": "d", "quick": True, "plan": {}, "machine": MACHINE, "parts": {"caching": result}})
    assert "turns the proxy did not compact" in page and "while passthrough fits the window" in page
