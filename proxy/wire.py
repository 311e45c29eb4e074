"""The OpenAI chat-completions request as the proxy accepts it (pydantic).

Validation only: the proxy forwards the client's own JSON, so the OpenAI fields it does not model pass
through untouched rather than being re-dumped; which top-level fields may reach the provider at all is
decided by ``proxy.client_params``.
Cross-message rules that a provider would reject (orphan tool results, tool calls left without their
results) are checked here so a bad request fails before anything is stored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy.errors import InvalidRequest

_Open = ConfigDict(extra="allow")


class TextPart(BaseModel):
    """A text content part."""

    model_config = _Open
    type: Literal["text"]
    text: str


class ImageUrl(BaseModel):
    """The ``image_url`` object of an image part."""

    model_config = _Open
    url: str


class ImagePart(BaseModel):
    """An image content part."""

    model_config = _Open
    type: Literal["image_url"]
    image_url: ImageUrl


class OtherPart(BaseModel):
    """Any other typed content part (input_audio, file, provider extensions): passed on as is."""

    model_config = _Open
    type: str


ContentPart = TextPart | ImagePart | OtherPart
Content = str | list[ContentPart]


class FunctionCall(BaseModel):
    """The function of a tool call."""

    model_config = _Open
    name: str
    arguments: str


class ToolCall(BaseModel):
    """An assistant tool call."""

    model_config = _Open
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(BaseModel):
    """A system message."""

    model_config = _Open
    role: Literal["system"]
    content: Content
    name: str | None = None


class DeveloperMessage(BaseModel):
    """A developer message (the newer name for system instructions)."""

    model_config = _Open
    role: Literal["developer"]
    content: Content
    name: str | None = None


class UserMessage(BaseModel):
    """A user message."""

    model_config = _Open
    role: Literal["user"]
    content: Content
    name: str | None = None


class AssistantMessage(BaseModel):
    """An assistant message; ``content`` may be null when it carries tool calls."""

    model_config = _Open
    role: Literal["assistant"]
    content: Content | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None


class ToolMessage(BaseModel):
    """A tool result answering one assistant tool call."""

    model_config = _Open
    role: Literal["tool"]
    content: Content
    tool_call_id: str = Field(min_length=1)


class FunctionMessage(BaseModel):
    """A legacy function-call result (deprecated by OpenAI, still sent by old clients)."""

    model_config = _Open
    role: Literal["function"]
    content: str | None
    name: str


Message = Annotated[
    SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage | FunctionMessage,
    Field(discriminator="role"),
]


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions``. Fields not modelled here are kept for ``proxy.client_params``."""

    model_config = _Open
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = Field(default=None, gt=0)
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None


def parse_chat_request(body: Any) -> ChatCompletionRequest:
    """Validate a decoded JSON body; raises ``InvalidRequest`` naming the first problem."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        location = ".".join(str(part) for part in error["loc"])
        raise InvalidRequest(f"Invalid request: {location}: {error['msg']}", param=location or None) from None
    check_tool_pairing(body["messages"])
    return request


def check_tool_pairing(messages: list[dict[str, Any]]) -> None:
    """Every tool result answers a call of the assistant message before it, and every call is answered.

    Providers reject both an orphan tool message and an assistant tool call whose results never come;
    OpenAI also rejects ``tool_calls: []``, which this treats as no tool calls.
    """
    pending: dict[str, int] = {}  # tool_call_id -> index of the assistant message that made it
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                raise InvalidRequest(
                    f"messages[{index}]: tool message with tool_call_id {call_id!r} does not answer a tool call "
                    "of the preceding assistant message.",
                    param=f"messages.{index}.tool_call_id",
                )
            del pending[call_id]
            continue
        _require_answered(pending)
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                pending[call["id"]] = index
    _require_answered(pending)


def _require_answered(pending: dict[str, int]) -> None:
    if pending:
        call_id, at = next(iter(pending.items()))
        raise InvalidRequest(
            f"messages[{at}]: the assistant tool call {call_id!r} is not answered by a tool message right after it.",
            param=f"messages.{at}.tool_calls",
        )
