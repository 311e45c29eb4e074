"""``POST /v1/messages`` through the official ``anthropic`` SDK against the real proxy and the scripted provider."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from proxy.provider.scripted import Reply, ToolCall
from tests.integration.conftest import MODEL, ProxyHandle

TOOLS: list[Any] = [
    {
        "name": "measure",
        "description": "Measure a sample.",
        "input_schema": {"type": "object", "properties": {"sample": {"type": "string"}}, "required": ["sample"]},
    }
]


def client(proxy: ProxyHandle, key: str = "sk-client") -> anthropic.Anthropic:
    return proxy.anthropic_client(api_key=key)


def traces(proxy: ProxyHandle, context_id: str) -> list[dict[str, Any]]:
    folder = Path(proxy.settings.data_dir) / "context-traces" / context_id
    return [json.loads(path.read_text()) for path in sorted(folder.glob("turn-*.json"))]


def test_create_returns_an_anthropic_message_and_sends_the_provider_the_chat_form(start_proxy, provider):
    provider.script(lambda body: Reply(content="Hello from the model."))
    proxy = start_proxy(trace_enabled=True)
    message = client(proxy).messages.create(
        extra_headers={"x-session-id": "s-create"},
        model=MODEL,
        max_tokens=300,
        system=[{"type": "text", "text": "You are a lab agent.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}],
        stop_sequences=["STOP"],
        extra_body={"temperature": 0.5},
        metadata={"user_id": "user-7"},
    )
    assert message.type == "message"
    assert message.role == "assistant"
    assert message.model == MODEL
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "Hello from the model."  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    sent = provider.history[-1]
    assert sent["max_tokens"] == 300
    assert sent["stop"] == ["STOP"]
    assert sent["temperature"] == 0.5
    (trace,) = traces(proxy, "s-create")
    assert trace["llmInput"]["user"] == "user-7"  # litellm does not pass it on to an openai/ route
    assert trace["ingress"] == {"api": "anthropic-messages"}
    assert "You are a lab agent." in sent["messages"][0]["content"]
    assert sent["messages"][-1]["role"] == "user"
    assert "Say hello." in json.dumps(sent["messages"][-1])


def test_tool_use_round_trip_non_streamed(start_proxy, provider):
    def script(body: dict[str, Any]) -> Reply:
        if any(m["role"] == "tool" for m in body["messages"]):
            return Reply(content="The sample weighs 3 g.")
        return Reply(tool_calls=(ToolCall("measure", {"sample": "A1"}, id="toolu_1"),))

    provider.script(script)
    proxy = start_proxy()
    sdk = client(proxy)
    first = sdk.messages.create(
        model=MODEL, max_tokens=200, tools=TOOLS, messages=[{"role": "user", "content": "Weigh A1."}]
    )
    assert first.stop_reason == "tool_use"
    tool_use = first.content[-1]
    assert tool_use.type == "tool_use"
    assert (tool_use.id, tool_use.name, tool_use.input) == ("toolu_1", "measure", {"sample": "A1"})
    assert provider.history[-1]["tools"][0]["function"]["name"] == "measure"
    second = sdk.messages.create(
        model=MODEL,
        max_tokens=200,
        tools=TOOLS,
        tool_choice={"type": "any"},
        messages=[
            {"role": "user", "content": "Weigh A1."},
            {"role": "assistant", "content": [block.model_dump() for block in first.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 g", "is_error": False},
                    {"type": "text", "text": "Report it."},
                ],
            },
        ],
    )
    assert second.content[0].text == "The sample weighs 3 g."  # type: ignore[union-attr]
    sent = provider.history[-1]
    roles = [m["role"] for m in sent["messages"]]
    assert roles[-3:] == ["assistant", "tool", "user"]
    assert sent["messages"][-2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "3 g"}
    assert sent["messages"][-3]["tool_calls"][0]["function"] == {"name": "measure", "arguments": '{"sample": "A1"}'}
    assert sent["tool_choice"] == "required"


def test_stream_text_assembles_in_the_sdk(start_proxy, provider):
    provider.script(lambda body: Reply(content="A streamed answer that is longer than sixteen characters."))
    proxy = start_proxy()
    with client(proxy).messages.stream(
        model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "Stream please."}]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].text == "A streamed answer that is longer than sixteen characters."  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
    assert provider.history[-1]["stream"] is True


def test_stream_tool_use_assembles_in_the_sdk(start_proxy, provider):
    provider.script(
        lambda body: Reply(content="Measuring.", tool_calls=(ToolCall("measure", {"sample": "B2" * 20}, id="toolu_9"),))
    )
    proxy = start_proxy()
    with client(proxy).messages.stream(
        model=MODEL, max_tokens=100, tools=TOOLS, messages=[{"role": "user", "content": "Weigh B2."}]
    ) as stream:
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["text", "tool_use"]
    assert final.content[0].text == "Measuring."  # type: ignore[union-attr]
    call = final.content[1]
    assert (call.id, call.name, call.input) == ("toolu_9", "measure", {"sample": "B2" * 20})  # type: ignore[union-attr]
    assert final.stop_reason == "tool_use"


def test_raw_stream_events_are_in_anthropic_order(start_proxy, provider):
    provider.script(lambda body: Reply(content="ok", tool_calls=(ToolCall("measure", {"sample": "C"}, id="toolu_2"),)))
    proxy = start_proxy()
    body = {
        "model": MODEL,
        "max_tokens": 50,
        "stream": True,
        "tools": TOOLS,
        "messages": [{"role": "user", "content": "go"}],
    }
    with httpx.Client(base_url=proxy.url) as http:
        response = http.post("/v1/messages?beta=true", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("event: ") for line in response.text.splitlines() if line.startswith("event: ")]
    # "ok" arrives in one text delta; the arguments '{"sample": "C"}' in two fragments of 12 characters.
    assert events == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    data = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    assert data[5]["content_block"] == {"type": "tool_use", "id": "toolu_2", "name": "measure", "input": {}}
    assert "".join(d["delta"]["partial_json"] for d in data[6:8]) == '{"sample": "C"}'
    assert data[9]["delta"]["stop_reason"] == "tool_use"
    assert data[9]["usage"]["output_tokens"] > 0


@pytest.mark.parametrize("path", ["/v1/messages/count_tokens", "/messages/count_tokens"])
def test_count_tokens_estimates_the_translated_request(start_proxy, provider, path):
    proxy = start_proxy()
    with httpx.Client(base_url=proxy.url) as http:
        small = http.post(path, json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert small.status_code == 200
    big = client(proxy).messages.count_tokens(
        model=MODEL, tools=TOOLS, messages=[{"role": "user", "content": "hi " * 2000}]
    )
    assert 0 < small.json()["input_tokens"] < 50
    assert big.input_tokens > small.json()["input_tokens"] + 1000
    assert provider.history == []  # a count never calls the model


def test_count_tokens_uses_the_routes_calibrated_estimator(start_proxy, provider):
    import tiktoken

    from proxy.provider.scripted import Reply

    provider.script(lambda body: Reply(content="ok"))
    provider.provider.token_scale = 1.3
    proxy = start_proxy(mode="dynamic")
    text = "describe the titration curve. " * 400
    tokens = len(tiktoken.get_encoding("o200k_base").encode(text))
    count = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    with httpx.Client(base_url=proxy.url) as http:
        before = http.post("/v1/messages/count_tokens", json=count).json()["input_tokens"]
        for index in range(10):  # answers that report usage teach the route its ratio
            proxy.client().chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"question {index}: {text}"}]
            )
        after = http.post("/v1/messages/count_tokens", json=count).json()["input_tokens"]
    # Before any sample: tiktoken times the 1.25 start margin (the conservative estimator gave ~1.9x).
    assert 1.2 * tokens <= before <= 1.3 * tokens
    # After: the provider's 1.3x and a small margin, never under what the provider will count.
    assert 1.3 * tokens <= after <= 1.4 * tokens


def test_a_claude_code_session_resends_its_history_and_is_served_from_what_the_proxy_kept(
    start_proxy, provider, monkeypatch
):
    """Claude Code's body opens with its model and the whole conversation; the next call resends it. The
    ingress takes the resent messages from the request they repeat (not decoded again), and the rest of
    the body as sent: a system prompt changed after them reaches the provider, as do the new messages."""
    from proxy.edge.resent_requests import ResentRequests

    taken: list[int] = []  # how many leading messages each request took from the one it repeats
    decode = ResentRequests.decode

    def observed(self: ResentRequests, raw: bytes) -> Any:
        decoded = decode(self, raw)
        taken.append(decoded.resent)
        return decoded

    monkeypatch.setattr(ResentRequests, "decode", observed)
    provider.script(lambda body: Reply(content="Noted."))
    proxy = start_proxy()
    history: list[Any] = [{"role": "user", "content": "Weigh the samples."}]
    for n in range(5):
        call = {"type": "tool_use", "id": f"toolu_{n}", "name": "measure", "input": {"sample": f"A{n}"}}
        history += [
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": f"{n} g"}]},
        ]

    def send(messages: list[Any], system: str) -> None:
        body = {"model": MODEL, "messages": messages, "system": system, "tools": TOOLS, "max_tokens": 50}
        answered = httpx.post(
            f"{proxy.url}/v1/messages",
            content=json.dumps(body),  # in Claude Code's order: model and messages first
            headers={"x-api-key": "sk-client", "content-type": "application/json", "x-session-id": "s-resent"},
        )
        assert answered.status_code == 200, answered.text

    send(history, "You are a lab agent.")
    later = [*history, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Now sum them."}]
    send(later, "You are a lab agent. Sum in grams.")
    assert taken == [0, len(history)]
    sent = provider.history[-1]
    assert "Sum in grams." in sent["messages"][0]["content"]
    assert [m["role"] for m in sent["messages"][1:]] == ["user", *["assistant", "tool"] * 5, "assistant", "user"]
    assert [m["tool_call_id"] for m in sent["messages"] if m["role"] == "tool"] == [f"toolu_{n}" for n in range(5)]
    assert sent["messages"][-1] == {"role": "user", "content": "Now sum them."}
