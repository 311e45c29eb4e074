"""The requests Claude Code 2.1.197 really sent (tests/data/agents/claude-code-2.1.197), replayed through the
proxy in front of the scripted provider, asserting on what Claude Code would receive and the provider got."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.kernel.config import ModelRoute
from proxy.provider.scripted import Reply, ToolCall
from tests.integration.conftest import route_to

CAPTURES = Path(__file__).parents[1] / "data" / "agents" / "claude-code-2.1.197"
SKIPPED_HEADERS = {"host", "content-length", "connection", "accept-encoding"}


def claude_route(url: str, name: str) -> ModelRoute:
    """A Claude-sized window: Claude Code's 24 tools and prompt alone are ~34k estimated tokens."""
    return dataclasses.replace(route_to(url, name=name), max_input_tokens=200_000, max_output_tokens=32_000)


def capture(name: str) -> dict[str, Any]:
    return json.loads((CAPTURES / name).read_text())


def replay(http: httpx.Client, recorded: dict[str, Any], key: str) -> httpx.Response:
    headers = {k: v for k, v in recorded["headers"].items() if k.lower() not in SKIPPED_HEADERS}
    headers["x-api-key"] = key
    return http.request(recorded["method"], recorded["path"], json=recorded.get("body"), headers=headers)


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for frame in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def bash_call(first: dict[str, Any]) -> ToolCall:
    """The tool call the capture server answered with, as Claude Code echoed it back in its next request."""
    assistant = next(m for m in capture(first)["body"]["messages"] if m["role"] == "assistant")
    use = next(block for block in assistant["content"] if block["type"] == "tool_use")
    return ToolCall(use["name"], use["input"], id=use["id"])


def script_for(folder: str):
    call = bash_call(f"{folder}03-messages.json")

    def script(body: dict[str, Any]) -> Reply:
        if any(m["role"] == "tool" for m in body["messages"]):
            return Reply(content="The command printed: hello")
        return Reply(content="I'll run the command.", tool_calls=(call,))

    return script


@pytest.mark.parametrize("folder", ["", "sonnet-4-5/"])
def test_claude_code_session_replays_to_a_tool_call_and_a_final_answer(start_proxy, provider, folder):
    first, second = capture(f"{folder}02-messages.json"), capture(f"{folder}03-messages.json")
    model = first["body"]["model"]
    provider.script(script_for(folder))
    proxy = start_proxy(models=(claude_route(provider.url, name=model),), master_key="cc-key", trace_enabled=True)
    session = first["headers"]["X-Claude-Code-Session-Id"]
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        assert replay(http, capture(f"{folder}01-root.json"), "cc-key").status_code == 404  # HEAD /: fine
        answer = replay(http, first, "cc-key")
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith("text/event-stream")
        assert answer.headers["x-context-id"] == session
        events = sse_events(answer.text)
        kinds = [kind for kind, _ in events]
        assert kinds[:2] == ["message_start", "ping"]
        assert kinds[-2:] == ["message_delta", "message_stop"]
        starts = [data["content_block"] for kind, data in events if kind == "content_block_start"]
        call = bash_call(f"{folder}03-messages.json")
        assert starts == [
            {"type": "text", "text": ""},
            {"type": "tool_use", "id": call.id, "name": "Bash", "input": {}},
        ]
        arguments = "".join(
            data["delta"]["partial_json"]
            for kind, data in events
            if data.get("delta", {}).get("type") == "input_json_delta"
        )
        assert json.loads(arguments) == call.arguments
        assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
        assert events[0][1]["message"]["model"] == model

        final = replay(http, second, "cc-key")
        assert final.status_code == 200, final.text
        text = "".join(
            data["delta"].get("text", "") for kind, data in sse_events(final.text) if kind == "content_block_delta"
        )
        assert text == "The command printed: hello"
        assert sse_events(final.text)[-2][1]["delta"]["stop_reason"] == "end_turn"

    sent = provider.history[0]
    # Claude Code's tools, then the proxy's reader (offered in every session that works with tools).
    assert sorted(tool["function"]["name"] for tool in sent["tools"]) == sorted(
        [*(t["name"] for t in first["body"]["tools"]), "read_tool_output"]
    )
    assert "context_management" not in sent and "thinking" not in sent and "output_config" not in sent
    assert sent["stream"] is True
    task = first["body"]["messages"][0]["content"][-1]["text"]
    assert task in json.dumps(sent["messages"])
    # The second request is the same session: its tool result reaches the provider after the call.
    tool_messages = [m for m in provider.history[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [call.id]
    trace = json.loads((proxy.settings.data_dir / "context-traces" / session / "turn-0001.json").read_text())
    assert trace["contextIdSource"] == "header:x-claude-code-session-id"
    assert trace["ingress"]["notForwarded"]["context_management"] == "superseded by the proxy's own context assembly"
    assert trace["ingress"]["notForwarded"]["thinking"] == "the route's provider is not Anthropic"
    assert "forwardedHeaders" not in trace["ingress"]  # an openai/ route never sees Anthropic's betas


def test_claude_code_mid_conversation_system_message_reaches_the_system_prompt(start_proxy, provider):
    first = capture("02-messages.json")
    system_text = next(m["content"] for m in first["body"]["messages"] if m["role"] == "system")
    proxy = start_proxy(models=(claude_route(provider.url, name=first["body"]["model"]),))
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        assert replay(http, first, "any").status_code == 200
    sent = provider.history[0]["messages"]
    assert [m["role"] for m in sent].count("system") == 1
    assert system_text[:200] in sent[0]["content"]


def test_claude_code_overflow_capture_answer_is_what_the_proxy_says(start_proxy, provider):
    """The capture server's overflow answer is what Claude Code recognized; the proxy's has the same form."""
    recorded = capture("error-overflow/02-messages.json")
    provider.script(lambda body: Reply(content="never"), context_window=5)
    proxy = start_proxy(models=(claude_route(provider.url, name=recorded["body"]["model"]),))
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        answer = replay(http, recorded, "any")
    expected = recorded["response"]
    assert answer.status_code == expected["status"] == 400
    assert answer.json()["type"] == "error"
    assert answer.json()["error"]["type"] == expected["body"]["error"]["type"]
    assert answer.json()["error"]["message"].startswith("prompt is too long: ")
    assert answer.json()["error"]["message"].endswith(" tokens > 5 maximum")
