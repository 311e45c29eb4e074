"""The Anthropic Messages request as the proxy accepts it (pydantic): ``POST /v1/messages``.

Validation only; ``proxy/ingress/messages/adapter.py`` translates the validated request. Fields the proxy does
not model are allowed at the top level (Claude Code adds new ones with its betas) and recorded in the
trace as ignored; content blocks are checked by type, since a block the translation does not know
would otherwise be lost without a word.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import ErrorDetails

from proxy.ingress.chat.wire import fresh_subset, in_request, validated
from proxy.kernel.errors import InvalidRequest

_Open = ConfigDict(extra="allow")


class TextBlock(BaseModel):
    """A text block; ``cache_control`` marks a prompt-cache breakpoint."""

    model_config = _Open
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None


class ImageSource(BaseModel):
    """Where an image comes from: inline base64 or a URL."""

    model_config = _Open
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class ImageBlock(BaseModel):
    """An image block."""

    model_config = _Open
    type: Literal["image"]
    source: ImageSource
    cache_control: dict[str, Any] | None = None


class DocumentBlock(BaseModel):
    """A document block; plain-text sources travel as text, PDFs as a file part."""

    model_config = _Open
    type: Literal["document"]
    source: dict[str, Any]
    title: str | None = None
    cache_control: dict[str, Any] | None = None


class ToolUseBlock(BaseModel):
    """An assistant's client tool call."""

    model_config = _Open
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


ToolResultPart = Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]


class ToolResultBlock(BaseModel):
    """A tool's result, answering a ``tool_use`` of the assistant message before it."""

    model_config = _Open
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[ToolResultPart] | None = None
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None


class ThinkingBlock(BaseModel):
    """The model's visible reasoning, with the signature Anthropic checks when it is sent back."""

    model_config = _Open
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(BaseModel):
    """Reasoning Anthropic returned encrypted."""

    model_config = _Open
    type: Literal["redacted_thinking"]
    data: str


class ServerToolBlock(BaseModel):
    """A server tool's call or result (``server_tool_use``, ``web_search_tool_result``, ...): dropped."""

    model_config = _Open
    type: str


Block = Annotated[
    TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class Message(BaseModel):
    """One message; ``system`` mid-conversation is Claude Code's ``mid-conversation-system`` beta."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class Tool(BaseModel):
    """A client tool (``{name, description, input_schema}``) or a server tool (a ``type`` such as
    ``web_search_20250305``, which the proxy leaves out)."""

    model_config = _Open
    name: str = Field(min_length=1)
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoice(BaseModel):
    """``auto``, ``any``, ``tool`` (with ``name``) or ``none``."""

    model_config = _Open
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(BaseModel):
    """Extended thinking: ``enabled`` with a budget, ``adaptive`` or ``disabled``."""

    model_config = _Open
    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = Field(default=None, ge=1)


class MessagesRequest(BaseModel):
    """``POST /v1/messages``."""

    model_config = _Open
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    max_tokens: int = Field(gt=0)
    system: str | list[TextBlock] | None = None
    stream: bool | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    metadata: dict[str, Any] | None = None
    thinking: Thinking | None = None
    output_config: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None
    service_tier: str | None = None


class CountTokensRequest(BaseModel):
    """``POST /v1/messages/count_tokens``: a Messages request without ``max_tokens`` and ``stream``."""

    model_config = _Open
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


KNOWN_FIELDS = frozenset(MessagesRequest.model_fields)


def parse_messages_request(body: Any, fresh: Sequence[int] | None = None) -> MessagesRequest:
    """Validate a decoded JSON body; raises ``InvalidRequest`` naming the first problem. ``fresh``: the
    positions of the only messages to validate, the others having passed before (``translations.py``); the
    request's ``messages`` are then only those (read its other fields)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if fresh is None or not isinstance(messages, list) or not messages:
        return validated(MessagesRequest, body, _invalid)
    subset, positions = fresh_subset(body, fresh)
    return validated(MessagesRequest, subset, lambda errors: _invalid(errors, positions=positions))


def parse_count_tokens_request(body: Any) -> CountTokensRequest:
    """Validate a ``count_tokens`` body; raises ``InvalidRequest`` naming the first problem."""
    return validated(CountTokensRequest, body, _invalid)


def parse_block(raw: Any, where: str, allowed: tuple[str, ...]) -> Any:
    """One content block of a message, as its model; a type outside ``allowed`` is refused by name."""
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise InvalidRequest(f"{where}: a content block must be an object with a 'type'.", param=where)
    if raw["type"] not in allowed:
        raise InvalidRequest(
            f"{where}: content block type {raw['type']!r} is not supported here (expected one of "
            f"{', '.join(allowed)}).",
            param=f"{where}.type",
        )
    return _parse_block(raw, where)


def _parse_block(raw: dict[str, Any], where: str) -> Any:
    holder: type[_BlockHolder | _ServerHolder] = _BlockHolder if raw["type"] in _MODELED else _ServerHolder
    return validated(holder, {"block": raw}, lambda errors: _invalid(errors, prefix=where)).block


class _BlockHolder(BaseModel):
    block: Block


class _ServerHolder(BaseModel):
    block: ServerToolBlock


_MODELED = frozenset({"text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking"})


def _invalid(errors: list[ErrorDetails], prefix: str = "", positions: list[int] | None = None) -> InvalidRequest:
    error = errors[0]
    parts = [str(part) for part in in_request(error["loc"], positions) if part != "block"]
    location = ".".join(([prefix] if prefix else []) + parts)
    return InvalidRequest(f"{location}: {error['msg']}", param=location or None)
