"""Chat chunks -> Anthropic stream events (proxy/ingress/messages/stream.py): thinking, usage, errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from proxy.ingress.messages.errors import error_body
from proxy.ingress.messages.stream import message_events
from proxy.kernel.errors import ProviderError


def chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage:
        out["usage"] = usage
    return out


async def events_of(chunks: list[dict[str, Any]], fail: bool = False) -> list[dict[str, Any]]:
    async def source() -> AsyncIterator[dict[str, Any]]:
        for item in chunks:
            yield item
        if fail:
            raise ProviderError("upstream broke", status=503)

    pieces = [piece async for piece in message_events(source(), "m", error_body, estimated_input=42)]
    text = b"".join(pieces).decode()
    return [json.loads(frame.split("data: ", 1)[1]) for frame in text.strip().split("\n\n")]


async def test_thinking_then_text_with_signature_and_usage():
    events = await events_of(
        [
            chunk({"role": "assistant", "reasoning_content": "hmm"}),
            chunk(
                {
                    "reasoning_content": " ok",
                    "thinking_blocks": [{"type": "thinking", "thinking": "", "signature": "sig"}],
                }
            ),
            chunk({"content": "Answer"}),
            chunk({}, finish="length"),
            {
                "id": "chatcmpl-1",
                "choices": [],
                "usage": {"prompt_tokens": 100, "completion_tokens": 7, "cache_read_input_tokens": 60},
            },
        ]
    )
    assert [e["type"] for e in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0]["message"]["usage"]["input_tokens"] == 42
    assert events[2]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert [e["delta"] for e in events[3:6]] == [
        {"type": "thinking_delta", "thinking": "hmm"},
        {"type": "thinking_delta", "thinking": " ok"},
        {"type": "signature_delta", "signature": "sig"},
    ]
    assert events[8]["delta"] == {"type": "text_delta", "text": "Answer"}
    assert events[8]["index"] == 1
    assert events[10]["delta"]["stop_reason"] == "max_tokens"
    assert events[10]["usage"] == {
        "input_tokens": 40,
        "output_tokens": 7,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 60,
    }


async def test_a_mid_stream_failure_ends_in_an_anthropic_error_event():
    events = await events_of([chunk({"content": "partial"})], fail=True)
    assert events[-1] == {"type": "error", "error": {"type": "overloaded_error", "message": "upstream broke"}}
    assert "message_stop" not in [e["type"] for e in events]
