"""A Responses answer as the server-sent events the API streams it in, each with its ``sequence_number``.

``response.created`` and ``response.in_progress`` (the response in progress, no output yet), then per
output item ``response.output_item.added``, the item's own events and ``response.output_item.done``:
a reasoning item's summary parts (``reasoning_summary_part.added``, ``reasoning_summary_text.delta``s and
``.done``, ``reasoning_summary_part.done``); a message's ``content_part.added``, ``output_text.delta``s,
``output_text.annotation.added``s, ``output_text.done`` and ``content_part.done``; a function call's
``function_call_arguments.delta``s and ``.done``; a custom tool call's ``custom_tool_call_input`` ones; a
web search's ``web_search_call.in_progress``/``.searching``/``.completed``. Last ``response.completed``
(or ``response.incomplete``) with the whole response. The official SDK rebuilds the non-streamed answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

PIECE = 12


def sse(event: dict[str, Any]) -> str:
    """One server-sent event, named by its type as the API names it."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


def _pieces(text: str) -> list[str]:
    return [text[start : start + PIECE] for start in range(0, len(text), PIECE)]


def _started(item: dict[str, Any]) -> dict[str, Any]:
    """The item as ``output_item.added`` shows it: nothing generated yet."""
    kind = item["type"]
    if kind == "reasoning":
        return {"id": item["id"], "type": "reasoning", "summary": []}
    if kind == "message":
        return {**item, "status": "in_progress", "content": []}
    if kind == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    if kind == "custom_tool_call":
        return {**item, "input": ""}
    return {**item, "status": "in_progress"}


def _item_events(index: int, item: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The events of one output item between its ``added`` and its ``done``, without sequence numbers."""
    at = {"item_id": item["id"], "output_index": index}
    kind = item["type"]
    if kind == "reasoning":
        for number, part in enumerate(item["summary"]):
            yield {
                "type": "response.reasoning_summary_part.added",
                **at,
                "summary_index": number,
                "part": {**part, "text": ""},
            }
            for piece in _pieces(part["text"]):
                yield {"type": "response.reasoning_summary_text.delta", **at, "summary_index": number, "delta": piece}
            yield {"type": "response.reasoning_summary_text.done", **at, "summary_index": number, "text": part["text"]}
            yield {"type": "response.reasoning_summary_part.done", **at, "summary_index": number, "part": part}
    elif kind == "message":
        for number, part in enumerate(item["content"]):
            where = {**at, "content_index": number}
            yield {"type": "response.content_part.added", **where, "part": {**part, "text": "", "annotations": []}}
            for piece in _pieces(part["text"]):
                yield {"type": "response.output_text.delta", **where, "delta": piece, "logprobs": []}
            for position, annotation in enumerate(part["annotations"]):
                yield {
                    "type": "response.output_text.annotation.added",
                    **where,
                    "annotation_index": position,
                    "annotation": annotation,
                }
            yield {"type": "response.output_text.done", **where, "text": part["text"], "logprobs": []}
            yield {"type": "response.content_part.done", **where, "part": part}
    elif kind == "function_call":
        for piece in _pieces(item["arguments"]):
            yield {"type": "response.function_call_arguments.delta", **at, "delta": piece}
        yield {"type": "response.function_call_arguments.done", **at, "arguments": item["arguments"]}
    elif kind == "custom_tool_call":
        for piece in _pieces(item["input"]):
            yield {"type": "response.custom_tool_call_input.delta", **at, "delta": piece}
        yield {"type": "response.custom_tool_call_input.done", **at, "input": item["input"]}
    elif kind == "web_search_call":
        for phase in ("in_progress", "searching", "completed"):
            yield {"type": f"response.web_search_call.{phase}", **at}


def response_events(response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The events that stream ``response``, a complete non-streamed answer, numbered from 0."""
    in_progress = {**response, "status": "in_progress", "output": [], "usage": None, "completed_at": None}
    in_progress["incomplete_details"] = None

    def events() -> Iterator[dict[str, Any]]:
        yield {"type": "response.created", "response": in_progress}
        yield {"type": "response.in_progress", "response": in_progress}
        for index, item in enumerate(response["output"]):
            yield {"type": "response.output_item.added", "output_index": index, "item": _started(item)}
            yield from _item_events(index, item)
            yield {"type": "response.output_item.done", "output_index": index, "item": item}
        final = "response.completed" if response["status"] == "completed" else f"response.{response['status']}"
        yield {"type": final, "response": response}

    for number, event in enumerate(events()):
        yield {**event, "sequence_number": number}
