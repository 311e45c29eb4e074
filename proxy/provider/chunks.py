"""Streams held back while the proxy decides whether an answer is the client's.

When proxy-owned tools are offered, an answer may be a call the proxy must run itself and never show
the client. Such a stream is read whole first; ``accumulate`` rebuilds the assistant message from its
chunks, and ``synthesize`` writes chunks for an answer the proxy had to change (proxy calls removed).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any


def accumulate(chunks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The assistant message of choice 0 of an OpenAI chunk stream."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(
                    call.get("index", 0), {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                if call.get("id"):
                    slot["id"] = call["id"]
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    return message


def synthesize(template: Sequence[Mapping[str, Any]], message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A chunk stream for ``message``, reusing the envelope (id, model, created) and usage of ``template``."""
    first = next((c for c in template if c.get("choices")), template[0] if template else {})
    envelope = {k: copy.deepcopy(v) for k, v in first.items() if k not in ("choices", "usage")}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            **copy.deepcopy(envelope),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
        }

    out = [chunk({"role": "assistant", "content": message.get("content") or ""})]
    calls = message.get("tool_calls") or []
    for index, call in enumerate(calls):
        out.append(
            chunk(
                {
                    "tool_calls": [
                        {"index": index, "id": call["id"], "type": "function", "function": dict(call["function"])}
                    ]
                }
            )
        )
    out.append(chunk({}, "tool_calls" if calls else "stop"))
    out += [dict(c) for c in template if not c.get("choices") and c.get("usage")]
    return out
