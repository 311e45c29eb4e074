"""A scripted science agent's model, for the demo, the tests and the benchmarks.

The model runs ``steps`` measurement steps, one tool call each; every tool output is about
``output_bytes`` long and names its step on its first line, so the model can tell where it is even
when older outputs were compacted. Step 1's output hides a fact in its middle. After the last step
the model asks the proxy's ``read_tool_output`` for that fact (finding step 1's reference in a preview
or in the checkpoint) and answers with it. Summarization requests get a well-formed checkpoint that
cites the references of the outputs it covers.
"""

from __future__ import annotations

import json
import re
from typing import Any

from proxy.provider.scripted import Reply, ToolCall

PLANTED_FACT = "FACT-7391: the calibration offset is 0.0427 K"
SUMMARY_MARKER = "You write a scientific checkpoint"
_STEP = re.compile(r"step=(\d+)")
_REF = re.compile(r"ref=([A-Za-z0-9_.:-]+)")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_step",
            "description": "Run one measurement step of the protocol and return its raw log.",
            "parameters": {
                "type": "object",
                "properties": {"step": {"type": "integer"}},
                "required": ["step"],
                "additionalProperties": False,
            },
        },
    }
]


def tool_output(step: int, output_bytes: int = 12_000) -> str:
    """The raw log of one step: its step number first, then numbered lines; step 1 hides the fact."""
    lines = [f"step={step} measurement log"]
    index = 0
    while sum(len(line) + 1 for line in lines) < output_bytes:
        index += 1
        if step == 1 and index == 60:
            lines.append(PLANTED_FACT)
        lines.append(f"{step:03d}.{index:04d} T={20 + (index % 90) * 0.5:.2f}C I={0.001 * index:.4f}A ok")
    return "\n".join(lines)


def is_summary_request(body: dict[str, Any]) -> bool:
    """Whether a provider request is the proxy's checkpoint summarization."""
    first = body["messages"][0] if body.get("messages") else {}
    return first.get("role") == "system" and str(first.get("content", "")).startswith(SUMMARY_MARKER)


class ScienceModel:
    """The scripted model: callable as a ``Script`` of the scripted provider."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.summaries = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            self.summaries += 1
            return Reply(content=checkpoint_for(body["messages"][-1]["content"]))
        messages = body["messages"]
        read_back = _read_back(messages)
        if read_back is not None:
            found = PLANTED_FACT in read_back
            return Reply(content=f"Done. Recovered from step 1: {PLANTED_FACT}" if found else "Done; fact not found.")
        step = _last_step(messages)
        if step < self.steps:
            return Reply(tool_calls=(ToolCall("run_step", {"step": step + 1}),))
        ref = _step_one_ref(messages)
        if ref is None:
            return Reply(content="Done, but step 1's output is no longer referenced anywhere.")
        return Reply(tool_calls=(ToolCall("read_tool_output", {"ref": ref, "query": "FACT-"}),))


def _read_back(messages: list[dict[str, Any]]) -> str | None:
    """The result of the model's own ``read_tool_output`` call, when that is the latest step."""
    last_call = next((m for m in reversed(messages) if m.get("role") == "assistant" and m.get("tool_calls")), None)
    if last_call is None or last_call["tool_calls"][0]["function"]["name"] != "read_tool_output":
        return None
    ids = {call["id"] for call in last_call["tool_calls"]}
    return "\n".join(str(m.get("content")) for m in messages if m.get("role") == "tool" and m["tool_call_id"] in ids)


def _last_step(messages: list[dict[str, Any]]) -> int:
    for message in reversed(messages):
        if message.get("role") == "tool":
            found = _STEP.search(str(message.get("content", ""))[:200])
            if found:
                return int(found.group(1))
    return 0


def _step_one_ref(messages: list[dict[str, Any]]) -> str | None:
    """Step 1's reference, from its preview or from a checkpoint line that cites it."""
    for message in messages:
        text = str(message.get("content") or "")
        for line in text.splitlines():
            if "step=1 " in line or "step 1 " in line:
                found = _REF.search(line) or _REF.search(text[:600])
                if found:
                    return found.group(1)
    return None


def checkpoint_for(source: str) -> str:
    """A short, well-formed checkpoint that cites every reference of the source with its step."""
    evidence = []
    for block in source.split("\n\n"):
        step, ref = _STEP.search(block), _REF.search(block)
        if step and ref:
            evidence.append(f"- step {step.group(1)} output: ref={ref.group(1)}")
    for line in source.splitlines():  # references a previous checkpoint already cited
        if line.startswith("- step ") and "ref=" in line and line not in evidence:
            evidence.append(line)
    evidence.sort(key=lambda line: int(line.split()[2]))
    return "\n".join(
        [
            "## Completed work",
            f"- {len(evidence)} measurement steps run and logged",
            "## Evidence",
            *(evidence or ["- (none)"]),
            "## Decisions",
            "- keep the protocol unchanged",
            "## Failed or abandoned directions",
            "- (none)",
            "## Explicit pending conditions",
            "- report the calibration fact from step 1",
            "## Optional directions",
            "- (none)",
            "## Next step",
            "- run the next measurement step",
        ]
    )


def client_tool_result(call: dict[str, Any], output_bytes: int = 12_000) -> dict[str, Any]:
    """What the agent (the client) answers to one ``run_step`` call."""
    step = int(json.loads(call["function"]["arguments"])["step"])
    return {"role": "tool", "tool_call_id": call["id"], "content": tool_output(step, output_bytes)}
