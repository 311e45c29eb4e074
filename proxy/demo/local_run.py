"""``context-proxy demo --local-model``: a short tool session through the proxy against a real model.

It starts llama-cpp-python's server with SmolLM2-135M-Instruct (``proxy/provider/local_model.py``) on
loopback with a 2,048-token window and the proxy in front of it (SQLite, traces on), then plays an agent
whose side is scripted (its tool calls and their outputs) while the answers are the model's. The history
outgrows the window after a few steps; each line says what the client sent, what the server was given and
counted (its ``usage.prompt_tokens``), what the proxy compacted and what calibration learnt. The last turn
is streamed: this server sends no usage on a stream, so calibration counts with its tokenizer endpoint.

The same agent (``opening``, ``step_messages``, ``TOOLS``) drives the real-model tests.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.local_model import LocalModel, serve_local_model

MODEL = "local-smollm2"
N_CTX = 1024  # small enough for a shared two-core machine: a full window is about a minute of prompt reading
STEPS = 6
ANSWER_TOKENS = 16
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_notes",
            "description": "Read one page of the field notebook.",
            "parameters": {
                "type": "object",
                "properties": {"page": {"type": "integer"}},
                "required": ["page"],
                "additionalProperties": False,
            },
        },
    }
]
_BIRDS = ("heron", "kingfisher", "wren", "curlew", "dipper", "plover", "egret", "swift")
_PLACES = ("the north pond", "the reed bed", "the old weir", "the alder wood", "the shingle bank")


def opening() -> list[dict[str, Any]]:
    """The session's first messages: a short system prompt and the task."""
    return [
        {"role": "system", "content": "You are a field assistant. Read the notebook pages and answer briefly."},
        {"role": "user", "content": f"Read the {STEPS} pages of my bird notebook and tell me what stands out."},
    ]


def notebook_page(page: int, lines: int = 8) -> str:
    """One notebook page: plain sentences (cheap for a small model to read), its page number first."""
    out = [f"Notebook page {page}."]
    for line in range(lines):
        bird = _BIRDS[(page * 3 + line) % len(_BIRDS)]
        place = _PLACES[(page + line) % len(_PLACES)]
        out.append(f"At {7 + line // 2}:{(line * 7) % 60:02d} I saw a {bird} near {place}, feeding quietly.")
    return "\n".join(out)


def step_messages(page: int, lines: int = 8) -> list[dict[str, Any]]:
    """The agent's scripted step: its tool call (without content, as agents send one) and the tool's output."""
    call_id = f"call_page_{page}"
    arguments = json.dumps({"page": page})
    call = {"id": call_id, "type": "function", "function": {"name": "read_notes", "arguments": arguments}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": notebook_page(page, lines)},
    ]


def local_route(model: LocalModel, *, window: int | None = None, answer_tokens: int = ANSWER_TOKENS) -> ModelRoute:
    """The route a local-model user writes: ``openai/`` with the server's ``api_base`` and its window, a
    short answer, the server's tokenizer for streams without usage, and ``null_content_as_empty`` (SmolLM2's
    chat template concatenates the content: a tool call's null content fails it)."""
    return ModelRoute(
        model_name=MODEL,
        litellm_params={
            "model": f"openai/{model.model}",
            "api_base": model.base_url,
            "api_key": "sk-local-not-checked",
            "max_tokens": answer_tokens,
            "temperature": 0,
        },
        max_input_tokens=window or model.n_ctx,
        max_output_tokens=answer_tokens,
        null_content_as_empty=True,
        tokenizer_url=f"{model.root}/extras/tokenize",
    )


def run_local_demo(data_dir: Path | None) -> int:
    """Run the session against the local model and print one line per turn; returns the exit code."""
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="context-proxy-local-demo-") as scratch:
        folder = data_dir or Path(scratch)
        with serve_local_model(N_CTX) as model:
            up = time.monotonic() - began
            print(f"local model {model.model} at {model.base_url}, n_ctx {model.n_ctx}, up in {up:.0f} s")
            settings = Settings(
                data_dir=folder,
                models=(local_route(model),),
                trace_enabled=True,
                summary_max_attempts=1,
                summary_max_rounds=1,
            )
            from proxy.app import create_app
            from proxy.provider.scripted import serve_in_thread

            with serve_in_thread(create_app(settings)) as proxy_url:
                _play(proxy_url, folder / "context-traces")
    kept = f"store and traces in {folder}" if data_dir else "store and traces were in a temporary folder"
    print(f"done in {time.monotonic() - began:.0f} s; {kept}")
    return 0


def _play(proxy_url: str, traces: Path) -> None:
    messages = opening()
    headers = {"x-session-id": "local-demo"}
    with httpx.Client(base_url=proxy_url, timeout=600) as client:
        for page in range(1, STEPS + 2):
            streamed = page == STEPS + 1
            if not streamed:
                messages += step_messages(page)
            else:
                messages.append({"role": "user", "content": "In one sentence: which bird did I see most?"})
            started = time.monotonic()
            body = {"model": MODEL, "messages": messages, "tools": TOOLS, "stream": streamed}
            answer = _ask(client, body, headers)
            trace = _last_trace(traces)
            print(_turn_line(page, messages, trace, time.monotonic() - started, streamed))
            print(f"         the model: {' '.join(answer.split())[:100]!r}")
            messages.append({"role": "assistant", "content": answer})


def _ask(client: httpx.Client, body: dict[str, Any], headers: dict[str, str]) -> str:
    if not body["stream"]:
        response = client.post("/v1/chat/completions", json=body, headers=headers)
        response.raise_for_status()
        return str(response.json()["choices"][0]["message"].get("content") or "")
    text = []
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:]).get("choices") or []:
                    text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


def _last_trace(traces: Path) -> dict[str, Any]:
    files = sorted(traces.glob("*/turn-*.json"), key=lambda path: path.stat().st_mtime_ns)
    return dict(json.loads(files[-1].read_text())) if files else {}


def _turn_line(page: int, messages: list[dict[str, Any]], trace: dict[str, Any], seconds: float, streamed: bool) -> str:
    sent = (trace.get("llmInput") or {}).get("messages") or []
    text = json.dumps(sent, ensure_ascii=False)
    estimator = (trace.get("budgets") or {}).get("estimator") or {}
    calibration = trace.get("calibration") or {}
    usage = (trace.get("usage") or {}).get("promptTokens")
    compaction = trace.get("compaction") or {}
    summaries = len(trace.get("summarizerCalls") or [])
    rejected = len(compaction.get("rejections") or [])
    return (
        f"turn {page}{' (streamed)' if streamed else ''}: client sent {len(messages)} messages; the server got "
        f"{len(sent)}, {usage if usage is not None else 'no usage'} prompt tokens; "
        f"compaction {compaction.get('reason') or '-'}, {text.count('ref=')} previews, "
        f"checkpoint={'<checkpoint' in text}, {summaries} summary call(s)"
        f"{f' ({rejected} rejected)' if rejected else ''}; calibration from {calibration.get('source', '-')} "
        f"(ratio {estimator.get('ratio')}, {estimator.get('samples')} samples); {seconds:.1f} s"
    )
