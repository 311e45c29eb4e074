"""Part 4: the conservative estimator against tiktoken on research text, JSON and code; and the
calibrated estimator against simulated providers that count 1.3x and 0.8x tiktoken.

Cases: every paragraph and the whole of each corpus document (``bench/corpus/``: a Chinese and an
English design text), generated JSON records mixing Chinese and English, and stdlib Python modules
(whole files and 2 KB slices). For each encoding: how many cases the estimate is *under* the real
count (the goal is none), the mean over-count ratio, and throughput in MB/s of UTF-8 input.
"""

from __future__ import annotations

import inspect
import json
import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.process.offline import prepare_offline_environment

CORPUS = Path(__file__).resolve().parent / "corpus"
ENCODINGS = ("cl100k_base", "o200k_base")


def _documents() -> dict[str, str]:
    return {
        path.name: path.read_text(encoding="utf-8")
        for path in sorted(CORPUS.glob("*"))
        if path.suffix in (".md", ".txt")
    }


def _json_cases(rng: random.Random, count: int) -> list[str]:
    words = ["蛋白质", "结构", "预测", "yield", "catalyst", "温度", "K", "mol%", "样本", "reference", "实验", "p-value"]
    cases = []
    for index in range(count):
        record = {
            "id": f"run-{index:04d}",
            "sample": rng.choice(words) + "-" + str(rng.randint(1, 999)),
            "measurements": [round(rng.uniform(-1e3, 1e3), rng.randint(0, 6)) for _ in range(rng.randint(3, 40))],
            "notes": " ".join(rng.choice(words) for _ in range(rng.randint(5, 60))),
            "tags": {rng.choice(words): rng.random() < 0.5 for _ in range(5)},
            "sha": f"{rng.getrandbits(160):040x}",
        }
        cases.append(json.dumps(record, ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, 2])))
    return cases


def _code_cases() -> list[str]:
    import asyncio.base_events
    import email.message
    import json.decoder
    import statistics as stats_module
    import textwrap

    cases = []
    for module in (asyncio.base_events, email.message, json.decoder, stats_module, textwrap):
        source = inspect.getsource(module)
        cases.append(source)
        cases += [source[start : start + 2048] for start in range(0, len(source), 2048)]
    return cases


def corpus_cases(quick: bool = False) -> dict[str, list[str]]:
    """The cases by kind: ``research`` (zh/en paragraphs and whole documents), ``json``, ``code``."""
    research = []
    for text in _documents().values():
        research.append(text)
        research += [p for p in text.split("\n\n") if p.strip()]
    cases = {"research": research, "json": _json_cases(random.Random(11), 40 if quick else 300), "code": _code_cases()}
    if quick:
        cases["code"] = cases["code"][:30]
    return cases


def _throughput_mb_s(count: Callable[[str], int], texts: list[str], budget_s: float) -> float:
    total_bytes = sum(len(t.encode("utf-8")) for t in texts)
    rounds, started = 0, time.perf_counter()
    while True:
        for text in texts:
            count(text)
        rounds += 1
        elapsed = time.perf_counter() - started
        if elapsed >= budget_s:
            return round(total_bytes * rounds / elapsed / 1e6, 2)


def run_estimator(quick: bool = False) -> dict[str, Any]:
    """Accuracy and speed of ``ConservativeTokenEstimator`` against both tiktoken encodings."""
    prepare_offline_environment()
    import tiktoken

    from proxy.context.estimators import ConservativeTokenEstimator

    estimator = ConservativeTokenEstimator()
    encoders = {name: tiktoken.get_encoding(name) for name in ENCODINGS}
    cases = corpus_cases(quick)
    kinds: dict[str, Any] = {}
    for kind, texts in cases.items():
        entry: dict[str, Any] = {"cases": len(texts), "bytes": sum(len(t.encode()) for t in texts)}
        estimates = [estimator.count_text(t) for t in texts]
        for name, encoder in encoders.items():
            real = [len(encoder.encode(t, disallowed_special=())) for t in texts]
            ratios = [e / r for e, r in zip(estimates, real, strict=True) if r]
            under = [i for i, (e, r) in enumerate(zip(estimates, real, strict=True)) if e < r]
            entry[name] = {
                "under": len(under),
                "mean_over_ratio": round(sum(ratios) / len(ratios), 3),
                "min_ratio": round(min(ratios), 3),
                "max_ratio": round(max(ratios), 3),
                "tokens": sum(real),
            }
            if under:  # the worst case, so a regression can be reproduced from the report
                worst = min(under, key=lambda i: estimates[i] / real[i])
                entry[name]["worst_under"] = {
                    "estimate": estimates[worst],
                    "real": real[worst],
                    "text": texts[worst][:300],
                }
        entry["estimate_tokens"] = sum(estimates)
        kinds[kind] = entry
    everything = [t for texts in cases.values() for t in texts]
    budget = 0.3 if quick else 1.5
    speed = {"conservative": _throughput_mb_s(estimator.count_text, everything, budget)}
    for name, encoder in encoders.items():
        speed[f"tiktoken_{name}"] = _throughput_mb_s(
            lambda t, e=encoder: len(e.encode(t, disallowed_special=())), everything, budget
        )
    return {
        "kinds": kinds,
        "throughput_mb_s": speed,
        "never_under": all(kinds[k][n]["under"] == 0 for k in kinds for n in ENCODINGS),
        "calibrated": run_calibrated(cases, quick),
    }


SCALES = (1.3, 0.8)


# A tool result of the calibrated section is at least this long: a request of a few research paragraphs
# (most under 100 tokens) stays below the calibration's MIN_SAMPLE_TOKENS, so it would neither teach the
# route nor be judged, and a corpus of short cases reported nothing.
TOOL_RESULT_CHARS = 4_000


def tool_results(texts: list[str]) -> list[str]:
    """The cases as tool results of a realistic size: consecutive short cases joined (blank line between)
    until each is at least ``TOOL_RESULT_CHARS`` long; long cases (whole documents, files) stay whole."""
    results, pending = [], ""
    for text in texts:
        pending = f"{pending}\n\n{text}" if pending else text
        if len(pending) >= TOOL_RESULT_CHARS:
            results.append(pending)
            pending = ""
    if pending:
        results.append(pending)
    return results


def run_calibrated(cases: dict[str, list[str]], quick: bool) -> dict[str, Any]:
    """Per corpus and provider scale: requests of 1-6 tool results (corpus cases, short ones joined),
    counted by a simulated provider (the scripted provider's ``tiktoken_prompt_tokens``); each is
    estimated with the route's calibration as it stands, then teaches it. Ratios are estimate / provider
    count, over the requests after the first ``MIN_SAMPLES`` that are big enough to teach (smaller ones
    never approach a window)."""
    from proxy.context.calibration import MIN_SAMPLE_TOKENS, MIN_SAMPLES, Calibration
    from proxy.context.estimators import CachingEstimator, TiktokenEstimator
    from proxy.provider.scripted import tiktoken_prompt_tokens
    from proxy.runtime.calibration import local_count

    prepare_offline_environment()
    base = CachingEstimator(TiktokenEstimator("o200k_base"))
    requests = 60 if quick else 600
    out: dict[str, Any] = {}
    for kind, cased in cases.items():
        texts = tool_results(cased)
        rng = random.Random(7)
        for scale in SCALES:
            calibration, ratios = Calibration(), []
            for index in range(requests):
                picked = rng.sample(texts, k=min(len(texts), rng.randint(1, 6)))
                messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a research agent."}]
                for number, text in enumerate(picked):
                    call = {
                        "id": f"c{index}_{number}",
                        "type": "function",
                        "function": {"name": "read", "arguments": "{}"},
                    }
                    messages += [
                        {"role": "assistant", "content": None, "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": call["id"], "content": text},
                    ]
                llm_input = {"messages": messages}
                local = local_count(base, llm_input)
                provider = tiktoken_prompt_tokens(llm_input, scale)
                estimate = math.ceil(local * calibration.correction(1.25).factor)
                if len(calibration.samples) >= MIN_SAMPLES and local >= MIN_SAMPLE_TOKENS:
                    ratios.append(estimate / provider)
                calibration = calibration.observe(local, provider)
            under = [r for r in ratios if r < 1]
            out[f"{kind}@{scale}"] = {
                "kind": kind,
                "scale": scale,
                "requests": len(ratios),
                "mean_ratio": round(sum(ratios) / len(ratios), 4) if ratios else None,
                "worst_over_ratio": round(max(ratios), 4) if ratios else None,
                "worst_under_ratio": round(min(ratios), 4) if ratios else None,
                "under_share": round(len(under) / len(ratios), 4) if ratios else None,
            }
    return out
