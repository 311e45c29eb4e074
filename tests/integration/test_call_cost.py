"""What a call cost, at the client's socket and in its trace: litellm's prices where it has them, and where it
has none, or the provider reported no usage, "unknown", never $0.

The stand-in is the scripted OpenAI provider, which reports ``usage`` like OpenAI (on a stream only when
asked); the routes name a model litellm's cost map prices (``gpt-4o-mini``) and one it does not know.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import litellm

from proxy.kernel.config import ModelRoute
from proxy.provider.science_script import PLANTED_FACT, ScienceModel, is_summary_request
from proxy.provider.scripted import Reply
from tests.integration.test_metrics import run_agent


def route(provider_url: str, name: str, model: str, window: int = 16_000) -> ModelRoute:
    return ModelRoute(
        name,
        {"model": model, "api_base": f"{provider_url}/v1", "api_key": "sk-test-provider"},
        max_input_tokens=window,
        max_output_tokens=2_000,
    )


def traces(data: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((data / "context-traces").rglob("turn-*.json"))]


def test_a_priced_call_costs_its_usage_and_an_unpriced_one_is_unknown(start_proxy, provider, tmp_path) -> None:
    provider.script(lambda body: Reply(content="fine"))
    priced, unpriced = route(provider.url, "mini", "openai/gpt-4o-mini"), route(provider.url, "house", "openai/house")
    proxy = start_proxy(models=(priced, unpriced), trace_enabled=True)
    client = proxy.client()
    usages = {}
    for name in ("mini", "house"):
        answer = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Hello " * 50}], extra_headers={"x-session-id": name}
        )
        usages[name] = answer.usage
    by_session = {t["contextId"]: t for t in traces(tmp_path / "data")}

    info = litellm.get_model_info("openai/gpt-4o-mini")
    mini = by_session["mini"]
    expected = (
        usages["mini"].prompt_tokens * info["input_cost_per_token"]
        + usages["mini"].completion_tokens * info["output_cost_per_token"]
    )
    assert mini["usage"]["promptTokens"] == usages["mini"].prompt_tokens == provider.provider.prompt_tokens[0]
    assert mini["cost"]["usd"] > 0 and abs(mini["cost"]["usd"] - expected) < 1e-12
    assert mini["cost"]["unknown"] == [] and mini["cost"]["summarizerUsd"] == 0

    house = by_session["house"]
    assert house["usage"]["promptTokens"] == usages["house"].prompt_tokens > 0  # billed, at a price nobody knows
    assert house["cost"]["usd"] is None and house["cost"]["prices"] is None
    assert house["cost"]["unknown"] == ["no price for openai/house in litellm's cost map"]


def test_a_stream_without_usage_costs_unknown_not_nothing(start_proxy, provider, tmp_path) -> None:
    """Legacy mode sends the client's request as it is: a stream that did not ask for usage gets none, and the
    provider's silence is not a free call."""
    provider.script(lambda body: Reply(content="streamed answer"))
    proxy = start_proxy(mode="legacy", models=(route(provider.url, "mini", "openai/gpt-4o-mini"),), trace_enabled=True)
    stream = proxy.client().chat.completions.create(
        model="mini", messages=[{"role": "user", "content": "Hi"}], stream=True, extra_headers={"x-session-id": "s"}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "streamed answer"
    assert not any(c.usage for c in chunks)
    assert "stream_options" not in provider.history[0]
    (trace,) = traces(tmp_path / "data")
    assert "usage" not in trace
    assert trace["cost"]["usd"] is None and trace["cost"]["unknown"] == ["the provider reported no usage"]


def test_a_summarizer_without_a_price_makes_the_summary_cost_unknown(start_proxy, provider, tmp_path) -> None:
    """The agent's route is priced, the summarizer's (``SCIENCE_AGENT_SUMMARY_MODEL``) is not: the turns that
    compacted say their summarizer cost is unknown, and still price the agent's own call."""
    steps = 30
    model = ScienceModel(steps)
    provider.script(model, context_window=16_000)
    agent = route(provider.url, "science-model", "openai/gpt-4o-mini", window=8_000)
    summarizer = route(provider.url, "summarizer", "openai/house-summarizer", window=8_000)
    proxy = start_proxy(models=(agent, summarizer), summary_model="summarizer", trace_enabled=True)
    assert PLANTED_FACT in run_agent(proxy.client(), steps, "costly")

    assert model.summaries >= 1
    assert [b["model"] for b in provider.history if is_summary_request(b)] == ["house-summarizer"] * model.summaries
    recorded = traces(tmp_path / "data")
    summarized = [t for t in recorded if t.get("summarizerCalls")]
    assert summarized and all(t["cost"]["summarizerUsd"] is None for t in summarized)
    for trace in summarized:
        assert trace["cost"]["unknown"] == ["no price for openai/house-summarizer in litellm's cost map"]
        assert trace["cost"]["usd"] > 0  # the agent's own call is priced all the same
    plain = [t for t in recorded if not t.get("summarizerCalls")]
    assert plain and all(t["cost"]["summarizerUsd"] == 0 and t["cost"]["unknown"] == [] for t in plain)
