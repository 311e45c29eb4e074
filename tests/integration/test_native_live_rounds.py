"""A native stream stays live through a proxy-owned round (``proxy/runtime/rounds.py``), end to end.

The model thinks (reasons), says a line, calls the proxy's ``read_tool_output``; the proxy runs it and asks
again; the model thinks again and calls the client's tool. The client (the official SDK, reading the stream
through its own accumulator) gets one answer: both rounds' thinking with the signatures the provider issued,
the line, its own call, never the proxy's, usage summed over the rounds. Its next request sends that answer
back; the strict stand-ins (a signature binds the calls after its block; an encrypted reasoning item must
come before the item it preceded) must accept what the provider is sent then: the provider's own rounds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from proxy.app import create_app
from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.scripted import serve_in_thread
from proxy.provider.scripted_anthropic import DEFAULT_API_KEY as ANTHROPIC_KEY
from proxy.provider.scripted_anthropic import MessageReply, ScriptedAnthropic, Text, Thinking, ToolUse
from proxy.provider.scripted_responses import DEFAULT_API_KEY as OPENAI_KEY
from proxy.provider.scripted_responses import FunctionCall, Message, Reasoning, ResponseReply, ScriptedResponses

READ = {"ref": "nothing-stored", "query": "step=1"}


def _anthropic_model(body: dict[str, Any]) -> MessageReply:
    text = json.dumps(body["messages"])
    if '"read_tool_output"' not in text:  # the first round: a line, then the proxy's tool
        return MessageReply(
            (Thinking("Check the stored log."), Text("Looking."), ToolUse("read_tool_output", READ)), output_tokens=7
        )
    if '"Bash"' not in text:
        return MessageReply((Thinking("Now run it."), ToolUse("Bash", {"step": 1})), output_tokens=5)
    return MessageReply((Thinking("Done."), Text("Done.")), output_tokens=3)


def _responses_model(body: dict[str, Any]) -> ResponseReply:
    text = json.dumps(body["input"])
    if '"read_tool_output"' not in text:
        return ResponseReply(
            (Reasoning(("Check the log.",)), Message("Looking."), FunctionCall("read_tool_output", READ)),
            output_tokens=11,
        )
    if '"shell"' not in text:
        return ResponseReply((Reasoning(("Now run it.",)), FunctionCall("shell", {"step": 1})), output_tokens=6)
    return ResponseReply((Reasoning(("Done.",)), Message("Done.")))


@pytest.fixture
def anthropic_provider() -> Iterator[tuple[ScriptedAnthropic, str]]:
    stand_in = ScriptedAnthropic(_anthropic_model, accept_bearer=False)
    with serve_in_thread(stand_in.app()) as url:
        yield stand_in, url


@pytest.fixture
def responses_provider() -> Iterator[tuple[ScriptedResponses, str]]:
    stand_in = ScriptedResponses(_responses_model)
    with serve_in_thread(stand_in.app()) as url:
        yield stand_in, url


def _proxy(tmp_path: Any, route: ModelRoute) -> Any:
    return serve_in_thread(create_app(Settings(data_dir=tmp_path / "data", models=(route,))))


def test_a_messages_stream_stays_live_through_a_proxy_round(anthropic_provider, tmp_path) -> None:
    stand_in, url = anthropic_provider
    route = ModelRoute(
        "claude",
        {"model": "anthropic/claude-sonnet-4-5", "api_base": url, "api_key": ANTHROPIC_KEY},
        max_input_tokens=16_000,
        max_output_tokens=4_000,
    )
    tools = [{"name": "Bash", "description": "Run a command", "input_schema": {"type": "object", "properties": {}}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Calibrate the rig."}]
    kwargs: dict[str, Any] = {
        "model": "claude",
        "max_tokens": 8_000,
        "system": "You are Claude Code.",
        "tools": tools,
        "thinking": {"type": "enabled", "budget_tokens": 2000},
        "extra_headers": {"x-session-id": "live-messages"},
    }
    with _proxy(tmp_path, route) as proxy, anthropic.Anthropic(base_url=proxy, api_key="x", max_retries=0) as sdk:
        with sdk.messages.stream(messages=messages, **kwargs) as events:
            kinds = [event.type for event in events]
            first = events.get_final_message()
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]})
        (call,) = [block for block in first.content if block.type == "tool_use"]
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "ok"}]})
        with sdk.messages.stream(messages=messages, **kwargs) as events:
            final = events.get_final_message()

    # One answer, both rounds in it, the proxy's call nowhere.
    assert [block.type for block in first.content] == ["thinking", "text", "thinking", "tool_use"]
    assert call.name == "Bash" and first.stop_reason == "tool_use"
    assert kinds.count("message_start") == 1 and kinds.count("message_stop") == 1
    assert all(block.signature for block in first.content if block.type == "thinking")
    assert first.usage.output_tokens == 7 + 5  # summed over the two rounds
    received = [r.body for r in stand_in.requests if r.path == "/v1/messages"]
    assert len(received) == 3
    # The next turn was accepted (the stand-in refuses a thinking block its signature does not bind), and what
    # the provider got is its own two rounds: the proxy's call and result between them, not the client's merge.
    assert final.content[-1].text == "Done."
    sent = received[2]["messages"]
    assistants = [[block["type"] for block in m["content"]] for m in sent if m["role"] == "assistant"]
    assert assistants == [["thinking", "text", "tool_use"], ["thinking", "tool_use"]]
    assert '"read_tool_output"' in json.dumps(sent)


def test_a_responses_stream_stays_live_through_a_proxy_round(responses_provider, tmp_path) -> None:
    stand_in, url = responses_provider
    route = ModelRoute(
        "codex",
        {"model": "openai/gpt-5-codex", "api_base": f"{url}/v1", "api_key": OPENAI_KEY},
        max_input_tokens=16_000,
        max_output_tokens=4_000,
        configured_api="responses",
    )
    tools = [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}]
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Calibrate the rig."}]
    kwargs: dict[str, Any] = {
        "model": "codex",
        "instructions": "You are Codex.",
        "tools": tools,
        "reasoning": {"effort": "high", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "store": False,
        "extra_headers": {"session-id": "live-responses"},
    }
    with _proxy(tmp_path, route) as proxy, openai.OpenAI(base_url=f"{proxy}/v1", api_key="x", max_retries=0) as sdk:
        with sdk.responses.stream(input=items, **kwargs) as events:
            seen = [event for event in events]
            first = events.get_final_response()
        items += [item.model_dump(exclude_none=True) for item in first.output]
        (call,) = [item for item in first.output if item.type == "function_call"]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "ok"})
        with sdk.responses.stream(input=items, **kwargs) as events:
            final = events.get_final_response()

    assert [item.type for item in first.output] == ["reasoning", "message", "reasoning", "function_call"]
    assert call.name == "shell"
    assert all(item.encrypted_content for item in first.output if item.type == "reasoning")
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    indices = [e.output_index for e in seen if e.type == "response.output_item.added"]
    assert indices == [0, 1, 2, 3]
    assert [e.type for e in seen].count("response.created") == 1
    assert first.usage.output_tokens == 11 + 6  # summed over the two rounds
    assert final.output_text == "Done."
    sent = [r.body for r in stand_in.requests if r.path == "/v1/responses"][2]["input"]
    kinds = [item.get("type") for item in sent]
    # The provider's own rounds: its reasoning before its call, the proxy's result, then the second round.
    assert kinds[-7:] == [
        "reasoning",
        "message",
        "function_call",
        "function_call_output",
        "reasoning",
        "function_call",
        "function_call_output",
    ]
