"""An Anthropic message as the server-sent events the Messages API streams it in.

The sequence is the real one: ``message_start`` (empty content, no stop reason), a ``ping``, then per
content block ``content_block_start``, its deltas and ``content_block_stop``, then ``message_delta``
(stop reason and the final usage) and ``message_stop``. Text arrives in ``text_delta`` pieces after its
``citations_delta``s, a tool call's input as ``input_json_delta`` pieces (an empty one first, as the API
sends), thinking as ``thinking_delta`` pieces and its signature last in one ``signature_delta``; redacted
thinking and server tool results come whole in their start event. The SDK's accumulator rebuilds from
these exactly the blocks of the non-streamed answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

TEXT_PIECE = 16
THINKING_PIECE = 24
JSON_PIECES = 3


def sse(event: str, data: dict[str, Any]) -> str:
    """One server-sent event, named as Anthropic names it."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _pieces(text: str, size: int) -> list[str]:
    return [text[start : start + size] for start in range(0, len(text), size)]


def _block_events(index: int, block: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    kind = block["type"]

    def delta(payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": payload}

    if kind == "text":
        start: dict[str, Any] = {"type": "text", "text": ""}
        if block.get("citations"):
            start["citations"] = []
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": start}
        for citation in block.get("citations") or []:
            yield delta({"type": "citations_delta", "citation": citation})
        for piece in _pieces(block["text"], TEXT_PIECE):
            yield delta({"type": "text_delta", "text": piece})
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": start}
        for piece in _pieces(block["thinking"], THINKING_PIECE):
            yield delta({"type": "thinking_delta", "thinking": piece})
        yield delta({"type": "signature_delta", "signature": block["signature"]})
    elif kind in {"tool_use", "server_tool_use"}:
        start = {**block, "input": {}}
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": start}
        arguments = json.dumps(block["input"], ensure_ascii=False)
        size = max(1, -(-len(arguments) // JSON_PIECES))
        for piece in ["", *_pieces(arguments, size)] if block["input"] else [""]:
            yield delta({"type": "input_json_delta", "partial_json": piece})
    else:  # redacted_thinking, web_search_tool_result: sent whole
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
    yield "content_block_stop", {"type": "content_block_stop", "index": index}


def message_events(message: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The (event name, data) pairs that stream ``message``, a complete non-streamed answer."""
    usage = message["usage"]
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1},  # the API's start carries the count so far, not the total
    }
    yield "message_start", {"type": "message_start", "message": start}
    yield "ping", {"type": "ping"}
    for index, block in enumerate(message["content"]):
        yield from _block_events(index, block)
    final_usage = {
        key: usage[key]
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")
    }
    if "server_tool_use" in usage:
        final_usage["server_tool_use"] = usage["server_tool_use"]
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
            "usage": final_usage,
        },
    )
    yield "message_stop", {"type": "message_stop"}
