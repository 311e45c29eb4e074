"""The requests Claude Code 2.1.197 really sent (tests/data/agents/claude-code-2.1.197), replayed through the
proxy to a native ``anthropic/`` route in front of the strict Anthropic stand-in.

The first request of each capture is sent as Claude Code sent it. Its second carries the capture server's
answer, which the stand-in did not issue and which opens with text although thinking is on: Anthropic
refuses that history ("a final assistant message must start with a thinking block"), and so does the
stand-in. So the session goes on the way Claude Code would go on with the stand-in: the second request is
the captured one with the stand-in's streamed answer (signed thinking, its tool call) in place of the
captured answer, and the tool result naming the stand-in's call. Every request must be accepted, and the
stand-in must receive the native fields the capture carries: thinking, output_config, metadata, max_tokens,
every tool as Claude Code defined it, the betas (all but context management, which the proxy's own
assembly supersedes), and the signed thinking back, byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.kernel.config import ModelRoute
from proxy.provider.scripted import serve_in_thread
from proxy.provider.scripted_anthropic import DEFAULT_API_KEY, MessageReply, ScriptedAnthropic, Text, Thinking, ToolUse

CAPTURES = Path(__file__).parents[1] / "data" / "agents" / "claude-code-2.1.197"
SKIPPED_HEADERS = {"host", "content-length", "connection", "accept-encoding"}
SUPERSEDED_BETA = "context-management-2025-06-27"
FINAL = "The command printed: hello"


def capture(name: str) -> dict[str, Any]:
    return json.loads((CAPTURES / name).read_text())


def bash_input(folder: str) -> dict[str, Any]:
    """The Bash call the capture server made, as Claude Code sent it back."""
    assistant = next(m for m in capture(f"{folder}03-messages.json")["body"]["messages"] if m["role"] == "assistant")
    return next(block["input"] for block in assistant["content"] if block["type"] == "tool_use")


def claude_model(folder: str) -> Any:
    """Thinks, then calls Bash as the capture server did; once the result is back, thinks and answers."""
    call = bash_input(folder)

    def script(body: dict[str, Any]) -> MessageReply:
        last = body["messages"][-1]["content"]
        if isinstance(last, list) and any(block.get("type") == "tool_result" for block in last):
            return MessageReply((Thinking("The command ran and printed hello."), Text(FINAL)))
        return MessageReply((Thinking("Run the command with Bash."), Text("I'll run it."), ToolUse("Bash", call)))

    return script


@pytest.fixture
def stand_in(request: pytest.FixtureRequest) -> Iterator[tuple[ScriptedAnthropic, str, str]]:
    """The stand-in playing the capture in folder ``request.param``: it, its URL and the folder."""
    anthropic = ScriptedAnthropic(claude_model(request.param), accept_bearer=False)
    with serve_in_thread(anthropic.app()) as url:
        yield anthropic, url, request.param


def replay(http: httpx.Client, recorded: dict[str, Any], body: dict[str, Any] | None = None) -> httpx.Response:
    headers = {k: v for k, v in recorded["headers"].items() if k.lower() not in SKIPPED_HEADERS}
    headers["x-api-key"] = "cc-key"  # the proxy's master key: the provider must get the route's own key
    return http.request(recorded["method"], recorded["path"], json=body or recorded.get("body"), headers=headers)


def sse_events(text: str) -> list[dict[str, Any]]:
    events = []
    for frame in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines())
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"]
        events.append(data)
    return events


def message_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The content blocks a stream's events build, as Claude Code's SDK accumulates them."""
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    for event in events:
        if event["type"] == "content_block_start":
            blocks.append(dict(event["content_block"]))
        elif event["type"] == "content_block_delta":
            block, delta = blocks[event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] += delta["signature"]
            elif delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif event["type"] == "content_block_stop" and event["index"] in partial:
            blocks[event["index"]]["input"] = json.loads(partial.pop(event["index"]))
    return blocks


def continued(recorded: dict[str, Any], answer: list[dict[str, Any]]) -> dict[str, Any]:
    """The captured second request with the stand-in's answer in place of the capture server's, and the tool
    result naming the stand-in's call: what Claude Code would have sent after that answer."""
    body = json.loads(json.dumps(recorded["body"]))
    messages = body["messages"]
    index = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    call = next(block for block in answer if block["type"] == "tool_use")
    messages[index] = {"role": "assistant", "content": answer}
    for block in messages[index + 1]["content"]:
        if block["type"] == "tool_result":
            block["tool_use_id"] = call["id"]
    return body


@pytest.mark.parametrize("stand_in", ["", "sonnet-4-5/"], indirect=True, ids=["opus-4-8-adaptive", "sonnet-4-5-budget"])
def test_a_claude_code_session_passes_natively_with_every_field_it_sent(stand_in, start_proxy):
    anthropic, url, folder = stand_in
    first, second = capture(f"{folder}02-messages.json"), capture(f"{folder}03-messages.json")
    sent_first = first["body"]
    model = sent_first["model"]
    route = ModelRoute(
        model,
        {"model": f"anthropic/{model}", "api_base": url, "api_key": DEFAULT_API_KEY},
        max_input_tokens=200_000,
        max_output_tokens=64_000,
    )
    proxy = start_proxy(models=(route,), master_key="cc-key", trace_enabled=True)
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        assert replay(http, capture(f"{folder}01-root.json")).status_code == 404  # HEAD /: nothing to forward
        answer = replay(http, first)
        assert answer.status_code == 200, answer.text
        events = sse_events(answer.text)
        assert [e["type"] for e in events][-2:] == ["message_delta", "message_stop"]
        blocks = message_of(events)
        assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
        assert blocks[0]["signature"] and blocks[2]["input"] == bash_input(folder)
        final = replay(http, second, continued(second, blocks))
        assert final.status_code == 200, final.text
        closing = message_of(sse_events(final.text))
        assert [b["type"] for b in closing] == ["thinking", "text"] and closing[1]["text"] == FINAL

    received = [r for r in anthropic.requests if r.path == "/v1/messages"]
    assert len(received) == 2 and anthropic.requests == received  # no refusal, nothing else asked
    betas = [b for b in first["headers"]["anthropic-beta"].split(",") if b != SUPERSEDED_BETA]
    for request_, captured in zip(received, (sent_first, second["body"]), strict=True):
        body = request_.body
        assert request_.header("x-api-key") == DEFAULT_API_KEY and request_.header("authorization") is None
        assert request_.header("anthropic-version") == "2023-06-01"
        assert request_.header("anthropic-beta") == ",".join(betas)
        for field in ("thinking", "metadata", "max_tokens", "output_config", "stream"):
            assert body.get(field) == captured.get(field), field
        assert body["model"] == model and "context_management" not in body
        assert body["tools"][: len(captured["tools"])] == captured["tools"]  # each as Claude Code defined it
        assert json.dumps(captured["messages"][0]["content"][-1]["text"]) in json.dumps(body["messages"])
        # Claude Code's mid-conversation system message (opus) is the proxy's to place: in the system prompt.
        for message in captured["messages"]:
            if message["role"] == "system":
                assert message["content"][:200] in body["system"][-1]["text"]
                assert all(m["role"] in ("user", "assistant") for m in body["messages"])
    # The answer the stand-in signed went back to it as it was issued, thinking first.
    (assistant,) = [m for m in received[1].body["messages"] if m["role"] == "assistant"]
    assert assistant["content"] == blocks
    trace = json.loads(next((proxy.settings.data_dir / "context-traces").glob("*/turn-0001.json")).read_text())
    assert trace["ingress"]["passage"] == "native" and trace["ingress"]["betasNotForwarded"] == [SUPERSEDED_BETA]
