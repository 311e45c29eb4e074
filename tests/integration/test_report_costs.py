"""The report's cache share and cost per session, against what the client was told.

Two Claude Code-style sessions (Messages, its rolling marks) through the proxy to the Anthropic stand-in, which
caches and bills like Anthropic: one on a model litellm prices, one on a model it does not. The report, written
by the CLI, must show the first session's cache share and cost as the client's own usage figures give them
(at litellm's prices), an estimated passthrough cost beside it, and "unknown", not $0, for the second.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import litellm
import pytest

from proxy.app import create_app
from proxy.cli import main as cli
from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.science_script import tool_output
from proxy.provider.scripted import serve_in_thread
from proxy.provider.scripted_anthropic import DEFAULT_API_KEY, ScriptedAnthropic
from tests.integration.test_prompt_cache import SYSTEM, TOOLS, script, with_rolling_marks
from tests.integration.test_report_page import _embedded, _Overview

PRICED = "anthropic/claude-sonnet-4-5"


@pytest.fixture
def stand_in() -> Iterator[tuple[ScriptedAnthropic, str]]:
    provider = ScriptedAnthropic(script, accept_bearer=False)
    with serve_in_thread(provider.app()) as url:
        yield provider, url


def run(sdk: anthropic.Anthropic, model: str, session: str) -> list[Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Calibrate."}]}]
    usages = []
    for _ in range(12):
        answer = sdk.messages.create(
            model=model,
            max_tokens=1000,
            system=SYSTEM,
            messages=with_rolling_marks(messages),
            tools=TOOLS,
            extra_headers={"x-session-id": session},
        )
        usages.append(answer.usage)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]})
        calls = [b for b in answer.content if b.type == "tool_use"]
        if not calls:
            return usages
        results = [
            {"type": "tool_result", "tool_use_id": c.id, "content": tool_output(c.input["step"], 6_000)} for c in calls
        ]
        messages.append({"role": "user", "content": results})
    raise AssertionError("the agent did not finish")


def test_the_report_shows_cache_share_and_cost_per_session(stand_in, tmp_path: Path) -> None:
    provider, url = stand_in
    routes = tuple(
        ModelRoute(name, {"model": model, "api_base": url, "api_key": DEFAULT_API_KEY}, 200_000, 4_000)
        for name, model in (("claude", PRICED), ("house", "anthropic/claude-house"))
    )
    settings = Settings(data_dir=tmp_path / "data", models=routes, trace_enabled=True)
    with serve_in_thread(create_app(settings)) as proxy, anthropic.Anthropic(base_url=proxy, api_key="x") as sdk:
        priced = run(sdk, "claude", "priced-run")
        unpriced = run(sdk, "house", "unpriced-run")
    sent = [r.body for r in provider.requests if r.path == "/v1/messages"]
    assert [b["model"] for b in sent] == ["claude-sonnet-4-5"] * len(priced) + ["claude-house"] * len(unpriced)
    out = tmp_path / "report.html"
    assert cli(["report", "--traces", str(tmp_path / "data" / "context-traces"), "--out", str(out)]) == 0
    page = out.read_text()
    shown = {s["contextId"]: s for s in _embedded(page)["sessions"]}
    cells = _Overview()
    cells.feed(page)

    # The cache share: what the provider read from its cache, of every input token it billed.
    reads = sum(u.cache_read_input_tokens or 0 for u in priced)
    writes = sum(u.cache_creation_input_tokens or 0 for u in priced)
    prompt = sum(u.input_tokens for u in priced) + reads + writes
    assert reads > 0 and shown["priced-run"]["cacheShare"] == reads / prompt
    assert cells.rows["priced-run"]["cacheShare"] == f"{reads / prompt:.1%}"
    # The cost: the client's usage at litellm's prices.
    info = litellm.get_model_info(PRICED)
    cost = sum(
        u.input_tokens * info["input_cost_per_token"]
        + (u.cache_read_input_tokens or 0) * info["cache_read_input_token_cost"]
        + (u.cache_creation_input_tokens or 0) * info["cache_creation_input_token_cost"]
        + u.output_tokens * info["output_cost_per_token"]
        for u in priced
    )
    assert abs(shown["priced-run"]["costUsd"] - cost) < 1e-9 and shown["priced-run"]["unpricedCalls"] == 0
    assert cells.rows["priced-run"]["costUsd"] == f"${cost:,.4f}"
    # Nothing outgrew the window: the proxy sent what the client sent, so the passthrough estimate (the client's
    # requests in the provider's count, each reading the one before from the cache) is what the calls cost.
    assert abs(shown["priced-run"]["passthroughUsd"] - cost) < 0.05 * cost
    assert cells.rows["priced-run"]["passthroughUsd"] == f"${shown['priced-run']['passthroughUsd']:,.4f}"
    turns = shown["priced-run"]["turns"]
    assert [t["cacheReadTokens"] for t in turns] == [u.cache_read_input_tokens or 0 for u in priced]

    # A model litellm has no price for: the session's cost is unknown, never $0.
    assert sum(u.cache_read_input_tokens or 0 for u in unpriced) > 0
    assert shown["unpriced-run"]["costUsd"] is None and shown["unpriced-run"]["unpricedCalls"] == len(unpriced)
    assert shown["unpriced-run"]["passthroughUsd"] is None
    assert cells.rows["unpriced-run"]["costUsd"] == "unknown" == cells.rows["unpriced-run"]["passthroughUsd"]
    assert all(t["costUsd"] is None for t in shown["unpriced-run"]["turns"])
    traces = [json.loads(p.read_text()) for p in (tmp_path / "data" / "context-traces").rglob("turn-*.json")]
    assert all(t["cost"]["usd"] is None for t in traces if t["contextId"] == "unpriced-run")
