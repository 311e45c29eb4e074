"""Part 3: a long scripted science run through the proxy in dynamic mode at a 32k window.

The client behaves like a real agent: it resends its whole history every turn, runs the tool the
model calls (~12 KB of measurement log each time) and appends the result. What the provider actually
received is read back from the scripted server (``/bench/received``); a passthrough would have sent
exactly the client's requests, so those are the baseline. Tokens are counted with tiktoken
``o200k_base`` per message (cached: most messages repeat turn after turn), plus 4 framing tokens per
message and the tool schemas.

A turn the proxy or provider refuses (an overflow that survived the retry, any other error) is a
failure in the report; the client then appends the step itself so the run goes on measuring.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.scripted_server import SUMMARY_MARKER
from bench.servers import MASTER_KEY, MODEL
from proxy.process.offline import prepare_offline_environment

WINDOW_TOKENS = 32_000
TOOL_OUTPUT_BYTES = 12_000
MESSAGE_FRAMING_TOKENS = 4
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_analysis",
            "description": "Run one analysis step on a sample and return its measurement log.",
            "parameters": {
                "type": "object",
                "properties": {"sample": {"type": "string"}, "replicate": {"type": "integer"}},
                "required": ["sample"],
            },
        },
    }
]
SYSTEM = "You are a careful research agent. Cite stored outputs; never fabricate measurements."
TASK = (
    "Task: characterise the catalyst's yield between 290 K and 320 K across all samples, 每个样本重复三次, "
    "and report the temperature of maximum yield with its uncertainty."
)


def tool_output(step: int, size: int = TOOL_OUTPUT_BYTES) -> str:
    """A deterministic ~``size``-byte measurement log (numbers, units, short mixed zh/en notes)."""
    rng = random.Random(step)
    notes = ["stable", "稳定", "drift", "漂移", "baseline ok", "重复测量", "outlier?", "校准后"]
    lines = [f"# run_analysis step={step} sample=S{step:03d} instrument=GC-2030 detector=FID"]
    size_so_far = len(lines[0])
    index = 0
    while size_so_far < size:
        line = (
            f"t={index * 0.5:07.1f}s T={290 + rng.random() * 30:.2f}K yield={rng.random():.4f} "
            f"pH={6.5 + rng.random():.2f} p={rng.random() * 2:.3f}bar note={rng.choice(notes)}"
        )
        lines.append(line)
        size_so_far += len(line.encode()) + 1
        index += 1
    return "\n".join(lines)


class TokenCounter:
    """o200k_base tokens of chat messages, cached per message (the history repeats every turn)."""

    def __init__(self) -> None:
        prepare_offline_environment()
        import tiktoken

        self._encoding = tiktoken.get_encoding("o200k_base")
        self._cache: dict[str, int] = {}

    def text(self, text: str) -> int:
        """Tokens of a string."""
        return len(self._encoding.encode(text, disallowed_special=()))

    def message(self, message: dict[str, Any]) -> int:
        """Tokens of one message: its text, its tool calls, and the framing."""
        key = json.dumps(message, sort_keys=True, ensure_ascii=False)
        cached = self._cache.get(key)
        if cached is None:
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
            parts = [str(content or "")]
            parts += [
                json.dumps(call.get("function", {}), ensure_ascii=False) for call in message.get("tool_calls") or []
            ]
            cached = self._cache[key] = self.text("\n".join(parts)) + MESSAGE_FRAMING_TOKENS
        return cached

    def request(self, body: dict[str, Any]) -> int:
        """Tokens of a whole request: messages plus tool schemas."""
        tools = body.get("tools")
        return sum(self.message(m) for m in body.get("messages", [])) + (self.text(json.dumps(tools)) if tools else 0)


def prefix_share(previous: str, current: str) -> tuple[float, float]:
    """Byte-identical common prefix as a share of the previous request and of the current one."""
    limit = min(len(previous), len(current))
    low, high = 0, limit
    while low < high:  # binary search on prefix equality: C-speed slice comparisons, not a Python loop
        middle = (low + high + 1) // 2
        if previous[:middle] == current[:middle]:
            low = middle
        else:
            high = middle - 1
    return low / max(1, len(previous)), low / max(1, len(current))


def _serialized(body: dict[str, Any]) -> str:
    # Tools first: providers render them ahead of the messages, so they are part of the cached prefix.
    return json.dumps({"tools": body.get("tools"), "messages": body.get("messages")}, ensure_ascii=False)


def _is_summary(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or []
    return not body.get("tools") and bool(messages) and SUMMARY_MARKER in str(messages[-1].get("content") or "")


def _fetch_received(client: httpx.Client, provider_url: str, since: int) -> tuple[int, list[dict[str, Any]]]:
    data = client.get(f"{provider_url}/bench/received", params={"since": since}).json()
    client.post(f"{provider_url}/bench/forget")
    return int(data["next"]), list(data["bodies"])


def _compactions(trace_dir: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(file name, record) of every trace file of the run, in turn order."""
    for path in sorted(trace_dir.glob("*/turn-*.json")):
        yield path.name, json.loads(path.read_text(encoding="utf-8"))


def _fired(record: dict[str, Any]) -> bool:
    """Whether a turn's ``compaction`` field says a pass ran (a reason), not just stored previews re-applied."""
    compaction = record.get("compaction")
    if not compaction:
        return False
    if isinstance(compaction, dict) and "reason" in compaction:
        return compaction["reason"] not in (None, "", "none")
    return True


def run_long(proxy_url: str, provider_url: str, trace_dir: Path, *, steps: int) -> dict[str, Any]:
    """Play ``steps`` agent steps through the proxy and compare what the provider got with a passthrough."""
    counter = TokenCounter()
    session = f"long-{time.time_ns()}"
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    failures: list[dict[str, Any]] = []
    passthrough_tokens: list[int] = []
    sent: list[dict[str, Any]] = []  # per provider request: kind, tokens, prefix shares
    since = 0
    previous_turn: str | None = None
    started = time.perf_counter()
    headers = {"authorization": f"Bearer {MASTER_KEY}", "x-session-id": session}
    with httpx.Client(timeout=300.0) as client:
        for step in range(steps):
            body = {"model": MODEL, "messages": history, "tools": TOOLS}
            passthrough_tokens.append(counter.request(body))
            assistant: dict[str, Any] | None = None
            try:
                response = client.post(f"{proxy_url}/v1/chat/completions", json=body, headers=headers)
                if response.status_code == 200:
                    assistant = response.json()["choices"][0]["message"]
                else:
                    error = response.json().get("error", {}) if response.content else {}
                    failures.append(
                        {
                            "step": step,
                            "status": response.status_code,
                            "code": error.get("code"),
                            "message": str(error.get("message", ""))[:300],
                        }
                    )
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                failures.append({"step": step, "status": None, "code": type(exc).__name__, "message": str(exc)[:300]})
            if assistant is None or not assistant.get("tool_calls"):
                # Keep the run going as the agent would after a retry: it takes the step itself.
                assistant = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"client_{step}",
                            "type": "function",
                            "function": {"name": "run_analysis", "arguments": json.dumps({"sample": f"S{step:03d}"})},
                        }
                    ],
                }
            assistant = {k: v for k, v in assistant.items() if k in ("role", "content", "tool_calls")}
            history.append(assistant)
            for call in assistant["tool_calls"]:
                history.append({"role": "tool", "tool_call_id": call["id"], "content": tool_output(step)})
            since, bodies = _fetch_received(client, provider_url, since)
            for received in bodies:
                entry: dict[str, Any] = {
                    "step": step,
                    "summary": _is_summary(received),
                    "tokens": counter.request(received),
                }
                if not entry["summary"]:
                    serialized = _serialized(received)
                    if previous_turn is not None:
                        entry["prefix_of_previous"], entry["prefix_of_current"] = prefix_share(
                            previous_turn, serialized
                        )
                    previous_turn = serialized
                sent.append(entry)
    elapsed = time.perf_counter() - started
    return _summarize(sent, passthrough_tokens, failures, trace_dir, steps, elapsed)


def _summarize(
    sent: list[dict[str, Any]],
    passthrough_tokens: list[int],
    failures: list[dict[str, Any]],
    trace_dir: Path,
    steps: int,
    elapsed: float,
) -> dict[str, Any]:
    traces = list(_compactions(trace_dir))
    turn_traces = [record for name, record in traces if "recovery" not in name]
    fired_turns = {record.get("turn") for _, record in traces if _fired(record) or "recovery" in _}
    turns = [e for e in sent if not e["summary"]]
    summaries = [e for e in sent if e["summary"]]
    # Pair each turn request with its trace by order; the trace says whether that turn compacted.
    stable = []
    for index, entry in enumerate(turns):
        if "prefix_of_previous" not in entry:
            continue
        turn_number = turn_traces[index].get("turn") if index < len(turn_traces) else None
        if turn_number in fired_turns:
            continue
        stable.append(entry)
    total_sent = sum(e["tokens"] for e in sent)
    total_passthrough = sum(passthrough_tokens)
    largest = max((e["tokens"] for e in turns), default=0)
    prefix_prev = sorted(e["prefix_of_previous"] for e in stable)
    return {
        "steps": steps,
        "window_tokens": WINDOW_TOKENS,
        "tool_output_bytes": TOOL_OUTPUT_BYTES,
        "seconds": round(elapsed, 1),
        "provider_requests": len(sent),
        "summary_requests": len(summaries),
        "prompt_tokens_sent": total_sent,
        "prompt_tokens_sent_turns_only": sum(e["tokens"] for e in turns),
        "prompt_tokens_passthrough": total_passthrough,
        "savings": round(1 - total_sent / total_passthrough, 4) if total_passthrough else None,
        "largest_request_tokens": largest,
        "largest_passthrough_tokens": max(passthrough_tokens, default=0),
        "requests_over_limit": sum(1 for e in turns if e["tokens"] > WINDOW_TOKENS),
        "passthrough_requests_over_limit": sum(1 for t in passthrough_tokens if t > WINDOW_TOKENS),
        "failures": len(failures),
        "failure_samples": failures[:5],
        "trace_files": len(traces),
        "compactions_fired": len(fired_turns),
        "turns_without_compaction": len(stable),
        "prefix_stability_mean": round(sum(prefix_prev) / len(prefix_prev), 4) if prefix_prev else None,
        "prefix_stability_min": round(prefix_prev[0], 4) if prefix_prev else None,
        "prefix_stability_p05": round(prefix_prev[int(0.05 * (len(prefix_prev) - 1))], 4) if prefix_prev else None,
        "prefix_of_current_mean": round(sum(e["prefix_of_current"] for e in stable) / len(stable), 4)
        if stable
        else None,
    }
