"""Part 8, compacted: does a streamed answer stay live once the proxy has compacted the session?

Once a session is compacted the proxy offers its own ``read_tool_output`` (it is offered from the first call
of any tool session), and an answer is relayed round by round (``proxy/runtime/rounds.py``): only a call to a
proxy-owned tool is held back. Issue 42's goal: an answer that does not open with such a call reaches the
client as the provider sends it, its first token as early (relative to its last byte) as before compaction.

An agent loop over chat through our proxy, 16k-token window: each step the scripted provider streams a
sentence of text and then a client tool call, a chunk every ``CHUNK_DELAY`` seconds (a model writing),
and the client answers the call with a ~4 KB log, so the proxy starts previewing old logs after a dozen
steps. Per step: the time to the first text delta and to the last byte; the proxy's traces say which
steps came after the first compaction.

"As before compaction" is measured against a twin: the same loop, through the same proxy, step for step
interleaved with it (which goes first alternates), on a route whose window is wide enough that the proxy
never compacts it. A step after compaction is compared with the same step of the twin: the same client
history, sent at about the same moment. Comparing with the session's own earlier steps instead mixed
compaction up with the history's growth: a first token comes later as the history grows, compacted or not
(in one run of a session never compacted, the median first/last ratio rose from 0.15 over steps 2-12 to
0.18 over steps 14-24), so "after over before" read about 1.17x with no compaction at all. Reported: the
median of the per-step quotients (compacted over twin) after compaction (goal: at most ``GOAL``; 1.0 is
"as before"), and for context the median first/last ratios before and after compaction and the twin's.
"""

from __future__ import annotations

import json
import statistics
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
GOAL = 1.25  # first/last after compaction over the twin's: "as before", with room for a noisy machine
TWIN_MODEL = "agent-twin"  # the twin loop's route: the same provider, a window it never fills
TWIN_WINDOW = 1_000_000
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


class _AgentLoop:
    """One agent loop through the proxy (a session of its own), a step at a time."""

    def __init__(self, sdk: openai.OpenAI, model: str, session: str) -> None:
        self._sdk, self._model, self._session = sdk, model, session
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a lab agent. Run the analysis one step at a time."},
            {"role": "user", "content": "Run the 298 K analysis, step by step."},
        ]
        self.timings: list[dict[str, float]] = []  # per step: ms to the first text delta and to the last byte

    def step(self) -> None:
        started = time.perf_counter()
        first: float | None = None
        text, calls = "", {}
        stream = self._sdk.chat.completions.create(
            model=self._model,
            messages=self.messages,  # type: ignore[arg-type]
            tools=[TOOL],  # type: ignore[list-item]
            stream=True,
            extra_headers={"x-session-id": self._session},
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
            raise RuntimeError(f"{self._model}, step {len(self.timings) + 1}: the stream carried no text or no call")
        self.timings.append({"first_ms": (first - started) * 1000, "last_ms": (ended - started) * 1000})
        tool_calls = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls.values()
        ]
        self.messages.append({"role": "assistant", "content": text, "tool_calls": tool_calls})
        for call in tool_calls:
            step = int(json.loads(call["function"]["arguments"])["step"])
            output = tool_output(step, OUTPUT_BYTES)
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})


def _sessions(base: str, steps: int) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """The compacted loop and its twin, step by step interleaved (which goes first alternates): their timings."""
    with openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0) as sdk:
        compacted, twin = _AgentLoop(sdk, "agent", "cs"), _AgentLoop(sdk, TWIN_MODEL, "cs-twin")
        for index in range(steps):
            for loop in (compacted, twin) if index % 2 == 0 else (twin, compacted):
                loop.step()
    return compacted.timings, twin.timings


def _compacted_from(traces: Path, model: str = "agent") -> int | None:
    """The index of the client's first call of ``model``'s session on which the proxy compacted (``None``:
    never)."""
    records = sorted((json.loads(p.read_text()) for p in traces.rglob("*.json")), key=lambda t: t["turn"])
    client_calls = [t for t in records if not t.get("round") and t["model"] == model]
    for index, trace in enumerate(client_calls):
        if trace["compaction"]["compactedRefs"] or trace["compaction"]["summarizedMessages"]:
            return index
    return None


def run_compacted_stream(steps: int = STEPS, chunk_delay: float = CHUNK_DELAY) -> dict[str, Any]:
    """The loop and its twin once; the report section."""
    provider = ScriptedProvider(_script, chunk_delay=chunk_delay)
    with serve_in_thread(provider.app()) as url, tempfile.TemporaryDirectory(prefix="bench-compacted-") as folder:
        params = {"model": "openai/scripted", "api_base": f"{url}/v1", "api_key": "sk-provider"}
        routes = (
            ModelRoute("agent", params, max_input_tokens=WINDOW, max_output_tokens=1_000),
            ModelRoute(TWIN_MODEL, params, max_input_tokens=TWIN_WINDOW, max_output_tokens=1_000),
        )
        settings = Settings(data_dir=Path(folder), models=routes, trace_enabled=True)
        with serve_in_thread(create_app(settings)) as proxy:
            timings, twin_timings = _sessions(proxy, steps)
        compacted = _compacted_from(settings.resolved_trace_dir)
        twin_compacted = _compacted_from(settings.resolved_trace_dir, TWIN_MODEL)
    ratios = [t["first_ms"] / t["last_ms"] for t in timings]
    twin_ratios = [t["first_ms"] / t["last_ms"] for t in twin_timings]
    steps_out = {"steps": timings, "twin_steps": twin_timings, "compacted_from": compacted}
    if compacted is None or compacted < 2 or compacted >= steps - 1:
        return {**steps_out, "error": "the session did not compact between its second and its last step"}
    if twin_compacted is not None:
        return {**steps_out, "error": f"the twin session was compacted too (step {twin_compacted + 1})"}
    before = ratios[1:compacted]  # the first step pays the session's start
    after = range(compacted + 1, steps)  # the compacting step itself previews what it found: not "after"
    return {
        "window": WINDOW,
        "twin_window": TWIN_WINDOW,
        "chunk_delay_ms": chunk_delay * 1000,
        "compacted_from": compacted + 1,  # 1-based step
        "first_over_last_before": round(statistics.median(before), 3),
        "first_over_last_after": round(statistics.median([ratios[i] for i in after]), 3),
        "first_over_last_twin": round(statistics.median([twin_ratios[i] for i in after]), 3),
        "after_over_twin": round(statistics.median([ratios[i] / twin_ratios[i] for i in after]), 3),
        **steps_out,
    }
