"""Part 8, compacted: does a streamed answer stay live once the proxy has compacted the session?

Once a session is compacted the proxy offers its own ``read_tool_output`` (it is offered from the first call
of any tool session), and an answer is relayed round by round (``proxy/runtime/rounds.py``): only a call to a
proxy-owned tool is held back. Issue 42's goal: an answer that does not open with such a call reaches the
client as the provider sends it, its first token as early (relative to its last byte) as before compaction.

An agent loop over chat through our proxy, 16k-token window: each step the scripted provider streams a
sentence of text and then a client tool call, a chunk every ``CHUNK_DELAY`` seconds (a model writing),
and the client answers the call with a ~4 KB log, so the proxy starts previewing old logs after a few
steps. Per step: the time to the first text delta and to the last byte; the proxy's traces say which
steps came after the first compaction. Reported: the median first/last ratio before and after, and their
quotient (goal: after / before <= ``GOAL``; 1.0 is "as before").
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from proxy.app import create_app
from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.science_script import SUMMARY_MARKER, checkpoint_for, tool_output
from proxy.provider.scripted import Reply, ScriptedProvider, ToolCall, serve_in_thread

WINDOW = 16_000
STEPS = 24
OUTPUT_BYTES = 4_000
CHUNK_DELAY = 0.02  # seconds between the provider's chunks
GOAL = 1.25  # first/last after compaction over before: "as before", with room for a noisy machine
TOOL = {
    "type": "function",
    "function": {
        "name": "run_step",
        "description": "Run one analysis step and return its log.",
        "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}, "required": ["step"]},
    },
}


def _script(body: dict[str, Any]) -> Reply:
    """A sentence about the next step, then the call to run it; a checkpoint when the proxy summarizes."""
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    if SUMMARY_MARKER in str(last.get("content")):
        return Reply(content=checkpoint_for(str(last.get("content"))))
    step = 1 + sum(1 for message in messages if message.get("role") == "tool")
    text = f"Step {step}: the previous log looks consistent, so I am running the next analysis step now."
    return Reply(content=text, tool_calls=(ToolCall("run_step", {"step": step}, id=f"call_{step}"),))


def _session(base: str, steps: int) -> list[dict[str, float]]:
    """The agent loop through the proxy: per step, ms to the first text delta and to the last byte."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a lab agent. Run the analysis one step at a time."},
        {"role": "user", "content": "Run the 298 K analysis, step by step."},
    ]
    timings: list[dict[str, float]] = []
    with openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0) as sdk:
        for _ in range(steps):
            started = time.perf_counter()
            first: float | None = None
            text, calls = "", {}
            stream = sdk.chat.completions.create(
                model="agent", messages=messages, tools=[TOOL], stream=True, extra_headers={"x-session-id": "cs"}
            )
            for chunk in stream:
                for choice in chunk.choices:
                    if choice.delta.content:
                        first = first if first is not None else time.perf_counter()
                        text += choice.delta.content
                    for call in choice.delta.tool_calls or []:
                        entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                        entry["id"] = call.id or entry["id"]
                        entry["name"] += (call.function and call.function.name) or ""
                        entry["arguments"] += (call.function and call.function.arguments) or ""
            ended = time.perf_counter()
            if first is None or not calls:
                raise RuntimeError(f"step {len(timings) + 1}: the stream carried no text or no call")
            timings.append({"first_ms": (first - started) * 1000, "last_ms": (ended - started) * 1000})
            tool_calls = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls.values()
            ]
            messages.append({"role": "assistant", "content": text, "tool_calls": tool_calls})
            for call in tool_calls:
                step = int(json.loads(call["function"]["arguments"])["step"])
                output = tool_output(step, OUTPUT_BYTES)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    return timings


def _compacted_from(traces: Path) -> int | None:
    """The index of the client's first call on which the proxy compacted (``None``: never)."""
    records = sorted((json.loads(p.read_text()) for p in traces.rglob("*.json")), key=lambda t: t["turn"])
    client_calls = [t for t in records if not t.get("round")]
    for index, trace in enumerate(client_calls):
        if trace["compaction"]["compactedRefs"] or trace["compaction"]["summarizedMessages"]:
            return index
    return None


def run_compacted_stream(steps: int = STEPS, chunk_delay: float = CHUNK_DELAY) -> dict[str, Any]:
    """The loop once; the report section."""
    provider = ScriptedProvider(_script, chunk_delay=chunk_delay)
    with serve_in_thread(provider.app()) as url, tempfile.TemporaryDirectory(prefix="bench-compacted-") as folder:
        params = {"model": "openai/scripted", "api_base": f"{url}/v1", "api_key": "sk-provider"}
        route = ModelRoute("agent", params, max_input_tokens=WINDOW, max_output_tokens=1_000)
        settings = Settings(data_dir=Path(folder), models=(route,), trace_enabled=True)
        with serve_in_thread(create_app(settings)) as proxy:
            timings = _session(proxy, steps)
        compacted = _compacted_from(settings.resolved_trace_dir)
    ratios = [t["first_ms"] / t["last_ms"] for t in timings]
    if compacted is None or compacted < 2:
        return {"steps": timings, "compacted_from": compacted, "error": "the session never compacted after step 2"}
    before = sorted(ratios[1:compacted])  # the first step pays the session's start
    after = sorted(ratios[compacted + 1 :])
    median_before, median_after = before[len(before) // 2], after[len(after) // 2]
    return {
        "window": WINDOW,
        "chunk_delay_ms": chunk_delay * 1000,
        "compacted_from": compacted + 1,  # 1-based step
        "first_over_last_before": round(median_before, 3),
        "first_over_last_after": round(median_after, 3),
        "after_over_before": round(median_after / median_before, 3),
        "steps": timings,
    }
