"""An Anthropic Messages request translated into the canonical Chat Completions body.

Hand-written rather than litellm's Anthropic adapter: that adapter is an internal module whose path
and behaviour change between litellm releases, and the canonical body here must keep what the store
and the assembly rely on (tool-call ids, ``cache_control`` marks, thinking blocks) in the form litellm's
Anthropic provider turns back into Anthropic blocks:

- ``cache_control`` stays on chat content parts and tools, and sits on the tool message itself for a
  ``tool_result`` (litellm's convention), for Anthropic routes only: litellm passes a message-level mark
  on to an OpenAI-compatible provider, which would refuse the unknown field.
- ``thinking`` / ``redacted_thinking`` blocks become the assistant message's ``thinking_blocks``, for
  Anthropic routes only: a signature means nothing to another provider.
- ``is_error`` has no chat equivalent, so an error result reads ``Error: ...`` to the model.
- Server tools (a ``type`` such as ``web_search_20250305``) and server tool blocks in the history are
  left out: the proxy runs client tools only, and their results could not travel through chat anyway.

Everything left out or not forwarded is listed in ``notes``, which the turn's trace records.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from proxy.edge.resent_requests import fresh_copy
from proxy.ingress.chat.wire import check_fresh_messages
from proxy.ingress.messages.translations import MessageTranslations, Recalled
from proxy.ingress.messages.wire import (
    KNOWN_FIELDS,
    CountTokensRequest,
    DocumentBlock,
    ImageBlock,
    MessagesRequest,
    TextBlock,
    Tool,
    ToolChoice,
    ToolResultBlock,
    parse_block,
    parse_messages_request,
)
from proxy.kernel.config import ModelRoute
from proxy.kernel.errors import InvalidRequest
from proxy.kernel.native import with_native
from proxy.kernel.route_api import provider_of

FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")
_USER_BLOCKS = ("text", "image", "document", "tool_result")
_ASSISTANT_BLOCKS = ("text", "tool_use", "thinking", "redacted_thinking")
_SYSTEM_BLOCKS = ("text",)
_SERVER_BLOCKS = frozenset({"server_tool_use", "mcp_tool_use", "mcp_tool_result", "container_upload"})
_ANTHROPIC_ONLY = ("top_k", "thinking", "output_config")


@dataclass
class Translation:
    """The canonical chat body, what the translation left out (for the trace), and the provider arguments
    the proxy itself sets for an Anthropic route spoken to in chat (``thinking``, ``top_k``,
    ``output_config``, the Anthropic headers): litellm's, not the client's, so the client allow-list
    (``proxy/kernel/client_params.py``) does not judge them."""

    body: dict[str, Any]
    notes: dict[str, Any] = field(default_factory=dict)
    provider_fields: dict[str, Any] = field(default_factory=dict)
    fresh: list[int] = field(default_factory=list)  # the chat messages translated now, not remembered
    digests: list[bytes] | None = None  # every chat message's exact digest, when the translation was recalled
    sent_digests: list[bytes] | None = None  # ... and every message's as the client sent it


def is_anthropic_route(route: ModelRoute) -> bool:
    """Whether litellm sends this route to Anthropic's own API (headers and Anthropic-only fields go there)."""
    return provider_of(route.litellm_params) == "anthropic"


def to_chat(
    request: MessagesRequest | CountTokensRequest,
    raw: Mapping[str, Any],
    route: ModelRoute,
    headers: Mapping[str, str],
    *,
    native: bool = False,
    recalled: Recalled | None = None,
) -> Translation:
    """The chat body for ``request`` (validated from ``raw``) on ``route``; ``native``: the route is spoken to
    in the Messages API, so each message keeps the blocks it came from (``proxy/kernel/native.py``);
    ``recalled``: what is remembered of the request's messages (``translations.py``): those are not
    translated again, and the translation has every chat message's exact digest."""
    anthropic = is_anthropic_route(route)
    notes: dict[str, Any] = {"api": "anthropic-messages"}
    converter = _Converter(anthropic=anthropic, native=native)
    messages: list[dict[str, Any]] = []
    digests: list[bytes] = []
    fresh: list[int] = []

    def add(index: int, translate: Callable[[], list[dict[str, Any]]]) -> None:
        """The chat messages of the message at ``index`` (-1: the system prompt), remembered or made now."""
        copied = recalled.copies(index, anthropic=anthropic, native=native) if recalled is not None else None
        if copied is not None:
            chat, chat_digests, dropped = copied
            converter.dropped_blocks += dropped
        else:
            before = converter.dropped_blocks
            chat = translate()
            if not anthropic:
                chat = [_unmarked(message) for message in chat]
            fresh.extend(range(len(messages), len(messages) + len(chat)))
            if recalled is not None:
                dropped = converter.dropped_blocks - before
                chat_digests = recalled.learn(index, chat, dropped, anthropic=anthropic, native=native)
        messages.extend(chat)
        if recalled is not None:
            digests.extend(chat_digests)

    add(-1, partial(converter.system, request.system, raw.get("system")))
    for index, message in enumerate(raw["messages"]):  # validated: now, or when a request first sent it
        add(index, partial(converter.message, message["role"], message["content"], index))
    body: dict[str, Any] = {"model": request.model, "messages": messages}
    tools, dropped_tools = _tools(request.tools or [], keep_marks=anthropic)
    if tools:
        body["tools"] = tools
        body.update(_tool_choice(request.tool_choice))
    if dropped_tools:
        notes["droppedServerTools"] = dropped_tools
    if converter.dropped_blocks:
        notes["droppedServerBlocks"] = converter.dropped_blocks
    if isinstance(request, MessagesRequest):
        body.update(_sampling(request, route, anthropic, notes))
        ignored = sorted(set(raw) - KNOWN_FIELDS)
        if ignored:
            notes["ignoredFields"] = ignored
    session = _claude_code_session(request.metadata if isinstance(request, MessagesRequest) else None)
    if session:
        body["metadata"] = {"session_id": session}
    if anthropic:
        forwarded = {name: headers[name] for name in FORWARDED_HEADERS if headers.get(name)}
        if forwarded:
            # Set by the proxy from the two Anthropic headers only: the client cannot reach litellm's
            # arguments through this, and other providers never see Anthropic's betas.
            body["extra_headers"] = forwarded
            notes["forwardedHeaders"] = sorted(forwarded)
    provider_fields = {name: body.pop(name) for name in (*_ANTHROPIC_ONLY, "extra_headers") if name in body}
    return Translation(body, notes, provider_fields, fresh, digests if recalled is not None else None)


def translate_request(
    body: Any,
    route_of: Callable[[str], ModelRoute],
    headers: Mapping[str, str],
    translations: MessageTranslations,
    resent_digests: Sequence[bytes] = (),
) -> tuple[MessagesRequest, ModelRoute, Translation]:
    """A ``/v1/messages`` body validated, its route found (``route_of`` its model), translated for that route
    and checked by the chat path's own rules (tool results answer their calls). What ``translations``
    remembers of its messages is neither validated nor translated again; what it translated anew is
    remembered once the request passed every check (``translations.py``). ``resent_digests``: the exact
    digests of its leading messages, when the edge has them (``proxy/edge/resent_requests.py``)."""
    messages, system = (body.get("messages"), body.get("system")) if isinstance(body, dict) else (None, None)
    recalled = translations.recall(messages, system, resent_digests)
    request = parse_messages_request(body, None if recalled is None else recalled.fresh)
    route = route_of(request.model)
    native = route.api == "messages"  # the client speaks its route's own API: native passage
    translation = to_chat(request, body, route, headers, native=native, recalled=recalled)
    check_fresh_messages(translation.body, translation.fresh)
    if recalled is not None:
        translations.remember(recalled)
        translation.sent_digests = recalled.keys
    return request, route, translation


def _sampling(request: MessagesRequest, route: ModelRoute, anthropic: bool, notes: dict[str, Any]) -> dict[str, Any]:
    """``max_tokens``, sampling, stop sequences, ``user`` and the Anthropic-only fields."""
    out: dict[str, Any] = {"max_tokens": request.max_tokens}
    if route.max_output_tokens is not None and request.max_tokens > route.max_output_tokens:
        # Claude Code always asks for 32k or 64k; a route declaring less would be refused by its provider.
        out["max_tokens"] = route.max_output_tokens
        notes["maxTokensClamped"] = {"requested": request.max_tokens, "sent": route.max_output_tokens}
    if request.stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}  # Anthropic's message_delta carries the usage
    for name in ("temperature", "top_p"):
        value = getattr(request, name)
        if value is not None:
            out[name] = value
    if request.stop_sequences:
        out["stop"] = list(request.stop_sequences)
    user = (request.metadata or {}).get("user_id")
    if isinstance(user, str) and user:
        out["user"] = user
    not_forwarded: dict[str, str] = {}
    for name in _ANTHROPIC_ONLY:
        value = getattr(request, name)
        if value is None:
            continue
        if anthropic:
            out[name] = value.model_dump(exclude_none=True) if name == "thinking" else value
        else:
            not_forwarded[name] = "the route's provider is not Anthropic"
    if request.context_management is not None:
        not_forwarded["context_management"] = "superseded by the proxy's own context assembly"
    if not_forwarded:
        notes["notForwarded"] = not_forwarded
    return out


def _claude_code_session(metadata: Mapping[str, Any] | None) -> str | None:
    """The ``session_id`` inside Claude Code's ``metadata.user_id`` (a JSON string), if there is one."""
    user = (metadata or {}).get("user_id")
    if not isinstance(user, str) or not user.startswith("{"):
        return None
    try:
        parsed = json.loads(user)
    except json.JSONDecodeError:
        return None
    session = parsed.get("session_id") if isinstance(parsed, dict) else None
    return session if isinstance(session, str) and session.strip() else None


def _unmarked(message: dict[str, Any]) -> dict[str, Any]:
    """The message without ``cache_control`` marks, on the message or on its content parts."""
    out = {key: value for key, value in message.items() if key != "cache_control"}
    if isinstance(out.get("content"), list):
        parts = [{k: v for k, v in part.items() if k != "cache_control"} for part in out["content"]]
        out["content"] = _joined(parts)
    return out


def _tools(tools: list[Tool], keep_marks: bool) -> tuple[list[dict[str, Any]], list[str]]:
    """Client tools as OpenAI function tools; server tools are left out and named."""
    out: list[dict[str, Any]] = []
    dropped: list[str] = []
    for index, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            dropped.append(f"{tool.name} ({tool.type})")
            continue
        if tool.input_schema is None:
            raise InvalidRequest(f"tools.{index}.input_schema: Field required", param=f"tools.{index}.input_schema")
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        chat_tool: dict[str, Any] = {"type": "function", "function": function}
        if tool.cache_control is not None and keep_marks:
            chat_tool["cache_control"] = tool.cache_control
        out.append(chat_tool)
    return out, dropped


def _tool_choice(choice: ToolChoice | None) -> dict[str, Any]:
    if choice is None:
        return {}
    out: dict[str, Any] = {}
    if choice.type == "auto":
        out["tool_choice"] = "auto"
    elif choice.type == "any":
        out["tool_choice"] = "required"
    elif choice.type == "none":
        out["tool_choice"] = "none"
    else:
        if not choice.name:
            raise InvalidRequest("tool_choice.name: required when tool_choice.type is 'tool'.", param="tool_choice")
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    if choice.disable_parallel_tool_use:
        out["parallel_tool_calls"] = False
    return out


class _Converter:
    """Turns Anthropic messages into chat messages, counting the server blocks it leaves out."""

    def __init__(self, anthropic: bool, native: bool = False) -> None:
        self.anthropic = anthropic  # thinking blocks and cache_control marks go to Anthropic only
        self.native = native  # the route speaks Messages: each message keeps the blocks it came from
        self.dropped_blocks = 0

    def system(self, system: str | list[TextBlock] | None, raw: Any) -> list[dict[str, Any]]:
        """The system prompt (validated, and as sent) as a system message, or none; the blocks a native route
        keeps are a copy, as a message's are."""
        if system is None or system == [] or system == "":
            return []
        if isinstance(system, str):
            message: dict[str, Any] = {"role": "system", "content": system}
        else:
            message = {"role": "system", "content": [_text_part(block) for block in system]}
        return [self._native(message, [raw] if isinstance(raw, str) else fresh_copy(raw))]  # as ``message``'s

    def message(self, role: str, content: str | list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
        """A message's chat messages; its blocks are copied first: the ones a native route keeps beside them
        are rendered and sent later, and whatever is done to them then must not change the client's body."""
        if isinstance(content, str):
            return [self._native({"role": role, "content": content}, [content])]
        copied: list[dict[str, Any]] = fresh_copy(content)
        where = f"messages.{index}.content"
        if role == "system":
            blocks = [parse_block(raw, f"{where}.{j}", _SYSTEM_BLOCKS) for j, raw in enumerate(copied)]
            return [{"role": "system", "content": [_text_part(block) for block in blocks]}]
        if role == "user":
            return self._user(copied, where)
        return [self._assistant(copied, where)]

    def _parse(self, content: list[dict[str, Any]], where: str, allowed: tuple[str, ...]) -> list[tuple[Any, Any]]:
        """Each block validated, with the raw block it came from; server blocks are left out (counted)."""
        blocks = []
        for j, raw in enumerate(content):
            kind = raw.get("type") if isinstance(raw, dict) else None
            if isinstance(kind, str) and _is_server_block(kind):
                self.dropped_blocks += 1
                continue
            blocks.append((parse_block(raw, f"{where}.{j}", allowed), raw))
        return blocks

    def _user(self, content: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []
        parts: list[dict[str, Any]] = []
        raw_parts: list[Any] = []
        for block, raw in self._parse(content, where, _USER_BLOCKS):
            if isinstance(block, ToolResultBlock):
                results.append(self._native(_tool_message(block), [raw]))
                continue
            raw_parts.append(raw)
            if isinstance(block, TextBlock):
                parts.append(_text_part(block))
            elif isinstance(block, ImageBlock):
                parts.append(_image_part(block))
            elif isinstance(block, DocumentBlock):
                parts.append(_document_part(block, where))
        if self.native:  # a native route gets the server blocks back as they were sent
            raw_parts = [raw for raw in content if not _is_tool_result(raw)]
        # Anthropic puts tool results first in the user message; chat needs them as tool messages
        # right after the assistant's calls, and whatever else the user said after them.
        user = [self._native({"role": "user", "content": parts}, raw_parts)] if parts else []
        return results + user

    def _assistant(self, content: list[dict[str, Any]], where: str) -> dict[str, Any]:
        for j, raw in enumerate(content):  # validated block by block, for errors that name the block
            kind = raw.get("type") if isinstance(raw, dict) else None
            if not (isinstance(kind, str) and _is_server_block(kind)):
                parse_block(raw, f"{where}.{j}", _ASSISTANT_BLOCKS)
        message, dropped = assistant_message(content, thinking=self.anthropic)
        self.dropped_blocks += dropped
        return self._native(message, content)

    def _native(self, message: dict[str, Any], parts: list[Any]) -> dict[str, Any]:
        """``message`` with the blocks it was made from, for a route spoken to in the Messages API."""
        return with_native(message, "messages", parts) if self.native else message


def assistant_message(content: str | list[Any], *, thinking: bool = True) -> tuple[dict[str, Any], int]:
    """An assistant turn's Anthropic content (validated: the client's, or the provider's own answer) as a
    chat message, and how many server blocks it left out. Text becomes the content (one plain part as a
    string), ``tool_use`` blocks tool calls, thinking blocks ``thinking_blocks`` (litellm's name, when
    ``thinking``). One function for both directions, so the answer the client is sent and the same
    message it sends back are one message to the store."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}, 0
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[dict[str, Any]] = []
    dropped = 0
    for block in content:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text":
            part: dict[str, Any] = {"type": "text", "text": block["text"]}
            if block.get("cache_control") is not None:
                part["cache_control"] = block["cache_control"]
            parts.append(part)
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
            )
        elif kind == "thinking":
            reasoning.append(
                {"type": "thinking", "thinking": block["thinking"], "signature": block.get("signature") or ""}
            )
        elif kind == "redacted_thinking":
            reasoning.append({"type": "redacted_thinking", "data": block["data"]})
        else:
            dropped += 1  # server tool blocks: chat has no place for them (a native route keeps them)
    message: dict[str, Any] = {"role": "assistant", "content": _joined(parts) if parts else None}
    if not calls and message["content"] is None:
        message["content"] = ""
    if calls:
        message["tool_calls"] = calls
    if reasoning and thinking:
        message["thinking_blocks"] = reasoning
    return message, dropped


def _is_tool_result(raw: Any) -> bool:
    return isinstance(raw, Mapping) and raw.get("type") == "tool_result"


def _is_server_block(kind: str) -> bool:
    return kind in _SERVER_BLOCKS or (kind.endswith("_tool_result") and kind != "tool_result")


def _joined(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """One plain text part as a string (the common case), else the parts as they are."""
    if len(parts) == 1 and parts[0]["type"] == "text" and "cache_control" not in parts[0]:
        return str(parts[0]["text"])
    return parts


def _marked(part: dict[str, Any], block: TextBlock | ImageBlock | DocumentBlock) -> dict[str, Any]:
    if block.cache_control is not None:
        part["cache_control"] = block.cache_control
    return part


def _text_part(block: TextBlock) -> dict[str, Any]:
    return _marked({"type": "text", "text": block.text}, block)


def _image_part(block: ImageBlock) -> dict[str, Any]:
    source = block.source
    if source.type == "base64":
        if not source.media_type or not source.data:
            raise InvalidRequest("An image with a base64 source needs media_type and data.", param="messages")
        url = f"data:{source.media_type};base64,{source.data}"
    else:
        if not source.url:
            raise InvalidRequest("An image with a url source needs url.", param="messages")
        url = source.url
    return _marked({"type": "image_url", "image_url": {"url": url}}, block)


def _document_part(block: DocumentBlock, where: str) -> dict[str, Any]:
    source = block.source
    if source.get("type") == "text" and isinstance(source.get("data"), str):
        text = source["data"] if not block.title else f"{block.title}\n\n{source['data']}"
        return _marked({"type": "text", "text": text}, block)
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type") or "application/pdf"
        return _marked({"type": "file", "file": {"file_data": f"data:{media};base64,{source['data']}"}}, block)
    raise InvalidRequest(
        f"{where}: document sources other than text and base64 are not supported.", param=f"{where}.source"
    )


def _tool_message(block: ToolResultBlock) -> dict[str, Any]:
    content: str | list[dict[str, Any]]
    if block.content is None:
        content = ""
    elif isinstance(block.content, str):
        content = block.content
    else:
        parts = []
        for part in block.content:
            if isinstance(part, TextBlock):
                parts.append(_text_part(part))
            elif isinstance(part, ImageBlock):
                parts.append(_image_part(part))
            else:
                parts.append(_document_part(part, "tool_result.content"))
        content = _joined(parts) if parts else ""
    if block.is_error:
        error_mark: dict[str, Any] = {"type": "text", "text": "Error:"}
        content = f"Error: {content}" if isinstance(content, str) else [error_mark, *content]
    message: dict[str, Any] = {"role": "tool", "tool_call_id": block.tool_use_id, "content": content}
    if block.cache_control is not None:
        message["cache_control"] = block.cache_control
    return message
