"""A chat completion translated back into an Anthropic ``message`` (the non-streamed answer).

The stop reason and usage mappings live here too: the stream translation uses the same ones.
"""

from __future__ import annotations

import json
from typing import Any

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def stop_reason(finish_reason: str | None) -> str:
    """Anthropic's ``stop_reason`` for a chat ``finish_reason`` (a missing one reads as a normal end)."""
    return _STOP_REASONS.get(finish_reason or "stop", "end_turn")


def message_id(completion_id: str | None) -> str:
    """An Anthropic-looking message id derived from the completion's id (stable for one answer)."""
    tail = "".join(ch for ch in (completion_id or "") if ch.isalnum() or ch in "_-") or "proxy"
    return tail if tail.startswith("msg_") else f"msg_{tail}"


def usage(chat_usage: dict[str, Any] | None) -> dict[str, Any]:
    """Anthropic's usage from chat usage. Anthropic's ``input_tokens`` excludes cache reads and writes,
    while litellm's ``prompt_tokens`` includes them; the provider's count is what Claude Code tracks."""
    chat_usage = chat_usage or {}
    details = chat_usage.get("prompt_tokens_details") or {}
    read = int(chat_usage.get("cache_read_input_tokens") or details.get("cached_tokens") or 0)
    written = int(chat_usage.get("cache_creation_input_tokens") or 0)
    prompt = int(chat_usage.get("prompt_tokens") or 0)
    return {
        "input_tokens": max(0, prompt - read - written),
        "output_tokens": int(chat_usage.get("completion_tokens") or 0),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
    }


def tool_input(arguments: str | None) -> dict[str, Any]:
    """A tool call's arguments as the ``input`` object Anthropic's ``tool_use`` needs."""
    try:
        parsed = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def thinking_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The answer's reasoning as Anthropic blocks: litellm's ``thinking_blocks`` when the provider gave
    them (they carry the signatures), else ``reasoning_content`` as one unsigned thinking block."""
    blocks = message.get("thinking_blocks") or []
    out: list[dict[str, Any]] = []
    for block in blocks:
        if block.get("type") == "redacted_thinking":
            out.append({"type": "redacted_thinking", "data": block.get("data", "")})
        elif block.get("type") == "thinking":
            out.append(
                {"type": "thinking", "thinking": block.get("thinking", ""), "signature": block.get("signature") or ""}
            )
    if not out and message.get("reasoning_content"):
        out.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    return out


def to_message(response: dict[str, Any], model: str) -> dict[str, Any]:
    """The Anthropic message for a chat completion; ``model`` is the name the client asked for."""
    choice = (response.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = thinking_blocks(message)
    text = message.get("content")
    if isinstance(text, list):
        text = "".join(part.get("text", "") for part in text if isinstance(part, dict))
    if text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or "",
                "name": function.get("name") or "",
                "input": tool_input(function.get("arguments")),
            }
        )
    return {
        "id": message_id(response.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(choice.get("finish_reason")),
        "stop_sequence": None,
        "usage": usage(response.get("usage")),
    }
