"""Benchmark the pure stages of context assembly against history length, cold and warm.

Run: ``.venv/bin/python bench/assembly.py [--repeats N] [--sizes 10,100,1000,5000]``

Stages timed together: budget admission, rendering, estimating the fixed parts, the window, the
composer and the validator (collection runs once outside the clock: its cost is the contributors').
*cold* uses a fresh estimator cache; *warm* fills the cache with the previous turn (the same history
minus its last message), which is what a running session sees. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from proxy.process.offline import prepare_offline_environment

prepare_offline_environment()

from proxy.context import (  # noqa: E402 - the offline environment must be set before tiktoken loads
    AtomicHistoryWindowPolicy,
    CachingEstimator,
    Collection,
    ConservativeTokenEstimator,
    ContextContributorRegistry,
    ContextValidator,
    ContributionRequest,
    ContributorOutput,
    DefaultContextMessageComposer,
    DeterministicSystemPromptRenderer,
    Section,
    apply_context_budget,
    collect_detailed,
)
from proxy.context.types import Attachment, ContextMessage, Scope, TokenEstimator  # noqa: E402

LIMIT_TOKENS = 400_000
PROMPT_BUDGET = 8_000
MESSAGE_BUDGET = 8_000
NONCE = "0123456789abcdef"  # any framing nonce: it costs the same as a session's
ZH = (
    "在本研究中我们提出了一种基于深度学习的蛋白质结构预测方法实验结果表明该方法在多个基准数据集上均取得了显著的性能提升"
)
EN = ["We", "measured", "the", "reaction", "yield", "at", "298", "K", "and", "310", "K;", "the", "catalyst"]
EN += ["loading", "was", "2.5", "mol%", "(see", "Table", "3).", "温度", "p=0.03"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": "Run an analysis step on the stored dataset and return a JSON summary.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    }
    for i in range(12)
]


def text(rng: random.Random, size: int) -> str:
    words = [rng.choice(EN) if rng.random() < 0.6 else ZH[rng.randrange(0, len(ZH) - 8) :][:8] for _ in range(size)]
    return " ".join(words)


def make_history(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """A research-agent transcript of exactly ``n`` messages: user turns, answers, parallel tool steps."""
    rng = random.Random(seed)
    history: list[dict[str, Any]] = [{"role": "user", "content": "Task: " + text(rng, 80)}]
    call = 0
    while len(history) < n - 1:
        roll = rng.random()
        if roll < 0.6 and len(history) + 3 <= n - 1:
            ids = [f"call_{call + k}" for k in range(rng.randint(1, 2))]
            call += len(ids)
            calls = [
                {"id": i, "type": "function", "function": {"name": "tool_1", "arguments": '{"query": "yield"}'}}
                for i in ids
            ]
            history.append({"role": "assistant", "content": None, "tool_calls": calls})
            history += [{"role": "tool", "tool_call_id": i, "content": text(rng, rng.randint(20, 400))} for i in ids]
        elif roll < 0.8:
            history.append({"role": "assistant", "content": text(rng, rng.randint(10, 150))})
        else:
            history.append({"role": "user", "content": text(rng, rng.randint(5, 60))})
    # A tool step only starts when it fits, so this is exactly n messages; ending on a user message makes
    # history[:-1] the previous turn's (valid) request.
    history.append({"role": "user", "content": "Continue: " + text(rng, 20)})
    return history


class StaticContributor:
    """A contributor with fixed output, standing in for identity, governance and plan."""

    def __init__(self, cid: str, output: ContributorOutput, protected: bool = False) -> None:
        self.id = cid
        self.scopes: frozenset[Scope] = frozenset({"main"})
        self.protected = protected
        self._output = output

    async def contribute(self, request: ContributionRequest) -> ContributorOutput:
        return self._output

    def create(self, scope: Scope) -> StaticContributor:
        return self


def collection() -> Collection:
    sections = (Section("identity", "You are a careful research agent. " * 20, slot=0, protected=True),)
    governance = (
        Section("governance", "Never fabricate evidence. Cite stored outputs. " * 30, slot=1, protected=True),
    )
    plan = ContributorOutput(
        messages=(ContextMessage("plan.state", "Step 3 of 7: compare yields at 298 K and 310 K."),),
        attachments=(Attachment("plan.notes", "</context> notes " * 40, "untrusted_data"),),
    )
    registry = ContextContributorRegistry(
        "main",
        [
            StaticContributor("identity", ContributorOutput(sections=sections), protected=True),
            StaticContributor("governance", ContributorOutput(sections=governance), protected=True),
            StaticContributor("plan", plan),
        ],
    )
    return asyncio.run(collect_detailed(registry, ContributionRequest(scope="main", context_id="bench")))


def assemble(
    history: list[dict[str, Any]], collected: Collection, estimator: TokenEstimator, limit: int = LIMIT_TOKENS
) -> int:
    """One turn's pure stages; returns the validated estimate."""
    admitted = apply_context_budget(collected, PROMPT_BUDGET, MESSAGE_BUDGET, estimator, nonce=NONCE)
    prompt = DeterministicSystemPromptRenderer().render(admitted.sections)
    composer = DefaultContextMessageComposer()
    hidden = composer.hidden_messages(admitted.messages, admitted.attachments, nonce=NONCE)
    fixed = (
        estimator.count_message({"role": "system", "content": prompt.text})
        + estimator.count_tools(TOOLS)
        + sum(estimator.count_message(m) for m in hidden)
    )
    window = AtomicHistoryWindowPolicy().apply(history, limit_tokens=limit - fixed, estimator=estimator)
    composed = composer.compose(
        prompt.text,
        window.messages,
        admitted.messages,
        admitted.attachments,
        nonce=NONCE,
        section_ids=prompt.section_ids,
    )
    return ContextValidator().validate(composed, limit_tokens=limit, estimator=estimator, nonce=NONCE, tools=TOOLS)


def median_ms(run: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sizes", default="10,100,1000,5000")
    parser.add_argument("--limit", type=int, default=LIMIT_TOKENS, help="effective input limit in tokens")
    args = parser.parse_args()
    collected = collection()
    print("| messages | chars | cold ms | warm ms | warm µs/message | kept | estimate (tokens) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in (int(s) for s in args.sizes.split(",")):
        history = make_history(n)
        chars = sum(len(str(m.get("content") or "")) for m in history)
        cold = median_ms(
            lambda h=history: assemble(h, collected, CachingEstimator(ConservativeTokenEstimator()), args.limit),
            args.repeats,
        )
        warm_estimators: list[CachingEstimator] = []
        for _ in range(args.repeats):
            warm = CachingEstimator(ConservativeTokenEstimator())
            assemble(history[:-1], collected, warm, args.limit)  # the previous turn filled the cache
            warm_estimators.append(warm)
        pool = iter(warm_estimators)
        warm_ms = median_ms(lambda h=history, p=pool: assemble(h, collected, next(p), args.limit), args.repeats)
        estimate = assemble(history, collected, CachingEstimator(ConservativeTokenEstimator()), args.limit)
        kept = AtomicHistoryWindowPolicy().apply(
            history, limit_tokens=args.limit, estimator=ConservativeTokenEstimator()
        )
        print(
            f"| {len(history):,} | {chars:,} | {cold:.1f} | {warm_ms:.2f} | {warm_ms * 1000 / len(history):.1f} "
            f"| {kept.statistics.kept_messages:,} | {estimate:,} |"
        )


if __name__ == "__main__":
    main()
