"""Prompt caching through the proxy, against the strict Anthropic stand-in that caches and bills like Anthropic
(a prefix up to a breakpoint is written at 1.25x and read at 0.1x, nothing under 1,024 tokens, at most four
breakpoints or the request is refused).

Claude Code marks its system prompt and its two newest user messages; the proxy marks where its prompt stays
byte-stable (the system prompt and, once it has compacted, the latest checkpoint) and keeps the client's
newest marks, never more than four. The cache figures reach the client, the trace, ``/metrics`` and the spans.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from proxy.app import create_app
from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.science_script import tool_output
from proxy.provider.scripted import serve_in_thread
from proxy.provider.scripted_anthropic import DEFAULT_API_KEY, MessageReply, ScriptedAnthropic, Text, ToolUse
from tests.integration.conftest import validate_traces
from tests.integration.test_metrics import samples, total

STEPS = 8
MARK = {"type": "ephemeral"}
SYSTEM = [{"type": "text", "text": "You are Claude Code. " + "Follow the house rules. " * 200, "cache_control": MARK}]
TOOLS = [{"name": "Bash", "description": "Run a command", "input_schema": {"type": "object", "properties": {}}}]


def script(body: dict[str, Any]) -> MessageReply:
    step = json.dumps(body["messages"]).count('"tool_use_id"')
    if step >= STEPS:
        return MessageReply((Text("Done."),))
    return MessageReply((ToolUse("Bash", {"step": step + 1}),))


@pytest.fixture
def stand_in() -> Iterator[tuple[ScriptedAnthropic, str]]:
    provider = ScriptedAnthropic(script, accept_bearer=False)
    with serve_in_thread(provider.app()) as url:
        yield provider, url


def with_rolling_marks(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Claude Code's marks: the last block of each of the two newest user messages (the rest unmarked)."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"][-2:]
    out = []
    for i, message in enumerate(messages):
        blocks = [{k: v for k, v in b.items() if k != "cache_control"} for b in message["content"]]
        if i in users:
            blocks[-1] = {**blocks[-1], "cache_control": MARK}
        out.append({**message, "content": blocks})
    return out


def test_marks_stay_within_four_and_the_cache_figures_reach_everyone(stand_in, tmp_path) -> None:
    provider, url = stand_in
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    route = ModelRoute(
        "claude",
        {"model": "anthropic/claude-sonnet-4-5", "api_base": url, "api_key": DEFAULT_API_KEY},
        max_input_tokens=24_000,
        max_output_tokens=4_000,
    )
    settings = Settings(data_dir=tmp_path / "data", models=(route,), trace_enabled=True)
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Calibrate."}]}]
    answers = []
    app = create_app(settings, tracer_provider=tracer_provider)
    with serve_in_thread(app) as proxy, anthropic.Anthropic(base_url=proxy, api_key="x", max_retries=0) as sdk:
        for _ in range(STEPS + 1):
            answer = sdk.messages.create(
                model="claude", max_tokens=1000, system=SYSTEM, messages=with_rolling_marks(messages), tools=TOOLS
            )
            answers.append(answer)
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]})
            calls = [b for b in answer.content if b.type == "tool_use"]
            if not calls:
                break
            results = [
                {"type": "tool_result", "tool_use_id": c.id, "content": tool_output(c.input["step"], 6_000)}
                for c in calls
            ]
            messages.append({"role": "user", "content": results})
        metrics = samples(httpx.get(f"{proxy}/metrics", timeout=30).text)
    tracer_provider.shutdown()

    sent = [r.body for r in provider.requests if r.path == "/v1/messages"]
    assert answers[-1].content[0].text == "Done."
    for body in sent:
        marks = json.dumps(body).count('"cache_control"')
        assert 1 <= marks <= 4  # the stand-in refuses a fifth: every request above was accepted
        assert "cache_control" in body["system"][-1]  # the proxy's breakpoint after the stable part
    assert any("<checkpoint" in json.dumps(body["messages"]) or "ref=" in json.dumps(body["messages"]) for body in sent)
    # The figures reach the client as Anthropic gave them...
    reads = [a.usage.cache_read_input_tokens or 0 for a in answers]
    writes = [a.usage.cache_creation_input_tokens or 0 for a in answers]
    assert sum(writes) > 0 and sum(reads[1:]) > 0
    # ... the trace (every call's usage, checked against the schema) ...
    traces = sorted((tmp_path / "data" / "context-traces").rglob("turn-*.json"))
    recorded = [json.loads(p.read_text()) for p in traces]
    assert validate_traces(tmp_path / "data" / "context-traces") == len(recorded)
    assert sum(t["usage"]["cacheReadTokens"] for t in recorded if "usage" in t) == sum(reads)
    assert sum(t["usage"]["cacheWriteTokens"] for t in recorded if "usage" in t) == sum(writes)
    # ... /metrics ...
    assert total(metrics, "context_proxy_prompt_tokens_total", kind="cache_read") == sum(reads)
    assert total(metrics, "context_proxy_prompt_tokens_total", kind="cache_write") == sum(writes)
    # ... and the spans, under the GenAI conventions' names.
    spans = [s for s in exporter.get_finished_spans() if s.parent is None]
    assert sum(int((s.attributes or {}).get("gen_ai.usage.cache_read.input_tokens", 0)) for s in spans) == sum(reads)


def test_a_chat_client_moving_its_mark_keeps_one_session_and_reads_the_cache(stand_in, tmp_path) -> None:
    """Cline's way to Claude: Chat Completions with ``cache_control`` on the newest message's content part,
    moved every turn. The message the mark left is the same message (no fork), litellm carries the marks to
    Anthropic, and later turns read what earlier ones wrote."""
    import openai

    provider, url = stand_in
    route = ModelRoute(
        "claude",
        {"model": "anthropic/claude-sonnet-4-5", "api_base": url, "api_key": DEFAULT_API_KEY},
        max_input_tokens=200_000,
        max_output_tokens=4_000,
    )
    settings = Settings(data_dir=tmp_path / "data", models=(route,), trace_enabled=True)
    system = {"role": "system", "content": [{"type": "text", "text": SYSTEM[0]["text"], "cache_control": MARK}]}
    history: list[dict[str, Any]] = [{"role": "user", "content": "Calibrate."}]
    tools = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object", "properties": {}}}}]
    usages = []
    with serve_in_thread(create_app(settings)) as proxy, openai.OpenAI(base_url=f"{proxy}/v1", api_key="x") as sdk:
        for _ in range(STEPS + 1):
            last = history[-1]
            text = last["content"] if isinstance(last["content"], str) else None
            moved = (
                [*history[:-1], {**last, "content": [{"type": "text", "text": text, "cache_control": MARK}]}]
                if text
                else history
            )
            answer = sdk.chat.completions.create(
                model="claude", messages=[system, *moved], tools=tools, extra_headers={"x-session-id": "cline-1"}
            )
            usages.append(answer.usage)
            message = answer.choices[0].message
            if not message.tool_calls:
                break
            history.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                step = len([m for m in history if m["role"] == "tool"]) + 1
                history.append({"role": "tool", "tool_call_id": call.id, "content": tool_output(step, 6_000)})
            history.append({"role": "user", "content": "Go on."})
    traces = [json.loads(p.read_text()) for p in sorted((tmp_path / "data" / "context-traces").rglob("turn-*.json"))]
    assert len(traces) >= 3 and not any(t["session"]["forked"] for t in traces)  # one session, however marks move
    for body in (r.body for r in provider.requests if r.path == "/v1/messages"):
        assert 1 <= json.dumps(body).count('"cache_control"') <= 4
    reads = [int((u.model_extra or {}).get("cache_read_input_tokens") or 0) for u in usages]
    assert sum(reads[1:]) > 0  # the cache the earlier turns wrote is read


@pytest.mark.parametrize("ingress", ["messages", "chat"])
def test_without_a_session_id_a_moving_mark_keeps_one_session(stand_in, tmp_path, ingress) -> None:
    """No session header or field: the session is the fingerprint of the first system and user message, which
    the client marked while it was among the newest and unmarks after (Claude Code's two newest user
    messages; a chat client's newest). The fingerprint reads past the mark: one session, never forked."""
    import openai

    provider, url = stand_in
    route = ModelRoute(
        "claude",
        {"model": "anthropic/claude-sonnet-4-5", "api_base": url, "api_key": DEFAULT_API_KEY},
        max_input_tokens=200_000,
        max_output_tokens=4_000,
    )
    settings = Settings(data_dir=tmp_path / "data", models=(route,), trace_enabled=True)
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Calibrate."}]}]
    chat: list[dict[str, Any]] = [{"role": "user", "content": "Calibrate."}]
    system = {"role": "system", "content": [{"type": "text", "text": SYSTEM[0]["text"], "cache_control": MARK}]}
    chat_tools = [
        {"type": "function", "function": {"name": "Bash", "parameters": {"type": "object", "properties": {}}}}
    ]
    with (
        serve_in_thread(create_app(settings)) as proxy,
        anthropic.Anthropic(base_url=proxy, api_key="x", max_retries=0) as claude,
        openai.OpenAI(base_url=f"{proxy}/v1", api_key="x", max_retries=0) as client,
    ):
        for turn in range(4):
            if ingress == "messages":
                answer = claude.messages.create(
                    model="claude", max_tokens=100, system=SYSTEM, messages=with_rolling_marks(messages), tools=TOOLS
                )
                messages.append(
                    {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]}
                )
                calls = [b for b in answer.content if b.type == "tool_use"]
                messages.append(
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": c.id, "content": "ok"} for c in calls],
                    }
                )
                continue
            last = chat[-1]
            newest = {**last, "content": [{"type": "text", "text": last["content"], "cache_control": MARK}]}
            reply = client.chat.completions.create(
                model="claude", messages=[system, *chat[:-1], newest], tools=chat_tools
            )
            message = reply.choices[0].message
            chat.append(message.model_dump(exclude_none=True))
            chat += [{"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in message.tool_calls or []]
            chat.append({"role": "user", "content": f"Go on ({turn})."})
    sessions = [p for p in (tmp_path / "data" / "context-traces").iterdir() if p.is_dir()]
    traces = [json.loads(p.read_text()) for p in sorted((tmp_path / "data" / "context-traces").rglob("turn-*.json"))]
    assert len(sessions) == 1 and sessions[0].name.startswith("fp-")
    assert len(traces) == 4 and not any(t["session"]["forked"] for t in traces)
    assert len([r for r in provider.requests if r.path == "/v1/messages"]) == 4
