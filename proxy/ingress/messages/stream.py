"""Chat completion chunks translated into Anthropic's streamed events, as the official SDKs assemble them.

``message_start``, ``ping``, then per content block ``content_block_start`` / ``content_block_delta``
(``thinking_delta`` and ``signature_delta``, ``text_delta``, ``input_json_delta``) / ``content_block_stop``,
then ``message_delta`` (``stop_reason`` and usage) and ``message_stop``. Blocks are opened in the order
their first piece arrives and closed before the next one opens; the stop reason and the usage arrive
at the end of a chat stream, so ``message_delta`` is sent only when the chunks are exhausted. A proxy
error mid-stream becomes Anthropic's ``error`` event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from proxy.ingress.messages.response import message_id, stop_reason, usage
from proxy.kernel.errors import ProxyError
from proxy.kernel.jsonio import dumps


def sse(event: dict[str, Any]) -> bytes:
    """One server-sent event, named by its ``type`` as Anthropic names them."""
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + dumps(event) + b"\n\n"


class _Blocks:
    """The open content block and the events that open, feed and close blocks."""

    def __init__(self) -> None:
        self.count = 0
        self.open_kind: str | None = None  # "thinking", "text" or "tool:<chat index>"
        self.tool_blocks: dict[int, int] = {}  # chat tool-call index -> content block index

    def close(self) -> list[dict[str, Any]]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [{"type": "content_block_stop", "index": self.count - 1}]

    def open(self, kind: str, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self.close()
        events.append({"type": "content_block_start", "index": self.count, "content_block": block})
        self.open_kind = kind
        self.count += 1
        return events

    def ensure(self, kind: str, block: Callable[[], dict[str, Any]]) -> list[dict[str, Any]]:
        return [] if self.open_kind == kind else self.open(kind, block())

    @property
    def current(self) -> int:
        return self.count - 1


def _delta_events(blocks: _Blocks, delta: dict[str, Any]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    reasoning = delta.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        events += blocks.ensure("thinking", lambda: {"type": "thinking", "thinking": "", "signature": ""})
        events.append(
            {
                "type": "content_block_delta",
                "index": blocks.current,
                "delta": {"type": "thinking_delta", "thinking": reasoning},
            }
        )
    for block in delta.get("thinking_blocks") or []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "redacted_thinking":
            events += blocks.open("redacted", {"type": "redacted_thinking", "data": block.get("data", "")})
            events += blocks.close()
        elif block.get("signature"):
            events += blocks.ensure("thinking", lambda: {"type": "thinking", "thinking": "", "signature": ""})
            signature = {"type": "signature_delta", "signature": block["signature"]}
            events.append({"type": "content_block_delta", "index": blocks.current, "delta": signature})
    text = delta.get("content")
    if isinstance(text, str) and text:
        events += blocks.ensure("text", lambda: {"type": "text", "text": ""})
        events.append(
            {"type": "content_block_delta", "index": blocks.current, "delta": {"type": "text_delta", "text": text}}
        )
    for call in delta.get("tool_calls") or []:
        events += _tool_events(blocks, call)
    return events


def _tool_events(blocks: _Blocks, call: dict[str, Any]) -> list[dict[str, Any]]:
    position = int(call.get("index") or 0)
    function = call.get("function") or {}
    events: list[dict[str, Any]] = []
    if position not in blocks.tool_blocks:
        # The stream serializer sends a call's id and whole name in its first fragment.
        block: dict[str, Any] = {
            "type": "tool_use",
            "id": call.get("id") or "",
            "name": function.get("name") or "",
            "input": {},
        }
        events += blocks.open(f"tool:{position}", block)
        blocks.tool_blocks[position] = blocks.current
    arguments = function.get("arguments")
    if isinstance(arguments, str) and arguments:
        delta = {"type": "input_json_delta", "partial_json": arguments}
        events.append({"type": "content_block_delta", "index": blocks.tool_blocks[position], "delta": delta})
    return events


async def message_events(
    chunks: AsyncIterator[dict[str, Any]],
    model: str,
    render_error: Callable[[ProxyError], dict[str, Any]],
    estimated_input: int = 0,
) -> AsyncIterator[bytes]:
    """The SSE text of an Anthropic stream for these chat chunks; ``render_error`` shapes a mid-stream error.
    ``estimated_input`` is the ``message_start`` input count until the provider's own arrives at the end."""
    blocks = _Blocks()
    started = False
    finish: str | None = None
    final_usage: dict[str, Any] | None = None
    try:
        async for chunk in chunks:
            if not started:
                started = True
                yield sse(_message_start(chunk.get("id"), model, estimated_input))
                yield sse({"type": "ping"})
            if chunk.get("usage"):
                final_usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                for event in _delta_events(blocks, choice.get("delta") or {}):
                    yield sse(event)
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
    except ProxyError as exc:
        yield sse(render_error(exc))
        return
    if not started:
        yield sse(_message_start(None, model, estimated_input))
        yield sse({"type": "ping"})
    for event in blocks.close():
        yield sse(event)
    end_usage = usage(final_usage)
    yield sse(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(finish), "stop_sequence": None},
            "usage": end_usage,
        }
    )
    yield sse({"type": "message_stop"})


async def native_events(
    events: AsyncIterator[dict[str, Any]], render_error: Callable[[ProxyError], dict[str, Any]]
) -> AsyncIterator[bytes]:
    """The provider's own events relayed as they come (native passage); a mid-stream error as Anthropic's
    ``error`` event."""
    try:
        async for event in events:
            yield sse(event)
    except ProxyError as exc:
        yield sse(render_error(exc))


def _message_start(completion_id: str | None, model: str, estimated_input: int) -> dict[str, Any]:
    # The provider's usage arrives with the last chunk; message_delta carries it (the SDKs take
    # input_tokens from there when it is present), message_start the proxy's estimate.
    return {
        "type": "message_start",
        "message": {
            "id": message_id(completion_id),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": estimated_input, "output_tokens": 0},
        },
    }
