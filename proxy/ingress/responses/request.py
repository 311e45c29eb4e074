"""The OpenAI Responses API request, validated and translated to the canonical Chat Completions body.

Hand-written rather than litellm's Responses bridge: that bridge drops custom (freeform) tools,
namespaces and Codex's client-executed ``tool_search``, which Codex sends on every request.

Decisions a client can see (docs/clients.md repeats them):

- ``instructions`` becomes the first system message; ``developer``/``system`` input messages stay.
- Custom tools (Codex's ``apply_patch``) become functions with one string argument ``input``; tools of
  a ``namespace`` become functions named ``<namespace>__<name>``; ``tool_search`` becomes a function.
  Calls of them are translated back (``custom_tool_call``, ``namespace``, ``tool_search_call``).
- Hosted tools (``web_search``, ``file_search``, ...) cannot run behind a chat provider: they are left
  out of the provider request and named in the trace, never refused.
- Reasoning items are dropped: their ``encrypted_content`` means something only to OpenAI's own
  Responses backend, and Chat Completions has no input for them. ``reasoning.effort`` is not
  forwarded either (a non-reasoning model would reject it). Both are recorded in the trace.
- A ``compaction`` item the proxy issued stands for the proxy's checkpoint (``proxy/runtime/remote_compaction.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import ErrorDetails

from proxy.ingress.chat.wire import check_tool_pairing, validated
from proxy.kernel.errors import InvalidRequest
from proxy.kernel.native import with_native

COMPACTION_TRIGGER = "compaction_trigger"
# Tool types that run on OpenAI's side; a chat provider cannot run them.
HOSTED_TOOL_TYPES = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_2025_08_26",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer_use_preview",
        "computer_use",
        "mcp",
        "local_shell",
        "shell",
        "apply_patch",
    }
)
# History items of hosted tool runs: nothing a chat provider can be shown faithfully.
_HOSTED_ITEM_TYPES = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "code_interpreter_call",
        "image_generation_call",
        "computer_call",
        "computer_call_output",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
    }
)
_FREEFORM_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The tool's raw text input."}},
    "required": ["input"],
    "additionalProperties": False,
}
_TOOL_SEARCH_PARAMETERS = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["query"],
}
TOOL_SEARCH = "tool_search"


class ResponsesRequest(BaseModel):
    """``POST /v1/responses``: the fields the proxy reads; others are accepted and recorded."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = None
    top_p: float | None = None
    metadata: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    text: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    store: bool | None = None
    stream: bool | None = None
    previous_response_id: str | None = None
    client_metadata: dict[str, Any] | None = None
    user: str | None = None


def parse_responses_request(body: Any) -> ResponsesRequest:
    """Validate a decoded JSON body; raises ``InvalidRequest`` naming the first problem."""
    return validated(ResponsesRequest, body, _invalid)


def _invalid(errors: list[ErrorDetails]) -> InvalidRequest:
    error = errors[0]
    location = ".".join(str(part) for part in error["loc"])
    # The field is the parameter; the rest of pydantic's location names union branches.
    field = str(error["loc"][0]) if error["loc"] else None
    return InvalidRequest(f"Invalid request: {location}: {error['msg']}", param=field)


@dataclass(frozen=True)
class ToolOrigin:
    """What a flat chat function stands for in the Responses request."""

    kind: str  # "function", "custom" or "tool_search"
    name: str  # the tool's own name (inside its namespace)
    namespace: str | None = None


@dataclass
class ToolMap:
    """The chat functions offered for the request's tools, and where each came from."""

    functions: list[dict[str, Any]] = field(default_factory=list)
    origins: dict[str, ToolOrigin] = field(default_factory=dict)
    omitted: list[str] = field(default_factory=list)  # hosted tool types left out

    def add(self, flat: str, origin: ToolOrigin, function: dict[str, Any], param: str) -> None:
        """Offer one function; two tools flattening to one name are a client error."""
        if flat in self.origins:
            raise InvalidRequest(f"Two tools are both offered to the model as {flat!r}.", param=param)
        self.origins[flat] = origin
        self.functions.append({"type": "function", "function": {"name": flat, **function}})

    def flat_name(self, name: str, namespace: str | None) -> str:
        """The chat function name of a tool (the same rule ``translate_tools`` used)."""
        return name if not namespace else _namespaced(namespace, name)


def _namespaced(namespace: str, name: str) -> str:
    return f"{namespace}{name}" if namespace.endswith("__") else f"{namespace}__{name}"


def translate_tools(tools: Sequence[Mapping[str, Any]]) -> ToolMap:
    """Responses tools to chat functions; hosted tools are left out and named in ``omitted``."""
    out = ToolMap()
    for index, tool in enumerate(tools):
        _add_tool(out, tool, None, f"tools.{index}")
    return out


def _add_tool(out: ToolMap, tool: Mapping[str, Any], namespace: str | None, param: str) -> None:
    kind = tool.get("type")
    if kind == "namespace" and namespace is None:
        ns = _required_str(tool, "name", param)
        for inner, nested in enumerate(tool.get("tools") or []):
            _add_tool(out, nested, ns, f"{param}.tools.{inner}")
        return
    if kind == TOOL_SEARCH:
        description = tool.get("description") or "Search for further tools by query; found tools become callable."
        search = {"description": description, "parameters": tool.get("parameters") or _TOOL_SEARCH_PARAMETERS}
        out.add(TOOL_SEARCH, ToolOrigin("tool_search", TOOL_SEARCH), search, param)
        return
    if kind in HOSTED_TOOL_TYPES or kind not in ("function", "custom"):
        out.omitted.append(str(kind))
        return
    name = _required_str(tool, "name", param)
    flat = out.flat_name(name, namespace)
    if kind == "function":
        function: dict[str, Any] = {"parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
        if tool.get("description"):
            function["description"] = tool["description"]
        if isinstance(tool.get("strict"), bool):
            function["strict"] = tool["strict"]
        out.add(flat, ToolOrigin("function", name, namespace), function, param)
        return
    out.add(flat, ToolOrigin("custom", name, namespace), _freeform_function(tool), param)


def _freeform_function(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A custom tool as a function of one string: the grammar goes into the description the model reads."""
    description = str(tool.get("description") or "")
    fmt = tool.get("format")
    if isinstance(fmt, Mapping) and fmt.get("type") == "grammar" and fmt.get("definition"):
        description += (
            f"\n\nPass the tool's raw text as `input`; it must follow this {fmt.get('syntax', '')} grammar:\n"
            f"{fmt['definition']}"
        )
    else:
        description += "\n\nPass the tool's raw text as `input`."
    return {"description": description.strip(), "parameters": _FREEFORM_PARAMETERS}


def translate_tool_choice(choice: Any, tools: ToolMap) -> tuple[Any, str | None]:
    """The chat ``tool_choice`` and, when something could not be kept, a note for the trace."""
    if choice is None or isinstance(choice, str):
        return choice, None
    kind = choice.get("type")
    if kind in ("function", "custom") and isinstance(choice.get("name"), str):
        flat = tools.flat_name(choice["name"], choice.get("namespace"))
        if flat not in tools.origins:
            raise InvalidRequest(f"tool_choice names {choice['name']!r}, which is not a tool.", param="tool_choice")
        return {"type": "function", "function": {"name": flat}}, None
    if kind == "allowed_tools":
        return ("required" if choice.get("mode") == "required" else "auto"), "allowed_tools became its mode"
    return "auto", f"tool_choice {kind!r} (a hosted tool) became auto"


@dataclass
class InputTranslation:
    """The chat messages of a Responses ``input`` and what was dropped on the way."""

    messages: list[dict[str, Any]]
    dropped: dict[str, int] = field(default_factory=dict)  # item type -> count
    extra_tools: list[Mapping[str, Any]] = field(default_factory=list)  # found by client tool_search


def input_items(request: ResponsesRequest) -> list[dict[str, Any]]:
    """``input`` as a list of items (a string is one user message)."""
    if isinstance(request.input, str):
        return [{"type": "message", "role": "user", "content": request.input}]
    return list(request.input)


def translate_input(
    items: Sequence[Mapping[str, Any]],
    tools: ToolMap,
    checkpoints: Mapping[str, dict[str, Any]],
    *,
    native: bool = False,
) -> InputTranslation:
    """Responses input items to chat messages; ``checkpoints`` maps a compaction token to its message.
    ``native``: the route speaks Responses, so each message keeps the items it came from
    (``proxy/kernel/native.py``), reasoning and hosted-tool items with the assistant turn they belong to."""
    out = InputTranslation([])
    sidecars = _Sidecars() if native else None
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise InvalidRequest(f"input[{index}] must be an object.", param=f"input.{index}")
        _translate_item(out, item, index, tools, checkpoints, sidecars)
    if sidecars is not None:
        sidecars.finish(out.messages)
    return out


class _Sidecars:
    """The items each chat message of a native request was made from (attached once the messages are whole).

    A reasoning item, or a hosted tool's call, belongs to the assistant turn it is part of: it waits for the
    assistant message that follows it (the model's text or calls), else joins the one before it."""

    def __init__(self) -> None:
        self.pending: list[Any] = []
        self.parts: dict[int, tuple[dict[str, Any], list[Any]]] = {}

    def add(self, message: dict[str, Any], item: Mapping[str, Any]) -> None:
        self._parts(message).append(dict(item))

    def assistant(self, message: dict[str, Any]) -> None:
        """``message`` is the assistant turn the waiting items belong to."""
        self._parts(message).extend(self.pending)
        self.pending = []

    def settle(self, messages: list[dict[str, Any]]) -> None:
        """The turn ended (a user message or a tool's output follows): waiting items join the last assistant
        message, or one of their own."""
        if not self.pending:
            return
        if not messages or messages[-1]["role"] != "assistant":
            messages.append({"role": "assistant", "content": ""})
        self.assistant(messages[-1])

    def finish(self, messages: list[dict[str, Any]]) -> None:
        self.settle(messages)
        for message, parts in self.parts.values():
            with_native(message, "responses", parts)

    def _parts(self, message: dict[str, Any]) -> list[Any]:
        return self.parts.setdefault(id(message), (message, []))[1]


def _translate_item(
    out: InputTranslation,
    item: Mapping[str, Any],
    index: int,
    tools: ToolMap,
    checkpoints: Mapping[str, dict[str, Any]],
    sidecars: _Sidecars | None = None,
) -> None:
    kind = item.get("type") or ("message" if "role" in item else None)
    param = f"input.{index}"
    messages = out.messages
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise InvalidRequest(
                f"input[{index}]: role {role!r} is not one of user, system, developer, assistant.",
                param=f"{param}.role",
            )
        if sidecars is not None and role != "assistant":
            sidecars.settle(messages)
        message = {"role": role, "content": _content(item.get("content"), param, role)}
        messages.append(message)
        if sidecars is not None:
            if role == "assistant":
                sidecars.assistant(message)
            sidecars.add(message, item)
    elif kind in ("function_call", "custom_tool_call", "tool_search_call"):
        assistant = _assistant_for_calls(messages)
        assistant["tool_calls"].append(_tool_call(item, kind, param, tools))
        if sidecars is not None:
            sidecars.assistant(assistant)
            sidecars.add(assistant, item)
    elif kind in ("function_call_output", "custom_tool_call_output", "tool_search_output"):
        call_id = _call_id(item, param)
        if kind == "tool_search_output":
            found = [t for t in item.get("tools") or [] if isinstance(t, Mapping)]
            out.extra_tools.extend(found)
            content = json.dumps(found, ensure_ascii=False)
        else:
            content = _output_text(item.get("output"), param)
        if sidecars is not None:
            sidecars.settle(messages)
        tool_message = {"role": "tool", "tool_call_id": call_id, "content": content}
        messages.append(tool_message)
        if sidecars is not None:
            sidecars.add(tool_message, item)
    elif kind == "compaction":
        token = item.get("encrypted_content")
        checkpoint = checkpoints.get(token) if isinstance(token, str) else None
        if checkpoint is None:
            out.dropped["compaction"] = out.dropped.get("compaction", 0) + 1  # not issued by this proxy
        else:
            if sidecars is not None:
                sidecars.settle(messages)
            messages.append(dict(checkpoint))
    elif kind == "item_reference":
        raise InvalidRequest(f"input[{index}]: item_reference is not supported; send the item itself.", param=param)
    elif kind == "reasoning" or kind in _HOSTED_ITEM_TYPES:
        if sidecars is not None:
            sidecars.pending.append(dict(item))  # kept whole, with the turn it belongs to
        else:
            out.dropped[str(kind)] = out.dropped.get(str(kind), 0) + 1
    else:
        raise InvalidRequest(f"input[{index}]: unknown item type {kind!r}.", param=f"{param}.type")


def _assistant_for_calls(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message new calls join: the previous one if nothing came after it."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", [])
        return last
    message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": []}
    messages.append(message)
    return message


def _tool_call(item: Mapping[str, Any], kind: str, param: str, tools: ToolMap) -> dict[str, Any]:
    call_id = _call_id(item, param)
    if kind == "tool_search_call":
        name, arguments = TOOL_SEARCH, json.dumps(item.get("arguments") or {}, ensure_ascii=False)
    else:
        name = tools.flat_name(_required_str(item, "name", param), item.get("namespace"))
        if kind == "custom_tool_call":
            raw = item.get("input")
            if not isinstance(raw, str):
                raise InvalidRequest(f"{param}: a custom_tool_call needs a string input.", param=f"{param}.input")
            arguments = json.dumps({"input": raw}, ensure_ascii=False)
        else:
            given = item.get("arguments")
            if not isinstance(given, str):
                raise InvalidRequest(f"{param}: a function_call needs string arguments.", param=f"{param}.arguments")
            arguments = given
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _call_id(item: Mapping[str, Any], param: str) -> str:
    call_id = item.get("call_id") or (item.get("id") if item.get("type") == "tool_search_call" else None)
    if not isinstance(call_id, str) or not call_id:
        raise InvalidRequest(f"{param}: call_id is required.", param=f"{param}.call_id")
    return call_id


def _required_str(item: Mapping[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{param}: {key} is required.", param=f"{param}.{key}")
    return value


def _content(content: Any, param: str, role: str) -> Any:
    """Message content: a string, or text/image parts; a single text part becomes a string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{param}: content must be a string or a list of parts.", param=f"{param}.content")
    parts: list[dict[str, Any]] = []
    for number, part in enumerate(content):
        where = f"{param}.content.{number}"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image" and role == "user":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise InvalidRequest(f"{where}: only input_image with an image_url is supported.", param=where)
            image: dict[str, Any] = {"url": url}
            if part.get("detail") in ("low", "high", "auto"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise InvalidRequest(f"{where}: content part {kind!r} is not supported for role {role}.", param=where)
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts) if len(parts) == 1 else parts or ""
    return parts


def _output_text(output: Any, param: str) -> str:
    """A tool output as text (chat tool messages carry text); image parts are named, not sent."""
    if isinstance(output, str):
        return output
    if not isinstance(output, list):
        raise InvalidRequest(f"{param}: output must be a string or a list of parts.", param=f"{param}.output")
    texts = []
    for part in output:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text", "text"):
            texts.append(str(part.get("text", "")))
        else:
            texts.append(f"[{kind} omitted: a chat tool result carries text only]")
    return "\n".join(texts)


@dataclass
class ChatTranslation:
    """The canonical chat body and what the trace should say about the translation."""

    body: dict[str, Any]
    tools: ToolMap
    notes: dict[str, Any]


def build_chat_body(
    request: ResponsesRequest, messages: list[dict[str, Any]], translated: InputTranslation, tools: ToolMap
) -> ChatTranslation:
    """The ``/v1/chat/completions`` body for this request (``messages`` already include any history)."""
    for index, found in enumerate(translated.extra_tools):
        _add_tool(tools, found, None, f"input.tool_search_output.tools.{index}")
    body: dict[str, Any] = {"model": request.model, "messages": messages}
    notes: dict[str, Any] = {"api": "responses"}
    if tools.functions:
        body["tools"] = tools.functions
        choice, note = translate_tool_choice(request.tool_choice, tools)
        if choice is not None:
            body["tool_choice"] = choice
        if note:
            notes["toolChoice"] = note
        if request.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.max_output_tokens is not None:
        body["max_tokens"] = request.max_output_tokens
    for key in ("temperature", "top_p", "metadata", "user"):
        value = getattr(request, key)
        if value is not None:
            body[key] = value
    response_format = _response_format(request.text)
    if response_format is not None:
        body["response_format"] = response_format
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}  # response.completed must carry usage
    if tools.omitted:
        notes["hostedToolsOmitted"] = tools.omitted
    if translated.dropped:
        notes["inputItemsDropped"] = translated.dropped
    ignored = sorted(
        key
        for key in (
            "reasoning",
            "include",
            "prompt_cache_key",
            "store",
            "client_metadata",
            "truncation",
            "service_tier",
        )
        if (request.model_extra or {}).get(key) is not None or getattr(request, key, None) is not None
    )
    if ignored:
        notes["fieldsNotForwarded"] = ignored
    check_tool_pairing(messages)
    return ChatTranslation(body, tools, notes)


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, Mapping) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise InvalidRequest(f"text.format type {fmt.get('type')!r} is not supported.", param="text.format")
