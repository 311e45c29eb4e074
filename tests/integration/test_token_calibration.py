"""Token counts calibrated from the provider's usage, through real HTTP (issue 14).

The scripted provider counts as a tokenizer that gives 1.3x or 0.8x tiktoken's count, reports that
count as ``usage.prompt_tokens`` and refuses a request over its window with an overflow error. The
proxy learns the route's ratio from the answers and fills the window it was given.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from proxy.kernel.config import ModelRoute
from proxy.provider.science_script import PLANTED_FACT, TOOLS, ScienceModel, is_summary_request, tool_output
from proxy.provider.scripted import Reply
from proxy.session import open_store
from tests.integration.conftest import route_to

WINDOW = 16_000
STEPS = 60


def _route(provider_url: str, window: int = WINDOW, max_output: int = 2_000) -> ModelRoute:
    return route_to(provider_url, "calibrated-model", window=window, max_output=max_output)


def mixed_output(step: int, output_bytes: int = 12_000) -> str:
    """A realistic ~12 KB tool output (about 3,000 tiktoken tokens): prose, Python, JSON records and a
    few log lines in turn, its step first; step 1 hides the fact."""
    rng = random.Random(step)
    words = [
        "the",
        "sample",
        "was",
        "heated",
        "slowly",
        "while",
        "the",
        "detector",
        "recorded",
        "a",
        "stable",
        "baseline",
        "and",
        "no",
        "drift",
    ]
    blocks = [f"step={step} measurement log"]
    while sum(len(b) + 1 for b in blocks) < output_bytes:
        kind = len(blocks) % 4
        if kind == 0:
            blocks.append(" ".join(rng.choice(words) for _ in range(60)).capitalize() + ".")
        elif kind == 1:
            name = rng.choice(["fit_curve", "load_run", "normalise", "check_drift"])
            blocks.append(
                f"def {name}(values, window={rng.randint(2, 9)}):\n"
                f"    total = sum(values[-window:])\n    return total / max(len(values), 1)\n"
            )
        elif kind == 2:
            record = {
                "run": f"r-{step}-{len(blocks)}",
                "ok": rng.random() < 0.9,
                "temp_c": round(rng.uniform(20, 80), 2),
            }
            blocks.append(json.dumps(record))
        else:
            blocks.append(f"{step:03d}.{len(blocks):04d} I={rng.uniform(0, 1):.4f}A ok")
        if step == 1 and len(blocks) == 20:
            blocks.append(PLANTED_FACT)
    return "\n".join(blocks)


def _run(client: Any, steps: int, session: str, stream: bool, output: Callable[[int], str] = tool_output) -> int:
    """The agent loop of a 60-step protocol; returns the turns it took."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an autonomous lab agent. Run the protocol step by step."},
        {"role": "user", "content": f"Run the {steps}-step calibration protocol, then report the calibration fact."},
    ]
    for turn in range(1, steps + 5):
        kwargs = {"model": "calibrated-model", "messages": messages, "tools": TOOLS}
        if stream:
            chunks = list(
                client.chat.completions.create(stream=True, extra_headers={"x-session-id": session}, **kwargs)
            )
            # The proxy asked for usage itself; a client that did not must not get a usage chunk.
            assert all(c.usage is None for c in chunks)
            calls: dict[int, dict[str, Any]] = {}
            for c in chunks:
                for delta in (c.choices[0].delta.tool_calls or []) if c.choices else []:
                    slot = calls.setdefault(
                        delta.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                    slot["id"] = delta.id or slot["id"]
                    slot["function"]["name"] += delta.function.name or ""
                    slot["function"]["arguments"] += delta.function.arguments or ""
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            message = {"role": "assistant", "content": content or None, "tool_calls": list(calls.values()) or None}
        else:
            completion = client.chat.completions.create(extra_headers={"x-session-id": session}, **kwargs)
            message = completion.choices[0].message.model_dump(exclude_none=True)
        message = {k: v for k, v in message.items() if v is not None}
        messages.append(message)
        if not message.get("tool_calls"):
            return turn
        for call in message["tool_calls"]:
            step = int(json.loads(call["function"]["arguments"])["step"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output(step)})
    raise AssertionError("the agent did not finish")


def _peak_run(
    start_proxy, provider, scale: float, stream: bool, estimator: str, output: Callable[[int], str] = tool_output
) -> tuple[int, list[int], Any]:
    """Run the 60-step protocol against a provider counting ``scale`` x tiktoken; the largest agent
    request it accepted, every request's count, and the proxy."""
    model = ScienceModel(STEPS)
    provider.provider.history.clear()
    provider.provider.prompt_tokens.clear()
    provider.script(model, context_window=WINDOW)
    provider.provider.token_scale = scale
    proxy = start_proxy(mode="dynamic", models=(_route(provider.url),), trace_enabled=True, estimator=estimator)
    _run(proxy.client(), STEPS, f"{estimator}-{scale}", stream, output)
    counts = list(provider.provider.prompt_tokens)
    bodies = list(provider.history)
    peak = max(t for body, t in zip(bodies, counts, strict=True) if not is_summary_request(body) and t <= WINDOW)
    return peak, counts, proxy


@pytest.mark.parametrize(("scale", "stream"), [(1.3, False), (0.8, True)])
def test_a_calibrated_run_fills_more_of_the_window_and_overflows_at_most_once(start_proxy, provider, scale, stream):
    peak, counts, proxy = _peak_run(start_proxy, provider, scale, stream, "calibrated")

    overflows = [i for i, tokens in enumerate(counts) if tokens > WINDOW]
    assert len(overflows) <= 1, f"overflowed at requests {overflows}"
    assert all(tokens <= WINDOW for tokens in counts[(overflows[0] + 1 if overflows else 0) :])
    print(f"\nscale {scale}: peak {peak:,} of {WINDOW:,} ({peak / WINDOW:.0%})")
    # Each 12 KB output of numbered log lines is ~7,400 tiktoken tokens (46% of the window at 1x, 60% at
    # 1.3x): one output and the next never fit the 12,800-token threshold together at 1.3x, so the peak is
    # one output with the checkpoint and previews around it; the realistic outputs below are the 70% proof.
    assert peak >= 0.4 * WINDOW
    # Every answer taught the route: the last trace shows a ratio near the provider's scale and a margin
    # from the spread, not the start margin.
    traces = sorted(proxy.settings.resolved_trace_dir.glob("*/turn-*.json"))
    estimator = json.loads(traces[-1].read_text())["budgets"]["estimator"]
    assert estimator["name"] == "calibrated" and estimator["samples"] >= 30
    assert scale * 0.9 <= estimator["ratio"] <= scale * 1.1
    assert 1.0 <= estimator["margin"] <= 1.1


def test_a_fresh_proxy_serves_a_20k_system_prompt_in_a_128k_window(start_proxy, provider):
    # About 20,000 tiktoken tokens of a coding agent's instructions: counted by the conservative estimator
    # at ~38,000, over the prompt's 25% budget of 124,000, it was refused with context_assembly_failed.
    prompt = " ".join(f"Rule {i}: keep the change focused and explain why in the commit message." for i in range(1_300))
    provider.script(lambda body: Reply(content="ok"))
    proxy = start_proxy(mode="dynamic", models=(_route(provider.url, window=128_000, max_output=4_000),))

    completion = proxy.client().chat.completions.create(
        model="calibrated-model",
        messages=[{"role": "system", "content": prompt}, {"role": "user", "content": "Start."}],
    )

    assert completion.choices[0].message.content == "ok"
    sent = provider.history[-1]["messages"]
    assert prompt in sent[0]["content"]  # the whole prompt, not a cut one


async def test_calibration_survives_a_restart(start_proxy, provider):
    provider.script(lambda body: Reply(content="ok"))
    provider.provider.token_scale = 1.3
    proxy = start_proxy(mode="dynamic", models=(_route(provider.url),))
    client = proxy.client()
    for index in range(3):
        client.chat.completions.create(
            model="calibrated-model",
            messages=[{"role": "user", "content": f"question {index}: " + "describe the titration curve. " * 200}],
        )
    proxy.stop()

    store = open_store(None, proxy.settings.data_dir, 5)
    await store.open()
    try:
        stored = await store.calibration("route:calibrated-model")
    finally:
        await store.close()
    assert stored is not None and len(stored["samples"]) == 3
    assert all(1.2 <= ratio <= 1.4 for ratio in stored["samples"])


@pytest.mark.parametrize(("scale", "stream"), [(1.3, False), (0.8, True)])
def test_with_realistic_outputs_the_peak_reaches_70_percent_of_the_window(start_proxy, provider, scale, stream):
    """The issue's proof: a 60-step run with realistic ~12 KB outputs (prose, code, JSON: ~2,900 tiktoken
    tokens each) in a 16,000-token window peaks at 70% of the window or more, with at most one overflow.

    The pressure threshold is 80% of the window (12,800 tokens), capped at the effective input limit
    (16,000 - 2,000 output reserve). It used to be 80% of that limit, 11,200 tokens, exactly 70% of the
    window: the reserve was subtracted twice, and since a sound estimate errs high no request ever
    reached 70% (measured 66.1% at 1.3x and 68.7% at 0.8x). Now the largest request sent is the last one
    under 12,800 / margin (~1.02), less up to one step (~3,800 tokens at 1.3x), over many cycles.
    """
    peak, counts, _ = _peak_run(start_proxy, provider, scale, stream, "calibrated", mixed_output)

    overflows = [i for i, tokens in enumerate(counts) if tokens > WINDOW]
    assert len(overflows) <= 1, f"overflowed at requests {overflows}"
    assert all(tokens <= WINDOW for tokens in counts[(overflows[0] + 1 if overflows else 0) :])
    print(
        f"\nrealistic outputs, scale {scale}: peak {peak:,} of {WINDOW:,} ({peak / WINDOW:.1%}), overflows {overflows}"
    )
    assert peak >= 0.70 * WINDOW
    # Never above the effective input limit the output reserve leaves (a request counted by the provider).
    assert peak <= WINDOW - 2_000
