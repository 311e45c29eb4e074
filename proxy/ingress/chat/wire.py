"""The OpenAI chat-completions request as the proxy accepts it (pydantic).

Validation only: the proxy forwards the client's own JSON, so the OpenAI fields it does not model pass
through untouched rather than being re-dumped; which top-level fields may reach the provider at all is
decided by ``proxy.kernel.client_params``.
Cross-message rules that a provider would reject (orphan tool results, tool calls left without their
results) are checked here so a bad request fails before anything is stored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails

from proxy.edge.known_messages import KnownMessages
from proxy.kernel.canonical import exact_digest
from proxy.kernel.errors import InvalidRequest

_Open = ConfigDict(extra="allow")
# A JSON number (never a string or a bool), finite.
_Number = Annotated[StrictFloat, Field(allow_inf_nan=False)]  # strict floats take ints too


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


class InputAudioPart(BaseModel):
    """An audio content part (user messages only)."""

    model_config = _Open
    type: Literal["input_audio"]
    input_audio: dict[str, Any]


class FilePart(BaseModel):
    """A file content part (user messages only)."""

    model_config = _Open
    type: Literal["file"]
    file: dict[str, Any]


class RefusalPart(BaseModel):
    """A refusal content part (assistant messages only)."""

    model_config = _Open
    type: Literal["refusal"]
    refusal: str


class TextOnlyPart(BaseModel):
    """A content part of a system, developer or tool message: OpenAI allows only text there."""

    model_config = _Open
    type: str
    text: str

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if isinstance(kind, str) and kind != "text":
            raise ValueError(f"content part type {kind!r} is not allowed in this role's message (only 'text')")
        return value


# The part types OpenAI's schema allows for each role; a provider would reject any other with a 400
# that reads like its own fault, so the proxy names the part before the call instead.
UserPart = Annotated[TextPart | ImagePart | InputAudioPart | FilePart, Field(discriminator="type")]
AssistantPart = Annotated[TextPart | RefusalPart, Field(discriminator="type")]
Content = str | list[TextOnlyPart]
UserContent = str | list[UserPart]
AssistantContent = str | list[AssistantPart]


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


def _no_tool_calls(value: Any) -> None:
    if value is not None:
        raise ValueError("only an assistant message may carry tool_calls")


# On any other role, tool_calls is refused where it is named: the store and the chain hash read a
# message's tool_calls as an assistant's calls (a string there was a 500), and a provider refuses them.
_NoToolCalls = Annotated[None, BeforeValidator(_no_tool_calls)]


class SystemMessage(BaseModel):
    """A system message."""

    model_config = _Open
    role: Literal["system"]
    content: Content
    name: str | None = None
    tool_calls: _NoToolCalls = None


class DeveloperMessage(BaseModel):
    """A developer message (the newer name for system instructions)."""

    model_config = _Open
    role: Literal["developer"]
    content: Content
    name: str | None = None
    tool_calls: _NoToolCalls = None


class UserMessage(BaseModel):
    """A user message."""

    model_config = _Open
    role: Literal["user"]
    content: UserContent
    name: str | None = None
    tool_calls: _NoToolCalls = None


class AssistantMessage(BaseModel):
    """An assistant message; ``content`` may be null when it carries tool calls."""

    model_config = _Open
    role: Literal["assistant"]
    content: AssistantContent | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None


class ToolMessage(BaseModel):
    """A tool result answering one assistant tool call."""

    model_config = _Open
    role: Literal["tool"]
    content: Content
    tool_call_id: str = Field(min_length=1)
    tool_calls: _NoToolCalls = None


class FunctionMessage(BaseModel):
    """A legacy function-call result (deprecated by OpenAI, still sent by old clients)."""

    model_config = _Open
    role: Literal["function"]
    content: str | None
    name: str
    tool_calls: _NoToolCalls = None


Message = Annotated[
    SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage | FunctionMessage,
    Field(discriminator="role"),
]


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions``. Fields not modelled here are kept for ``proxy.kernel.client_params``."""

    model_config = _Open
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    stream: StrictBool | None = None
    stream_options: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    response_format: dict[str, Any] | None = None
    # The ranges are OpenAI's schema's; NaN and infinities are refused like any other out-of-range value.
    max_tokens: StrictInt | None = Field(default=None, gt=0)
    max_completion_tokens: StrictInt | None = Field(default=None, gt=0)
    temperature: _Number | None = Field(default=None, ge=0, le=2)
    top_p: _Number | None = Field(default=None, ge=0, le=1)
    presence_penalty: _Number | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: _Number | None = Field(default=None, ge=-2, le=2)
    n: StrictInt | None = Field(default=None, ge=1, le=128)
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    logit_bias: dict[str, _Number] | None = None
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = None
    store: StrictBool | None = None
    user: StrictStr | None = None
    safety_identifier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None
    reasoning_effort: StrictStr | None = None
    verbosity: StrictStr | None = None
    service_tier: StrictStr | None = None
    modalities: list[StrictStr] | None = None
    metadata: dict[str, Any] | None = None


_Model = TypeVar("_Model", bound=BaseModel)


def validated(model: type[_Model], body: Any, name_error: Callable[[list[ErrorDetails]], InvalidRequest]) -> _Model:
    """``body`` (a decoded JSON object) validated as ``model``, for every ingress's request parsing.

    A body that is not an object, or fails validation, raises ``InvalidRequest``: ``name_error`` words
    pydantic's errors as that API names a parameter (which error, which location, which prefix).
    """
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise name_error(exc.errors(include_url=False)) from None


def parse_chat_request(body: Any) -> ChatCompletionRequest:
    """Validate a decoded JSON body; raises ``InvalidRequest`` naming the first problem."""
    request = validated(ChatCompletionRequest, body, _chat_error)
    check_tool_pairing(body["messages"])
    return request


def check_message_count(body: Any, max_messages: int) -> None:
    """400 ``too_many_messages`` for a body with more than ``max_messages`` messages, naming the setting
    (chat's and the Messages API's: checked before anything of the messages is validated)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if isinstance(messages, list) and len(messages) > max_messages:
        raise InvalidRequest(
            f"The request has {len(messages)} messages; this proxy accepts at most {max_messages} per request "
            "(CONTEXT_PROXY_MAX_REQUEST_MESSAGES).",
            param="messages",
            code="too_many_messages",
        )


def check_chat_request(
    body: Any, known: KnownMessages, resent: int = 0, resent_digests: Sequence[bytes] = ()
) -> tuple[ChatCompletionRequest, list[bytes] | None]:
    """``parse_chat_request``, validating only the messages ``known`` has not seen validated (see
    ``proxy/edge/known_messages.py``); the cross-message rules still see every message. ``resent``: how many
    leading messages repeat a request that passed whole (``proxy/edge/resent_requests.py``), with their
    ``resent_digests``. Returns the validated request, whose ``messages`` are only those validated now
    (read its other fields), and the exact digest of every message, for the chain memo (``None`` when
    the body had no message list)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages:
        return parse_chat_request(body), None
    digests = [*resent_digests, *map(exact_digest, messages[resent:])]
    # A resent prefix passed as a whole before; of the rest, what no request had.
    fresh = [resent + index for index in known.unknown(digests[resent:])]
    request = check_fresh_messages(body, fresh, pairs_before=resent)
    known.remember(digests[resent:])
    return request, digests


def check_fresh_messages(body: dict[str, Any], fresh: Sequence[int], pairs_before: int = 0) -> ChatCompletionRequest:
    """``parse_chat_request`` of a body (with a non-empty message list) whose messages passed it before, all
    but those at the ``fresh`` positions: only those are validated, and the cross-message rules see every
    message after the first ``pairs_before`` (a prefix that was a whole valid request: every call in it
    answered, nothing pending at its end). Returns the validated request, whose ``messages`` are only those
    validated now (read its other fields); an error names the position in the request."""
    subset, positions = fresh_subset(body, fresh)
    request = validated(ChatCompletionRequest, subset, lambda errors: _chat_error(errors, positions))
    check_tool_pairing(body["messages"], start=pairs_before)
    return request


def fresh_subset(body: dict[str, Any], fresh: Sequence[int]) -> tuple[dict[str, Any], list[int]]:
    """``body`` (with a non-empty message list) with only its messages at the ``fresh`` positions, and those
    positions (for ``in_request``): every ingress validates the messages no request passed with this way.
    The last message is new on nearly every turn; kept when none is fresh, it keeps the list non-empty."""
    messages = body["messages"]
    positions = list(fresh) or [len(messages) - 1]
    return {**body, "messages": [messages[index] for index in positions]}, positions


def in_request(loc: tuple[int | str, ...], positions: list[int] | None) -> tuple[int | str, ...]:
    """pydantic's error location in a ``fresh_subset`` (at ``positions``) as the location in the request."""
    if positions is not None and len(loc) > 1 and loc[0] == "messages" and isinstance(loc[1], int):
        return ("messages", positions[loc[1]], *loc[2:])
    return loc


def _chat_error(errors: list[ErrorDetails], positions: list[int] | None = None) -> InvalidRequest:
    # A union (string or parts, int or float) reports every branch; the deepest error is the one
    # about what the client actually sent (a list's bad part, not "should be a valid string").
    error = max(errors, key=lambda e: len(e["loc"]))
    location = _location(in_request(error["loc"], positions))
    return InvalidRequest(f"Invalid request: {location}: {error['msg']}", param=location or None)


def _location(loc: tuple[int | str, ...]) -> str:
    """pydantic's error location as a request path (``messages.0.content.1.type``): the union branch
    names it inserts (``list[...]``, ``str``, the tag of a message or part after its index) are not
    part of the request."""
    parts: list[str] = []
    for index, part in enumerate(loc):
        branch = isinstance(part, str) and ("[" in part or part in _BRANCH_NAMES)
        tag = isinstance(part, str) and index > 0 and isinstance(loc[index - 1], int) and part in _TAGS
        if not (branch or tag):
            parts.append(str(part))
    return ".".join(parts)


_BRANCH_NAMES = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})
_TAGS = frozenset(
    {"system", "developer", "user", "assistant", "tool", "function"}
    | {"text", "image_url", "input_audio", "file", "refusal", "TextOnlyPart"}
)


def check_tool_pairing(messages: list[dict[str, Any]], start: int = 0) -> None:
    """Every tool result answers a call of the assistant message before it, and every call is answered.

    Providers reject both an orphan tool message and an assistant tool call whose results never come;
    OpenAI also rejects ``tool_calls: []``, which this treats as no tool calls. ``start``: the messages
    before it are known to pair (a request that passed), so the check begins there with no call pending.
    """
    pending: dict[str, int] = {}  # tool_call_id -> index of the assistant message that made it
    for index, message in enumerate(messages[start:], start):
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
