"""Prompt-cache breakpoints on a chat call to an Anthropic route (litellm turns a part's ``cache_control``
into Anthropic's): the proxy's after the stable part, the client's kept where they fit (``kernel/cache_marks.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.kernel.cache_marks import CACHE_MARK, EPHEMERAL, Mark, kept


def marked_for_anthropic(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None, breakpoints: Sequence[int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """``messages`` and ``tools`` with the proxy's breakpoints after ``breakpoints`` (message indices) and at
    most four marks in all; the lists and what changes are copies, the rest is shared."""
    out = list(messages)
    for index in breakpoints:
        if 0 <= index < len(out):
            out[index] = _marked_at_end(out[index])
    tool_list = list(tools) if tools is not None else None
    places: list[tuple[str, int, int]] = []  # ("tool", i, -1), ("part", message, part), ("message", message, -1)
    marks: list[Mark] = []
    for i, tool in enumerate(tool_list or []):
        if CACHE_MARK in tool:
            places.append(("tool", i, -1))
            marks.append(Mark(proxy=False, tool=True))
    for i, message in enumerate(out):
        content = message.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, Mapping) and CACHE_MARK in part:
                    places.append(("part", i, j))
                    marks.append(Mark(proxy=i in breakpoints and j == len(content) - 1))
        if CACHE_MARK in message:
            places.append(("message", i, -1))
            marks.append(Mark(proxy=i in breakpoints and not isinstance(content, list)))
    for (kind, i, j), stays in zip(places, kept(marks), strict=True):
        if stays:
            continue
        if kind == "tool" and tool_list is not None:
            tool_list[i] = _unmarked(tool_list[i])
        elif kind == "message":
            out[i] = _unmarked(out[i])
        else:
            parts = list(out[i]["content"])
            parts[j] = _unmarked(parts[j])
            out[i] = {**out[i], "content": parts}
    return out, tool_list


def _marked_at_end(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with a breakpoint on its last content part (a string content becomes one text part). A tool
    message keeps its string: litellm puts a tool message's own ``cache_control`` on its ``tool_result``, so
    its bytes stay those of the turns it is not marked on (a mark moved on would otherwise change the
    prompt where it was)."""
    content = message.get("content")
    if isinstance(content, str) and message.get("role") == "tool":
        return message if CACHE_MARK in message else {**message, CACHE_MARK: dict(EPHEMERAL)}
    if isinstance(content, str):
        return {**message, "content": [{"type": "text", "text": content, CACHE_MARK: dict(EPHEMERAL)}]}
    if isinstance(content, list) and content and isinstance(content[-1], Mapping):
        if CACHE_MARK in content[-1]:
            return message
        return {**message, "content": [*content[:-1], {**content[-1], CACHE_MARK: dict(EPHEMERAL)}]}
    return message


def _unmarked(item: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in item.items() if key != CACHE_MARK}
