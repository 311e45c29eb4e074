"""Chat answers as Responses API output: the response object, its output items and its usage."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from typing import Any

from proxy.ingress.responses.request import TOOL_SEARCH, ResponsesRequest, ToolMap
from proxy.kernel.native import NATIVE


def new_id(prefix: str) -> str:
    """A fresh item id (``msg_...``, ``fc_...``)."""
    return f"{prefix}_{secrets.token_hex(12)}"


def response_object(
    response_id: str,
    request: ResponsesRequest,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    created_at: int | None = None,
    error: dict[str, Any] | None = None,
    incomplete_reason: str | None = None,
) -> dict[str, Any]:
    """The ``response`` object as the OpenAI SDK parses it; the request's settings are echoed back."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at if created_at is not None else int(time.time()),
        "status": status,
        "model": request.model,
        "output": output,
        "usage": usage,
        "error": error,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": request.instructions,
        "metadata": request.metadata or {},
        "parallel_tool_calls": request.parallel_tool_calls if request.parallel_tool_calls is not None else True,
        "tool_choice": request.tool_choice if request.tool_choice is not None else "auto",
        "tools": request.tools or [],
        "temperature": request.temperature,
        "top_p": request.top_p,
        "max_output_tokens": request.max_output_tokens,
        "previous_response_id": request.previous_response_id,
        "reasoning": request.reasoning,
        "store": request.store if request.store is not None else True,
        "text": request.text or {"format": {"type": "text"}},
        "truncation": "disabled",
    }


def usage_of(chat_usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """Responses usage from chat usage. Codex compares ``input_tokens`` with its compaction limit."""
    usage = chat_usage or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    reasoning = int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }


def reasoning_item(text: str) -> dict[str, Any]:
    """The provider's reasoning text as a reasoning item (a summary: there is no encrypted content)."""
    return {"type": "reasoning", "id": new_id("rs"), "summary": [{"type": "summary_text", "text": text}]}


def message_item(text: str, item_id: str | None = None, status: str = "completed") -> dict[str, Any]:
    """An assistant message item with one output_text part."""
    return {
        "type": "message",
        "id": item_id or new_id("msg"),
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def call_item(call: Mapping[str, Any], tools: ToolMap, item_id: str | None = None) -> dict[str, Any]:
    """A chat tool call as the Responses item of the tool it stands for."""
    function = call.get("function") or {}
    flat = str(function.get("name") or "")
    arguments = str(function.get("arguments") or "")
    call_id = str(call.get("id") or new_id("call"))
    origin = tools.origins.get(flat)
    if origin is not None and origin.kind == "tool_search" and flat == TOOL_SEARCH:
        return {
            "type": "tool_search_call",
            "id": item_id or new_id("ts"),
            "call_id": call_id,
            "arguments": _json_object(arguments),
            "execution": "client",
            "status": "completed",
        }
    if origin is not None and origin.kind == "custom":
        item: dict[str, Any] = {
            "type": "custom_tool_call",
            "id": item_id or new_id("ctc"),
            "call_id": call_id,
            "name": origin.name,
            "input": _freeform_input(arguments),
            "status": "completed",
        }
    else:
        item = {
            "type": "function_call",
            "id": item_id or new_id("fc"),
            "call_id": call_id,
            "name": origin.name if origin is not None else flat,
            "arguments": arguments,
            "status": "completed",
        }
    if origin is not None and origin.namespace:
        item["namespace"] = origin.namespace
    return item


def _json_object(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {"query": arguments}


def _freeform_input(arguments: str) -> str:
    """The ``input`` string of a freeform call; a model that wrote raw text instead of JSON keeps it."""
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    if isinstance(parsed, Mapping) and isinstance(parsed.get("input"), str):
        return str(parsed["input"])
    return arguments


def output_items(message: Mapping[str, Any], tools: ToolMap) -> list[dict[str, Any]]:
    """A chat assistant message as output items: reasoning, then the text, then each call."""
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        items.append(reasoning_item(reasoning))
    content = message.get("content")
    if isinstance(content, str) and content:
        items.append(message_item(content))
    for call in message.get("tool_calls") or []:
        items.append(call_item(call, tools))
    return items


def completion_status(finish_reason: Any) -> tuple[str, str | None]:
    """The response status and incomplete reason for a chat ``finish_reason``."""
    if finish_reason == "length":
        return "incomplete", "max_output_tokens"
    if finish_reason == "content_filter":
        return "incomplete", "content_filter"
    return "completed", None


def assistant_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """The canonical chat assistant message to store for a response (its chain head); a native answer's
    output items go with it (``proxy/kernel/native.py``), so a ``previous_response_id`` continues with them."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": "function",
                "function": {
                    "name": (call.get("function") or {}).get("name"),
                    "arguments": (call.get("function") or {}).get("arguments") or "",
                },
            }
            for call in message["tool_calls"]
        ]
    if NATIVE in message:
        out[NATIVE] = message[NATIVE]
    return out
