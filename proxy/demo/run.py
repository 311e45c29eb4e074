"""``context-proxy demo``: scripted science-agent sessions through the real proxy, offline.

It starts the scripted provider and the proxy (real uvicorn servers on loopback, SQLite store),
then plays an agent that resends its whole history each turn, runs its own tool calls, and stops at
the final answer, printing after each turn what the provider actually received. A second, longer
run outgrows the model's window: the proxy previews old outputs, writes checkpoints, and the model
still reads a fact from step 1 back through the proxy-owned read_tool_output.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import httpx

from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.science_script import TOOLS as SCIENCE_TOOLS
from proxy.provider.science_script import ScienceModel, client_tool_result, is_summary_request
from proxy.provider.scripted import Reply, ScriptedProvider, ToolCall, serve_in_thread

MODEL = "demo-scientist"
LONG_RUN_STEPS = 30
LONG_RUN_WINDOW = 16_000
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_experiment",
            "description": "Run a measurement on a sample and return its log.",
            "parameters": {
                "type": "object",
                "properties": {"sample": {"type": "string"}},
                "required": ["sample"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "fit_curve",
            "description": "Fit a heating curve and return the transition temperature.",
            "parameters": {
                "type": "object",
                "properties": {"log_lines": {"type": "integer"}},
                "required": ["log_lines"],
                "additionalProperties": False,
            },
        },
    },
]


def scientist(body: dict[str, Any]) -> Reply:
    """The scripted model: measure, fit, then report what the fit returned."""
    tool_results = [m for m in body["messages"] if m.get("role") == "tool"]
    if not tool_results:
        return Reply(tool_calls=(ToolCall("run_experiment", {"sample": "A"}),))
    if len(tool_results) == 1:
        return Reply(tool_calls=(ToolCall("fit_curve", {"log_lines": 40}),))
    return Reply(content=f"Sample A melts at {tool_results[-1]['content']} (fit of 40 heating-curve points).")


def run_tool(name: str, arguments: dict[str, Any]) -> str:
    """The agent's own tools, run on the client side as a real agent would."""
    if name == "run_experiment":
        return "\n".join(f"t={i:02d}s T={20 + i * 2.5:.1f}C phase={'solid' if i < 30 else 'liquid'}" for i in range(40))
    return "94.6 C"


def run_demo(data_dir: Path | None) -> int:
    """Run the demo and print each provider request; returns the process exit code."""
    with tempfile.TemporaryDirectory(prefix="context-proxy-demo-") as scratch:
        folder = data_dir or Path(scratch)
        # The provider counts as o200k_base does and refuses what exceeds its window, as a real one would:
        # the proxy learns that count from each answer's usage, and the lines below show it respected.
        provider = ScriptedProvider(scientist, token_scale=1.0, context_window=LONG_RUN_WINDOW)
        with serve_in_thread(provider.app()) as provider_url:
            route = ModelRoute(
                MODEL,
                {
                    "model": "openai/scripted-scientist",
                    "api_base": f"{provider_url}/v1",
                    "api_key": "sk-demo-not-a-secret",
                },
                max_input_tokens=LONG_RUN_WINDOW,
                max_output_tokens=1_000,
            )
            settings = Settings(data_dir=folder, models=(route,), trace_enabled=True)
            from proxy.app import create_app

            with serve_in_thread(create_app(settings)) as proxy_url:
                print(f"scripted provider at {provider_url}, context proxy at {proxy_url} (mode {settings.mode})")
                answer = _play_agent(proxy_url, provider)
                print(f"\nfinal answer: {answer}")
                provider.script = ScienceModel(LONG_RUN_STEPS)
                _play_long_run(proxy_url, provider)
        print(f"store and traces in {folder}" if data_dir else "store and traces were in a temporary folder")
    return 0


def _play_agent(proxy_url: str, provider: ScriptedProvider) -> str:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful lab scientist. Use tools; report numbers with units."},
        {"role": "user", "content": "Measure the melting point of sample A."},
    ]
    with httpx.Client(base_url=proxy_url, timeout=60) as client:
        for turn in range(1, 6):
            response = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "tools": TOOLS})
            response.raise_for_status()
            _print_provider_request(turn, provider.history[-1], response.headers)
            message = response.json()["choices"][0]["message"]
            messages.append({k: v for k, v in message.items() if v is not None})
            if not message.get("tool_calls"):
                return str(message.get("content"))
            for call in message["tool_calls"]:
                result = run_tool(call["function"]["name"], json.loads(call["function"]["arguments"]))
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return "(no final answer within 5 turns)"


def _play_long_run(proxy_url: str, provider: ScriptedProvider) -> None:
    """A long run whose history outgrows the window: one line per turn on what the provider got."""
    print(f"\n=== a {LONG_RUN_STEPS}-step run, 12 KB per tool output, {LONG_RUN_WINDOW:,}-token window ===")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an autonomous lab agent. Run the protocol step by step."},
        {"role": "user", "content": f"Run the {LONG_RUN_STEPS}-step calibration protocol, then report the fact."},
    ]
    headers = {"x-session-id": "demo-long-run"}
    with httpx.Client(base_url=proxy_url, timeout=60) as client:
        for turn in range(1, LONG_RUN_STEPS + 3):
            seen = len(provider.history)
            body = {"model": MODEL, "messages": messages, "tools": SCIENCE_TOOLS}
            response = client.post("/v1/chat/completions", json=body, headers=headers)
            response.raise_for_status()
            sent = [b for b in provider.history[seen:] if not is_summary_request(b)]
            summaries = len(provider.history[seen:]) - len(sent)
            for request in sent:
                text = json.dumps(request["messages"], ensure_ascii=False)
                print(
                    f"turn {turn:2d}: client history {len(messages):3d} messages, {_tokens(messages):7,} tokens "
                    f"-> provider got {len(request['messages']):2d} messages, "
                    f"{_tokens(request['messages']):6,} tokens, "
                    f"{text.count('ref=to_'):2d} previews, checkpoint={'<checkpoint' in text}"
                    + (f", {summaries} summarizer call(s)" if summaries else "")
                )
            message = response.json()["choices"][0]["message"]
            messages.append({k: v for k, v in message.items() if v is not None})
            if not message.get("tool_calls"):
                print(f"final answer: {message.get('content')}")
                return
            messages += [client_tool_result(call) for call in message["tool_calls"]]


def _tokens(messages: list[dict[str, Any]]) -> int:
    """Real tokens (o200k_base), to show the window is respected; tiktoken reads litellm's bundled file."""
    import tiktoken

    return len(tiktoken.get_encoding("o200k_base").encode(json.dumps(messages, ensure_ascii=False)))


def _print_provider_request(turn: int, body: dict[str, Any], headers: httpx.Headers) -> None:
    print(
        f"\n--- turn {turn}: the provider received {len(body['messages'])} messages, "
        f"tools={[t['function']['name'] for t in body.get('tools', [])]} "
        f"(x-context-id={headers.get('x-context-id')}, x-context-mode={headers.get('x-context-mode')})"
    )
    for message in body["messages"]:
        content = message.get("content")
        text = content if isinstance(content, str) else "" if content is None else json.dumps(content)
        calls = [c["function"]["name"] for c in message.get("tool_calls") or []]
        summary = (text or "").replace("\n", " | ")
        print(
            f"  {message['role']:<9} {summary[:96]}{'...' if len(summary) > 96 else ''}"
            + (f" calls={calls}" if calls else "")
        )
