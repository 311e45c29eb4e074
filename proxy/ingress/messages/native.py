"""Native passage for the Messages API: the assembled chat messages rendered back into an Anthropic request,
and Anthropic's answer read back for the turn service (``proxy/runtime/native.py``: the codec port).

The request is the client's own body with the conversation replaced: every other field (``thinking``,
``top_k``, ``output_config``, ``service_tier``, ``metadata``, ``stop_sequences``, ``tool_choice``, fields
of newer betas) passes as the client sent it; only ``context_management`` is left out, the proxy's own
assembly superseding it. Messages the assembly left as they were are sent as the blocks the client sent
(``proxy/kernel/native.py``: signed thinking, server-tool blocks, citations and cache marks byte for
byte); messages it wrote or changed (the system prompt's sections, a preview, a checkpoint, call-local
context) are rendered from their chat form. Consecutive user-side messages (tool results, the user's
text, the proxy's hidden messages) make one Anthropic user message, as Anthropic requires. The tools are
the client's own definitions, server tools included, in the client's order, then the proxy's.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from proxy.ingress.messages.request import assistant_message
from proxy.ingress.messages.response import tool_input
from proxy.ingress.messages.rounds import AnthropicRoundRelay
from proxy.kernel.cache_marks import CACHE_MARK, EPHEMERAL, Mark, kept
from proxy.kernel.config import ModelRoute
from proxy.kernel.errors import InvalidRequest
from proxy.kernel.native import native_parts, with_native
from proxy.runtime.native import NativeRequest
from proxy.runtime.rounds import ROUND_LIMIT_NOTICE, RoundRelay

# Fields the proxy sets (or supersedes) rather than passing on.
_CONVERSATION = frozenset({"model", "messages", "system", "tools", "stream"})
_SUPERSEDED = frozenset({"context_management"})
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
}
PROXY_MARK = "__proxy"  # tells the proxy's own cache marks apart while the body is rendered; never sent


class AnthropicCodec:
    """Renders and reads Anthropic Messages for one request on one route."""

    def __init__(self, raw: Mapping[str, Any], model: str, max_tokens: int | None) -> None:
        self._raw = raw  # the client's request as it sent it (validated; its server tools the route allows)
        self._model = model  # what the provider calls the model (the route's, without litellm's prefix)
        self._max_tokens = max_tokens  # the client's, clamped to the route's output limit

    def body(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        *,
        stream: bool,
        breakpoints: Collection[int] = (),
    ) -> dict[str, Any]:
        """The Anthropic request: the client's fields, the model, the conversation and the tools, with the
        proxy's cache breakpoints after ``breakpoints`` (message indices) and at most four in all."""
        body: dict[str, Any] = {}
        for key, value in self._raw.items():
            if key == "model":
                body["model"] = self._model
            elif key in _SUPERSEDED or key in ("system", "messages", "tools", "stream"):
                continue
            elif key == "max_tokens" and self._max_tokens is not None:
                body[key] = self._max_tokens
            else:
                body[key] = copy.deepcopy(value)
        system, conversation = render_messages(messages, breakpoints)
        if system:
            body["system"] = self._marked(system)
        body["messages"] = conversation
        rendered_tools = self._tools(tools or [])
        if rendered_tools:
            body["tools"] = rendered_tools
        else:
            body.pop("tools", None)
            body.pop("tool_choice", None)
        if stream:
            body["stream"] = True
        elif "stream" in self._raw:
            body["stream"] = False  # this call is not streamed, whatever the client's request was
        return within_breakpoint_limit(body)

    def chat_view(self, response: Mapping[str, Any]) -> dict[str, Any]:
        """Anthropic's answer as a chat completion, its blocks kept with the message."""
        content = response.get("content") if isinstance(response.get("content"), list) else []
        message, _ = assistant_message(list(content or []))
        with_native(message, "messages", list(content or []))
        usage = response.get("usage") or {}
        read = int(usage.get("cache_read_input_tokens") or 0)
        written = int(usage.get("cache_creation_input_tokens") or 0)
        prompt = int(usage.get("input_tokens") or 0) + read + written
        completion = int(usage.get("output_tokens") or 0)
        return {
            "id": response.get("id"),
            "object": "chat.completion",
            "created": 0,
            "model": response.get("model"),
            "choices": [
                {"index": 0, "message": message, "finish_reason": _FINISH.get(str(response.get("stop_reason")), "stop")}
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": read},
                "cache_read_input_tokens": read,
                "cache_creation_input_tokens": written,
            },
        }

    def response_of(self, events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The message a stream's events make (``message_start``, the blocks' starts, deltas and stops,
        ``message_delta``)."""
        message: dict[str, Any] = {}
        partial: dict[int, str] = {}
        for event in events:
            kind = event.get("type")
            if kind == "message_start":
                message = copy.deepcopy(dict(event.get("message") or {}))
                message["content"] = []
            elif kind == "content_block_start":
                blocks: list[dict[str, Any]] = message.setdefault("content", [])
                index = int(event.get("index") or 0)
                while len(blocks) <= index:
                    blocks.append({})
                blocks[index] = copy.deepcopy(dict(event.get("content_block") or {}))
            elif kind == "content_block_delta":
                index = int(event.get("index") or 0)
                _apply_delta(message["content"][index], event.get("delta") or {}, partial, index)
            elif kind == "content_block_stop":
                index = int(event.get("index") or 0)
                if index in partial:
                    block = message["content"][index]
                    block["input"] = json.loads(partial.pop(index) or "{}")
            elif kind == "message_delta":
                message.update(event.get("delta") or {})
                if event.get("usage"):
                    message["usage"] = {**(message.get("usage") or {}), **event["usage"]}
        return message

    def events_of(self, response: Mapping[str, Any]) -> list[dict[str, Any]]:
        """An answer as the events Anthropic streams it with."""
        start = {key: copy.deepcopy(value) for key, value in response.items() if key not in ("content", "stop_reason")}
        start.update(content=[], stop_reason=None, stop_sequence=None)
        usage = dict(response.get("usage") or {})
        start["usage"] = {**usage, "output_tokens": min(1, int(usage.get("output_tokens") or 0))}
        events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
        for index, block in enumerate(response.get("content") or []):
            events += _block_events(index, block)
        delta = {"stop_reason": response.get("stop_reason"), "stop_sequence": response.get("stop_sequence")}
        events.append(
            {"type": "message_delta", "delta": delta, "usage": {"output_tokens": usage.get("output_tokens", 0)}}
        )
        events.append({"type": "message_stop"})
        return events

    def without_tools(self, response: Mapping[str, Any], names: frozenset[str]) -> dict[str, Any]:
        """The answer without its ``tool_use`` blocks of ``names``."""
        out = copy.deepcopy(dict(response))
        content = [b for b in out.get("content") or [] if not (b.get("type") == "tool_use" and b.get("name") in names)]
        if not any(b.get("type") == "tool_use" for b in content) and out.get("stop_reason") == "tool_use":
            out["stop_reason"] = "end_turn"
        if not any(b.get("type") in ("text", "tool_use") for b in content):
            content.append({"type": "text", "text": ROUND_LIMIT_NOTICE})
        out["content"] = content
        return out

    def round_relay(self, proxy_tools: frozenset[str]) -> RoundRelay:
        """A stream's rounds relayed as one message (``ingress/messages/rounds.py``)."""
        return AnthropicRoundRelay(self, proxy_tools)

    def _marked(self, system: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rendered system prompt, carrying the cache mark the client put on its own system prompt (its
        blocks became the prompt's sections, so the mark goes on the prompt's last block)."""
        raw = self._raw.get("system")
        marks = (
            [b["cache_control"] for b in raw if isinstance(b, Mapping) and b.get("cache_control")]
            if isinstance(raw, list)
            else []
        )
        if marks and system and "cache_control" not in system[-1]:
            system[-1] = {**system[-1], "cache_control": copy.deepcopy(marks[-1])}
        return system

    def _tools(self, offered: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The client's tools in its order (its server tools; its own tools the assembly offers), then the
        tools only the proxy offers."""
        names = {str((tool.get("function") or {}).get("name")) for tool in offered}
        out: list[dict[str, Any]] = []
        own: set[str] = set()
        for tool in self._raw.get("tools") or []:
            if is_server_tool(tool):
                out.append(copy.deepcopy(dict(tool)))
            elif tool.get("name") in names:
                out.append(copy.deepcopy(dict(tool)))
                own.add(str(tool["name"]))
        for tool in offered:
            function = tool.get("function") or {}
            if function.get("name") in own:
                continue
            rendered: dict[str, Any] = {"name": function.get("name"), "input_schema": function.get("parameters") or {}}
            if function.get("description"):
                rendered["description"] = function["description"]
            out.append(rendered)
        return out


def render_messages(
    messages: Sequence[Mapping[str, Any]], breakpoints: Collection[int] = ()
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``system`` blocks and the Anthropic ``messages`` of a chat conversation; the last block of each
    message at ``breakpoints`` (indices of ``messages``) carries the proxy's cache mark."""
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    pending: list[Any] = []  # the user side's parts until the next assistant message

    def flush() -> None:
        if pending:
            out.append({"role": "user", "content": _content(pending)})
            pending.clear()

    for index, message in enumerate(messages):
        role = message.get("role")
        marked = index in breakpoints
        if role in ("system", "developer") and not out and not pending:
            system += _marked_last(_system_blocks(message), marked)
        elif role == "assistant":
            flush()
            parts = native_parts(message, "messages") or _assistant_blocks(message)
            if parts:
                out.append({"role": "assistant", "content": _content(_marked_last(parts, marked))})
        elif role == "tool":
            pending += _marked_last(native_parts(message, "messages") or [_tool_result(message)], marked)
        else:  # user, and a system/developer message after the conversation began (Anthropic has no such role)
            parts = native_parts(message, "messages") or _text_blocks(message.get("content"))
            pending += _marked_last(parts, marked)
    flush()
    return system, out


def _marked_last(parts: list[Any], marked: bool) -> list[Any]:
    """``parts`` with the proxy's cache mark on the last one (a copy), when ``marked``."""
    if not marked or not parts:
        return parts
    last = parts[-1]
    block = {"type": "text", "text": last} if isinstance(last, str) else dict(last)
    block[CACHE_MARK] = {**EPHEMERAL, PROXY_MARK: True}
    return [*parts[:-1], block]


def within_breakpoint_limit(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with at most four cache marks (``kernel/cache_marks.py``: the proxy's stay, the client's newest
    message marks next), the proxy's own marks cleaned of the flag that told them apart. A block whose mark
    changes is replaced by a copy: the others may be the client's own (a message's native parts)."""
    places: list[tuple[list[Any], int, Mark]] = []  # the list holding a marked block, its index, whose mark
    tools = body.get("tools")
    for index, tool in enumerate(tools if isinstance(tools, list) else []):
        if isinstance(tool, dict) and CACHE_MARK in tool:
            places.append((tools, index, Mark(proxy=False, tool=True)))  # type: ignore[arg-type]
    holders = [body["system"]] if isinstance(body.get("system"), list) else []
    holders += [m["content"] for m in body.get("messages") or [] if isinstance(m.get("content"), list)]
    for holder in holders:
        for index, block in enumerate(holder):
            if isinstance(block, dict) and isinstance(block.get(CACHE_MARK), dict):
                places.append((holder, index, Mark(proxy=bool(block[CACHE_MARK].get(PROXY_MARK)))))
    for (holder, index, mark), stays in zip(places, kept([mark for _, _, mark in places]), strict=True):
        block = dict(holder[index])
        given = block.pop(CACHE_MARK)
        if stays:
            block[CACHE_MARK] = {key: value for key, value in given.items() if key != PROXY_MARK}
        if stays and not mark.proxy:
            continue  # the client's, as it came
        holder[index] = block
    return body


def _content(parts: list[Any]) -> str | list[Any]:
    """One string part as the string it was; otherwise blocks (a string part as a text block)."""
    if len(parts) == 1 and isinstance(parts[0], str):
        return parts[0]
    return [{"type": "text", "text": part} if isinstance(part, str) else part for part in parts]


def _system_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    parts = native_parts(message, "messages")
    if parts is not None:
        return [{"type": "text", "text": p} if isinstance(p, str) else dict(p) for p in parts]
    return _text_blocks(message.get("content"))


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    """Chat content as Anthropic text (and image) blocks, cache marks kept."""
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    blocks: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "text":
            block: dict[str, Any] = {"type": "text", "text": part.get("text", "")}
        elif part.get("type") == "image_url":
            block = _image_block(str((part.get("image_url") or {}).get("url", "")))
        else:
            continue
        if part.get("cache_control") is not None:
            block["cache_control"] = part["cache_control"]
        blocks.append(block)
    return blocks


def _image_block(url: str) -> dict[str, Any]:
    if url.startswith("data:") and ";base64," in url:
        media, data = url[5:].split(";base64,", 1)
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _assistant_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An assistant message the proxy wrote or changed: its thinking, text and tool calls as blocks."""
    blocks: list[dict[str, Any]] = [dict(b) for b in message.get("thinking_blocks") or [] if isinstance(b, Mapping)]
    blocks += [b for b in _text_blocks(message.get("content")) if b.get("type") == "text" and b.get("text")]
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": tool_input(function.get("arguments")),
            }
        )
    return blocks


def _tool_result(message: Mapping[str, Any]) -> dict[str, Any]:
    """A tool message the proxy wrote or changed (a preview, a proxy tool's result) as a ``tool_result``."""
    content = message.get("content")
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.get("tool_call_id")}
    result["content"] = content if isinstance(content, str) else _text_blocks(content)
    if message.get("cache_control") is not None:
        result["cache_control"] = message["cache_control"]
    return result


def is_server_tool(tool: Any) -> bool:
    """An Anthropic server tool (``web_search_20250305``, ...): it runs at the provider, not the client."""
    return isinstance(tool, Mapping) and tool.get("type") not in (None, "custom")


def _apply_delta(block: dict[str, Any], delta: Mapping[str, Any], partial: dict[int, str], index: int) -> None:
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + str(delta.get("text", ""))
    elif kind == "input_json_delta":
        partial[index] = partial.get(index, "") + str(delta.get("partial_json", ""))
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
    elif kind == "signature_delta":
        block["signature"] = block.get("signature", "") + str(delta.get("signature", ""))
    elif kind == "citations_delta":
        block.setdefault("citations", []).append(delta.get("citation"))


def _block_events(index: int, block: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One content block as its start, deltas and stop."""
    kind = block.get("type")
    start = copy.deepcopy(dict(block))
    deltas: list[dict[str, Any]] = []
    if kind == "text":
        start["text"] = ""
        start.pop("citations", None)
        if block.get("citations"):
            start["citations"] = []
            deltas += [{"type": "citations_delta", "citation": c} for c in block["citations"]]
        deltas.append({"type": "text_delta", "text": block.get("text", "")})
    elif kind == "thinking":
        start.update(thinking="", signature="")
        deltas.append({"type": "thinking_delta", "thinking": block.get("thinking", "")})
        deltas.append({"type": "signature_delta", "signature": block.get("signature", "")})
    elif kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
        start["input"] = {}
        deltas.append({"type": "input_json_delta", "partial_json": json.dumps(block.get("input") or {})})
    events: list[dict[str, Any]] = [{"type": "content_block_start", "index": index, "content_block": start}]
    events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
    events.append({"type": "content_block_stop", "index": index})
    return events


# Betas the proxy's own context assembly supersedes: Anthropic's context editing would edit a history the
# proxy already assembled (and the client's own context_management field is left out with them).
SUPERSEDED_BETAS = ("context-management-",)


def native_request(
    raw: Mapping[str, Any], route: ModelRoute, headers: Mapping[str, str], max_tokens: int | None, notes: dict[str, Any]
) -> NativeRequest:
    """The native passage of a Messages request on a ``messages`` route: the codec, and the Anthropic headers
    to forward (``anthropic-version``; ``anthropic-beta`` without the betas the proxy supersedes or the route
    does not allow, named in ``notes``). A server tool the route does not allow is refused."""
    allowed = route.allowed_server_tools
    for index, tool in enumerate(raw.get("tools") or []):
        if allowed is not None and is_server_tool(tool) and not ({tool.get("name"), tool.get("type")} & allowed):
            raise InvalidRequest(
                f"tools.{index}: the server tool {tool.get('name')!r} ({tool.get('type')}) is not allowed on the "
                f"model {route.model_name!r} (its route's allowed_server_tools).",
                param=f"tools.{index}",
                code="server_tool_not_allowed",
            )
    forwarded: dict[str, str] = {}
    if headers.get("anthropic-version"):
        forwarded["anthropic-version"] = headers["anthropic-version"]
    betas = [b.strip() for b in (headers.get("anthropic-beta") or "").split(",") if b.strip()]
    kept = [
        b
        for b in betas
        if not b.startswith(SUPERSEDED_BETAS) and (route.allowed_betas is None or b in route.allowed_betas)
    ]
    if kept:
        forwarded["anthropic-beta"] = ",".join(kept)
    if len(kept) < len(betas):
        notes["betasNotForwarded"] = [b for b in betas if b not in kept]
    if "context_management" in raw:
        notes.setdefault("notForwarded", {})["context_management"] = "superseded by the proxy's own context assembly"
    for key in ("droppedServerTools", "droppedServerBlocks", "ignoredFields"):
        notes.pop(key, None)  # the chat translation's losses: native passage sends them all
    notes["passage"] = "native"
    notes["forwardedHeaders"] = sorted(forwarded)
    model = route.litellm_model.split("/", 1)[1] if "/" in route.litellm_model else route.litellm_model
    interleaved = any(b.startswith("interleaved-thinking") for b in kept)
    raw = _thinking_within(raw, max_tokens, interleaved, notes)
    return NativeRequest("messages", AnthropicCodec(raw, model, max_tokens), forwarded)


# Anthropic's smallest thinking budget: below it a request with thinking enabled is refused.
MIN_THINKING_BUDGET = 1024


def _thinking_within(
    raw: Mapping[str, Any], max_tokens: int | None, interleaved: bool, notes: dict[str, Any]
) -> Mapping[str, Any]:
    """``raw`` with its thinking budget brought under ``max_tokens`` when the proxy clamped that to the route's
    output limit: Anthropic refuses a budget not below ``max_tokens`` (unless interleaved thinking spreads it
    over a tool loop), so the clamp alone would turn a request the client could send into a refusal. The
    change is named in the trace (``thinkingBudgetClamped``)."""
    thinking = raw.get("thinking")
    requested = raw.get("max_tokens")
    if (
        interleaved
        or max_tokens is None
        or not isinstance(requested, int)
        or max_tokens >= requested  # not clamped: the client's own numbers, whatever they are
        or not isinstance(thinking, Mapping)
        or thinking.get("type") != "enabled"
    ):
        return raw
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or budget < max_tokens or max_tokens - 1 < MIN_THINKING_BUDGET:
        return raw
    notes["thinkingBudgetClamped"] = {"requested": budget, "sent": max_tokens - 1}
    return {**raw, "thinking": {**thinking, "budget_tokens": max_tokens - 1}}
