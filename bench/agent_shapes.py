"""The request shapes part 8 sends: what an agent sends (a large system prompt, two dozen tools, a history of
tool calls), a tiny turn, and a tiny turn answered at length (what an agent streams back), each in the three
wire formats the proxy serves (chat, Messages, Responses).

Every body is deterministic: the same ``variant`` gives the same bytes, so the agent's system prompt and
tools are byte-identical across sessions, as they are for one agent (Claude Code, Codex) run many times.
"""

from __future__ import annotations

import json
import random
from typing import Any

from bench.scripted_server import LONG_ANSWER_MARKER
from bench.servers import MODEL

SYSTEM_PROMPT_TOKENS = 20_000  # about four characters a token (``_word``)
TOOLS = 24
HISTORY_MESSAGES = 12  # the messages after the system prompt: a task, an answer, five tool calls and results
TOOL_OUTPUT_CHARS = 6_000
APIS = ("chat", "messages", "responses")
_WORDS = [
    "sample",
    "buffer",
    "titration",
    "yield",
    "kinetics",
    "spectrum",
    "column",
    "solvent",
    "gradient",
    "assay",
    "protocol",
    "replicate",
    "calibration",
    "baseline",
    "anneal",
    "reagent",
    "catalyst",
    "viscosity",
    "pressure",
    "aliquot",
    "centrifuge",
    "dilution",
    "plate",
    "reader",
    "absorbance",
    "notebook",
    "pipeline",
    "repository",
    "function",
    "module",
    "commit",
    "branch",
    "review",
    "test",
]


def _word(rng: random.Random) -> str:
    # Numbers and identifiers, as in real instructions and logs: about four characters a token, not six.
    draw = rng.random()
    if draw < 0.15:
        return str(rng.randint(0, 99999))
    if draw < 0.3:
        return f"`{rng.choice(_WORDS)}_{rng.choice(_WORDS)}({rng.randint(0, 9)})`"
    return rng.choice(_WORDS)


def _prose(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        sentence = " ".join(_word(rng) for _ in range(rng.randint(8, 16))).capitalize() + "."
        out.append(sentence)
        size += len(sentence) + 1
    return " ".join(out)


def system_prompt() -> str:
    """About 20k tokens of instructions in sections, like a coding agent's."""
    rng = random.Random(20)
    sections = [f"# Section {i}: rules\n\n{_prose(rng, SYSTEM_PROMPT_TOKENS * 4 // 20)}" for i in range(20)]
    return "You are an autonomous lab and coding agent.\n\n" + "\n\n".join(sections)


def _tool_specs() -> list[tuple[str, str, dict[str, Any]]]:
    rng = random.Random(24)
    specs = []
    for i in range(TOOLS):
        parameters = {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": _prose(rng, 120)},
                "pattern": {"type": "string", "description": _prose(rng, 80)},
                "limit": {"type": "integer", "description": "How many results at most."},
            },
            "required": ["path"],
        }
        specs.append((f"tool_{i:02d}", _prose(rng, 600), parameters))
    return specs


def _history(rng: random.Random) -> list[tuple[str, Any]]:
    """(kind, value): ('user', text), ('text', text), ('call', (id, name, arguments)), ('result', (id, text))."""
    steps: list[tuple[str, Any]] = [("user", "Reproduce the yield table from the 298 K runs and fix the parser.")]
    steps.append(("text", "I'll look at the data and the parser first."))
    for step in range(5):
        call_id = f"call_{step:02d}"
        steps.append(("call", (call_id, f"tool_{step:02d}", {"path": f"runs/298K/step{step}.log"})))
        steps.append(("result", (call_id, _prose(rng, TOOL_OUTPUT_CHARS))))
    assert len(steps) == HISTORY_MESSAGES
    return steps


def agent_body(api: str, stream: bool, *, later: bool = False) -> dict[str, Any]:
    """The agent-shaped request in ``api``'s format; ``later`` adds the answer and one more user message
    (the same session's next turn)."""
    steps = _history(random.Random(12))
    if later:
        steps += [("text", "ok"), ("user", "Go on with the next run.")]
    return _body(api, system_prompt(), _tool_specs(), steps, stream, max_tokens=1024)


def tiny_body(api: str, stream: bool) -> dict[str, Any]:
    """A two-message turn without tools."""
    steps: list[tuple[str, Any]] = [("user", "Is the 298 K run finished? Answer ok or not yet.")]
    return _body(api, "You are a terse lab assistant.", [], steps, stream, max_tokens=16)


def answer_body(api: str, stream: bool) -> dict[str, Any]:
    """A two-message turn the scripted provider answers at length (``LONG_ANSWER``: 120 text chunks)."""
    steps: list[tuple[str, Any]] = [("user", f"Walk me through the 298 K run step by step. {LONG_ANSWER_MARKER}")]
    return _body(api, "You are a thorough lab assistant.", [], steps, stream, max_tokens=2048)


def _body(
    api: str,
    system: str,
    tools: list[tuple[str, str, dict[str, Any]]],
    steps: list[tuple[str, Any]],
    stream: bool,
    max_tokens: int,
) -> dict[str, Any]:
    if api == "chat":
        body = _chat(system, tools, steps, max_tokens)
    elif api == "messages":
        body = _messages(system, tools, steps, max_tokens)
    elif api == "responses":
        body = _responses(system, tools, steps, max_tokens)
    else:
        raise ValueError(f"unknown API {api!r}")
    if stream:
        body["stream"] = True
    return body


def _chat(system: str, tools: list[Any], steps: list[tuple[str, Any]], max_tokens: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for kind, value in steps:
        if kind == "user":
            messages.append({"role": "user", "content": value})
        elif kind == "text":
            messages.append({"role": "assistant", "content": value})
        elif kind == "call":
            call_id, name, arguments = value
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": value[0], "content": value[1]})
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": max_tokens}
    if tools:
        body["tools"] = [
            {"type": "function", "function": {"name": n, "description": d, "parameters": p}} for n, d, p in tools
        ]
    return body


def _messages(system: str, tools: list[Any], steps: list[tuple[str, Any]], max_tokens: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for kind, value in steps:
        if kind == "user":
            messages.append({"role": "user", "content": value})
        elif kind == "text":
            messages.append({"role": "assistant", "content": [{"type": "text", "text": value}]})
        elif kind == "call":
            call_id, name, arguments = value
            block = {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
            messages.append({"role": "assistant", "content": [block]})
        else:
            block = {"type": "tool_result", "tool_use_id": value[0], "content": value[1]}
            messages.append({"role": "user", "content": [block]})
    body: dict[str, Any] = {"model": MODEL, "system": system, "messages": messages, "max_tokens": max_tokens}
    if tools:
        body["tools"] = [{"name": n, "description": d, "input_schema": p} for n, d, p in tools]
    return body


def _responses(system: str, tools: list[Any], steps: list[tuple[str, Any]], max_tokens: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for kind, value in steps:
        if kind == "user":
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]})
        elif kind == "text":
            content = [{"type": "output_text", "text": value, "annotations": []}]
            items.append({"type": "message", "role": "assistant", "content": content})
        elif kind == "call":
            call_id, name, arguments = value
            call = {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(arguments)}
            items.append(call)
        else:
            items.append({"type": "function_call_output", "call_id": value[0], "output": value[1]})
    body: dict[str, Any] = {
        "model": MODEL,
        "instructions": system,
        "input": items,
        "max_output_tokens": max_tokens,
        "store": False,
    }
    if tools:
        body["tools"] = [{"type": "function", "name": n, "description": d, "parameters": p} for n, d, p in tools]
    return body


def endpoint(api: str) -> str:
    """The path each API is served at (the same on both proxies)."""
    return {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}[api]
