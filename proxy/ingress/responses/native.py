"""Native passage for the Responses API: the assembled chat messages rendered back into a Responses request,
and the provider's answer read back for the turn service (``proxy/runtime/native.py``: the codec port).

The request is the client's own body with the conversation replaced: ``reasoning``, ``include``,
``store`` (false stays false), ``prompt_cache_key``, ``safety_identifier``, ``service_tier``, ``text``,
``parallel_tool_calls``, ``max_output_tokens``, ``tool_choice`` and the rest pass as the client sent
them; ``previous_response_id`` does not (the proxy resolves it from its own store and sends the whole
input). Items the assembly left as they were are sent as the client sent them (reasoning items with their
``encrypted_content`` in place, hosted-tool calls, the client's own call and output items); what it wrote
or changed (the system prompt as ``instructions``, a preview, a checkpoint, call-local context) is
rendered from its chat form. The tools are the client's own, hosted ones included, in its order, then
the proxy's.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from proxy.ingress.responses.request import HOSTED_TOOL_TYPES, TOOL_SEARCH, ToolMap, translate_input
from proxy.ingress.responses.rounds import ResponsesRoundRelay
from proxy.kernel.config import ModelRoute
from proxy.kernel.errors import InvalidRequest
from proxy.kernel.native import native_parts, with_native
from proxy.runtime.native import NativeRequest
from proxy.runtime.rounds import RoundRelay

_OWN = frozenset({"model", "input", "instructions", "tools", "stream", "previous_response_id"})
_CALLS = frozenset({"function_call", "custom_tool_call", "tool_search_call"})
_DONE = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponsesCodec:
    """Renders and reads the Responses API for one request on one route."""

    def __init__(self, raw: Mapping[str, Any], model: str, tools: ToolMap, max_output_tokens: int | None) -> None:
        self._raw = raw  # the client's request as it sent it (validated)
        self._model = model  # what the provider calls the model
        self._tools = tools  # the chat functions the client's tools became, and where each came from
        self._max_output_tokens = max_output_tokens  # the client's, clamped to the route's output limit

    def body(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        *,
        stream: bool,
        breakpoints: Collection[int] = (),
    ) -> dict[str, Any]:
        """The Responses request: the client's fields, the model, the conversation and the tools
        (``breakpoints`` means nothing here: OpenAI caches prefixes without marks)."""
        body: dict[str, Any] = {}
        for key, value in self._raw.items():
            if key == "model":
                body["model"] = self._model
            elif key in _OWN:
                continue
            elif key == "max_output_tokens" and self._max_output_tokens is not None:
                body[key] = self._max_output_tokens
            else:
                body[key] = copy.deepcopy(value)
        instructions, items = render_input(messages, self._tools)
        if instructions is not None:
            body["instructions"] = instructions
        body["input"] = items
        rendered = self._rendered_tools(tools or [])
        if rendered:
            body["tools"] = rendered
        else:
            body.pop("tools", None)
            body.pop("tool_choice", None)
        if stream:
            body["stream"] = True
        elif "stream" in self._raw:
            body["stream"] = False  # this call is not streamed, whatever the client's request was
        return body

    def chat_view(self, response: Mapping[str, Any]) -> dict[str, Any]:
        """The provider's response as a chat completion, its output items kept with the message."""
        output = [item for item in response.get("output") or [] if isinstance(item, Mapping)]
        message = self._message(output)
        usage = response.get("usage") or {}
        prompt = int(usage.get("input_tokens") or 0)
        completion = int(usage.get("output_tokens") or 0)
        cached = int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
        reasoning = int((usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0)
        return {
            "id": response.get("id"),
            "object": "chat.completion",
            "created": 0,
            "model": response.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(response, output)}],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached},
                "completion_tokens_details": {"reasoning_tokens": reasoning},
            },
        }

    def response_of(self, events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The response a stream ends with (``response.completed``, ``.incomplete`` or ``.failed``); a stream cut
        before it makes an incomplete one of the items it finished."""
        for event in reversed(events):
            if event.get("type") in _DONE and isinstance(event.get("response"), Mapping):
                return copy.deepcopy(dict(event["response"]))
        created: Mapping[str, Any] = next((e["response"] for e in events if e.get("type") == "response.created"), {})
        done = [e["item"] for e in events if e.get("type") == "response.output_item.done" and "item" in e]
        return {**copy.deepcopy(dict(created)), "status": "incomplete", "output": copy.deepcopy(done)}

    def events_of(self, response: Mapping[str, Any]) -> list[dict[str, Any]]:
        """A response as the events the Responses API streams it with."""
        start = {**copy.deepcopy(dict(response)), "status": "in_progress", "output": []}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": start},
            {"type": "response.in_progress", "response": start},
        ]
        for index, item in enumerate(response.get("output") or []):
            events += _item_events(index, item)
        terminal = "response.completed" if response.get("status", "completed") == "completed" else "response.incomplete"
        events.append({"type": terminal, "response": copy.deepcopy(dict(response))})
        return [{**event, "sequence_number": number} for number, event in enumerate(events)]

    def without_tools(self, response: Mapping[str, Any], names: frozenset[str]) -> dict[str, Any]:
        """The response without its calls of the tools ``names`` (by the chat names the model was offered)."""
        out = copy.deepcopy(dict(response))
        kept = []
        for item in out.get("output") or []:
            if item.get("type") == "function_call" and self.call_name(item) in names:
                continue
            kept.append(item)
        out["output"] = kept
        return out

    def round_relay(self, proxy_tools: frozenset[str]) -> RoundRelay:
        """A stream's rounds relayed as one response (``ingress/responses/rounds.py``)."""
        return ResponsesRoundRelay(self, proxy_tools)

    def call_name(self, item: Mapping[str, Any]) -> str:
        """The chat name of a call item's tool (what the proxy's tools are known by)."""
        return self._tools.flat_name(str(item.get("name", "")), item.get("namespace"))

    def _message(self, output: list[Mapping[str, Any]]) -> dict[str, Any]:
        """The assistant message the output items make, as the same items would make it in the next request."""
        try:
            messages = translate_input(output, self._tools, {}, native=True).messages
        except InvalidRequest:  # an item type the proxy does not know: keep it all, natively
            messages = []
        assistants = [m for m in messages if m.get("role") == "assistant"]
        if len(assistants) == 1 and len(messages) == 1:
            return assistants[0]
        text = "".join(
            part.get("text", "")
            for item in output
            if item.get("type") == "message"
            for part in item.get("content") or []
            if isinstance(part, Mapping)
        )
        return with_native({"role": "assistant", "content": text}, "responses", [dict(item) for item in output])

    def _rendered_tools(self, offered: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The client's tools in its order (hosted ones; its own the assembly offers), then the proxy's."""
        names = {str((tool.get("function") or {}).get("name")) for tool in offered}
        out: list[dict[str, Any]] = []
        for tool in self._raw.get("tools") or []:
            kind = tool.get("type")
            if kind == "namespace":
                inner = [
                    t
                    for t in tool.get("tools") or []
                    if self._tools.flat_name(str(t.get("name")), tool.get("name")) in names
                ]
                if inner:
                    out.append({**copy.deepcopy(dict(tool)), "tools": copy.deepcopy(inner)})
            elif kind == TOOL_SEARCH:
                if TOOL_SEARCH in names:
                    out.append(copy.deepcopy(dict(tool)))
            elif kind in ("function", "custom"):
                if tool.get("name") in names:
                    out.append(copy.deepcopy(dict(tool)))
            else:  # hosted tools: they run at the provider
                out.append(copy.deepcopy(dict(tool)))
        for tool in offered:
            function = tool.get("function") or {}
            name = str(function.get("name"))
            if name in self._tools.origins:
                continue  # the client's (listed above, or found by its own tool_search: in the history)
            rendered: dict[str, Any] = {
                "type": "function",
                "name": name,
                "parameters": function.get("parameters") or {},
            }
            if function.get("description"):
                rendered["description"] = function["description"]
            out.append(rendered)
        return out


def render_input(messages: Sequence[Mapping[str, Any]], tools: ToolMap) -> tuple[str | None, list[dict[str, Any]]]:
    """``instructions`` (a leading system message) and the input items of a chat conversation."""
    instructions: str | None = None
    items: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # call id -> the chat name it was called by
    for index, message in enumerate(messages):
        role = message.get("role")
        parts = native_parts(message, "responses")
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                names[str(call.get("id"))] = str((call.get("function") or {}).get("name"))
        if index == 0 and role == "system" and parts is None:
            instructions = _text(message.get("content"))
            continue
        if parts is not None:
            items += [copy.deepcopy(p) for p in parts]
        elif role == "assistant":
            items += _assistant_items(message, tools)
        elif role == "tool":
            items.append(_output_item(message, tools, names))
        else:
            items.append({"type": "message", "role": role, "content": _input_content(message.get("content"))})
    return instructions, items


def _assistant_items(message: Mapping[str, Any], tools: ToolMap) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    text = _text(message.get("content"))
    if text:
        items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        flat, arguments = str(function.get("name")), str(function.get("arguments") or "")
        origin = tools.origins.get(flat)
        item: dict[str, Any]
        if origin is not None and origin.kind == "custom":
            item = {
                "type": "custom_tool_call",
                "call_id": call.get("id"),
                "name": origin.name,
                "input": _freeform(arguments),
            }
        else:
            item = {
                "type": "function_call",
                "call_id": call.get("id"),
                "name": origin.name if origin else flat,
                "arguments": arguments,
            }
        if origin is not None and origin.namespace:
            item["namespace"] = origin.namespace
        items.append(item)
    return items


def _output_item(message: Mapping[str, Any], tools: ToolMap, names: Mapping[str, str]) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    origin = tools.origins.get(names.get(str(call_id), ""))
    kind = "custom_tool_call_output" if origin is not None and origin.kind == "custom" else "function_call_output"
    return {"type": kind, "call_id": call_id, "output": _text(message.get("content"))}


def _input_content(content: Any) -> str | list[dict[str, Any]]:
    if isinstance(content, str) or content is None:
        return content or ""
    parts: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "text":
            parts.append({"type": "input_text", "text": part.get("text", "")})
        elif part.get("type") == "image_url":
            parts.append({"type": "input_image", "image_url": (part.get("image_url") or {}).get("url")})
    return parts


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def _freeform(arguments: str) -> str:
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return str(parsed["input"]) if isinstance(parsed, Mapping) and isinstance(parsed.get("input"), str) else arguments


def _finish_reason(response: Mapping[str, Any], output: list[Mapping[str, Any]]) -> str:
    if any(item.get("type") in _CALLS for item in output):
        return "tool_calls"
    reason = (
        (response.get("incomplete_details") or {}).get("reason") if response.get("status") == "incomplete" else None
    )
    if reason == "max_output_tokens":
        return "length"
    return "content_filter" if reason == "content_filter" else "stop"


def _item_events(index: int, item: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One output item as ``output_item.added``, its content's events, ``output_item.done``."""
    kind = item.get("type")
    events: list[dict[str, Any]] = []
    added = copy.deepcopy(dict(item))
    if kind == "message":
        added["content"] = []
        added["status"] = "in_progress"
    elif kind == "reasoning":
        added["summary"] = []
    elif kind in ("function_call", "custom_tool_call"):
        added["arguments" if kind == "function_call" else "input"] = ""
        added["status"] = "in_progress"
    events.append({"type": "response.output_item.added", "output_index": index, "item": added})
    item_id = item.get("id")
    if kind == "message":
        for part_index, part in enumerate(item.get("content") or []):
            empty = {**copy.deepcopy(dict(part)), "text": ""} if part.get("type") == "output_text" else dict(part)
            where = {"item_id": item_id, "output_index": index, "content_index": part_index}
            events.append({"type": "response.content_part.added", **where, "part": empty})
            if part.get("type") == "output_text":
                events.append(
                    {"type": "response.output_text.delta", **where, "delta": part.get("text", ""), "logprobs": []}
                )
                events.append(
                    {"type": "response.output_text.done", **where, "text": part.get("text", ""), "logprobs": []}
                )
            events.append({"type": "response.content_part.done", **where, "part": copy.deepcopy(dict(part))})
    elif kind == "reasoning":
        for summary_index, part in enumerate(item.get("summary") or []):
            where = {"item_id": item_id, "output_index": index, "summary_index": summary_index}
            events.append(
                {"type": "response.reasoning_summary_part.added", **where, "part": {**dict(part), "text": ""}}
            )
            events.append({"type": "response.reasoning_summary_text.delta", **where, "delta": part.get("text", "")})
            events.append({"type": "response.reasoning_summary_text.done", **where, "text": part.get("text", "")})
            events.append({"type": "response.reasoning_summary_part.done", **where, "part": dict(part)})
    elif kind == "function_call":
        where = {"item_id": item_id, "output_index": index}
        events.append({"type": "response.function_call_arguments.delta", **where, "delta": item.get("arguments", "")})
        events.append(
            {"type": "response.function_call_arguments.done", **where, "arguments": item.get("arguments", "")}
        )
    events.append({"type": "response.output_item.done", "output_index": index, "item": copy.deepcopy(dict(item))})
    return events


def is_hosted_tool(tool: Mapping[str, Any]) -> bool:
    """A tool that runs at the provider (``web_search``, ``file_search``, ``code_interpreter``, remote ``mcp``...)."""
    return tool.get("type") in HOSTED_TOOL_TYPES or tool.get("type") not in (
        "function",
        "custom",
        "namespace",
        TOOL_SEARCH,
    )


def native_request(raw: Mapping[str, Any], route: ModelRoute, tools: ToolMap, notes: dict[str, Any]) -> NativeRequest:
    """The native passage of a Responses request on a ``responses`` route: the codec, after refusing a hosted
    tool the route does not allow. ``notes`` (the trace's ``ingress``) say the request passed natively: what
    the chat translation would have left out is sent."""
    allowed = route.allowed_server_tools
    for index, tool in enumerate(raw.get("tools") or []):
        if (
            allowed is not None
            and isinstance(tool, Mapping)
            and is_hosted_tool(tool)
            and tool.get("type") not in allowed
        ):
            raise InvalidRequest(
                f"tools.{index}: the hosted tool {tool.get('type')!r} is not allowed on the model "
                f"{route.model_name!r} (its route's allowed_server_tools).",
                param=f"tools.{index}",
                code="server_tool_not_allowed",
            )
    for key in ("fieldsNotForwarded", "hostedToolsOmitted", "inputItemsDropped"):
        notes.pop(key, None)
    notes["passage"] = "native"
    max_output = raw.get("max_output_tokens")
    if isinstance(max_output, int) and route.max_output_tokens is not None and max_output > route.max_output_tokens:
        notes["maxOutputTokensClamped"] = {"requested": max_output, "sent": route.max_output_tokens}
        max_output = route.max_output_tokens
    model = route.litellm_model.split("/", 1)[1] if "/" in route.litellm_model else route.litellm_model
    return NativeRequest(
        "responses", ResponsesCodec(raw, model, tools, max_output if isinstance(max_output, int) else None)
    )
