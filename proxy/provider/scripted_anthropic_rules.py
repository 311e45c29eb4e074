"""What Anthropic's Messages API refuses, refused by the stand-in in Anthropic's own words.

``check_request`` raises ``Refusal`` for the first rule a request breaks. The messages follow the real
API's, as quoted in public issue threads (request ids ``req_011…`` of the first-party API): unknown
fields and block types, roles that do not alternate, a ``tool_result`` without its ``tool_use`` (and
the reverse), more than four ``cache_control`` breakpoints, a thinking or redacted_thinking block the
stand-in did not issue for that place, and a thinking-enabled tool loop whose assistant turn does not
open with thinking. Only the API's shape that tests of native passage meet is checked, not all of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from proxy.provider.scripted_anthropic_signing import ThinkingSigner, tool_ids_after

THINKING_DOCS = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
MAX_BREAKPOINTS = 4
MIN_THINKING_BUDGET = 1024

CREATE_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "metadata",
        "stop_sequences",
        "top_k",
        "top_p",
        "temperature",
        "stream",
        "service_tier",
        "output_config",
        "container",
        "mcp_servers",
        "context_management",
        "inference_geo",
    }
)
COUNT_FIELDS = frozenset(
    {"model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers", "context_management"}
)

# Each block type: (required fields, optional fields). A type missing here is not a type Anthropic knows.
BLOCK_FIELDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "text": (frozenset({"text"}), frozenset({"cache_control", "citations"})),
    "image": (frozenset({"source"}), frozenset({"cache_control"})),
    "document": (frozenset({"source"}), frozenset({"cache_control", "title", "context", "citations"})),
    "search_result": (frozenset({"source", "title", "content"}), frozenset({"cache_control", "citations"})),
    "tool_use": (frozenset({"id", "name", "input"}), frozenset({"cache_control", "caller", "toolset_name"})),
    "tool_result": (frozenset({"tool_use_id"}), frozenset({"content", "is_error", "cache_control"})),
    "thinking": (frozenset({"thinking", "signature"}), frozenset()),
    "redacted_thinking": (frozenset({"data"}), frozenset()),
    "server_tool_use": (frozenset({"id", "name", "input"}), frozenset({"cache_control", "caller"})),
    "web_search_tool_result": (frozenset({"tool_use_id", "content"}), frozenset({"cache_control", "caller"})),
    "web_fetch_tool_result": (frozenset({"tool_use_id", "content"}), frozenset({"cache_control", "caller"})),
}
THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})
SERVER_RESULT_TYPES = frozenset({"web_search_tool_result", "web_fetch_tool_result"})


class Refusal(Exception):
    """A request the stand-in refuses: the HTTP status, Anthropic's error type and its message."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.kind = kind

    def body(self, request_id: str) -> dict[str, Any]:
        """The error as Anthropic's API answers it."""
        return {"type": "error", "error": {"type": self.kind, "message": self.message}, "request_id": request_id}


def thinking_enabled(body: dict[str, Any]) -> bool:
    """Whether the request lets the model think (a budget, or adaptive thinking)."""
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in {"enabled", "adaptive"}


def blocks_of(message: dict[str, Any]) -> list[Any]:
    """A message's content as blocks: a string content is one text block."""
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def check_request(
    body: dict[str, Any], signer: ThinkingSigner, betas: frozenset[str], *, counting: bool = False
) -> None:
    """Raise ``Refusal`` if Anthropic would refuse this Messages (or, ``counting``, count_tokens) request."""
    _check_fields(body, counting)
    _check_system_and_tools(body)
    _check_thinking_config(body, betas, counting)
    messages = body["messages"]
    _check_messages(messages)
    _check_tool_pairs(messages)
    found = sum(1 for _ in _breakpoints(body))
    if found > MAX_BREAKPOINTS:
        raise Refusal(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {found}.")
    _check_signatures(messages, signer)
    _check_thinking_turn(body, messages)


def _extra(path: str) -> Refusal:
    return Refusal(f"{path}: Extra inputs are not permitted")


def _tag(path: str, found: Any, expected: Iterator[str] | frozenset[str] | list[str]) -> Refusal:
    tags = ", ".join(f"'{tag}'" for tag in sorted(expected))
    return Refusal(f"{path}: Input tag '{found}' found using 'type' does not match any of the expected tags: {tags}")


def _check_fields(body: dict[str, Any], counting: bool) -> None:
    allowed = COUNT_FIELDS if counting else CREATE_FIELDS
    for name in body:
        if name not in allowed:
            raise _extra(name)
    for name in ("model", "messages") if counting else ("model", "max_tokens", "messages"):
        if name not in body:
            raise Refusal(f"{name}: Field required")
    if not isinstance(body["messages"], list):
        raise Refusal("messages: Input should be a valid list")
    if not counting and (not isinstance(body["max_tokens"], int) or body["max_tokens"] < 1):
        raise Refusal("max_tokens: Input should be greater than or equal to 1")
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        for name in metadata:
            if name != "user_id":
                raise _extra(f"metadata.{name}")


def _check_system_and_tools(body: dict[str, Any]) -> None:
    system = body.get("system")
    if isinstance(system, list):
        for index, block in enumerate(system):
            if not isinstance(block, dict) or block.get("type") != "text":
                raise _tag(f"system.{index}", (block or {}).get("type") if isinstance(block, dict) else block, ["text"])
            _check_block_fields(f"system.{index}", block)
    for index, tool in enumerate(body.get("tools") or []):
        kind = tool.get("type", "custom") if isinstance(tool, dict) else None
        if kind in (None, "custom") and not (isinstance(tool, dict) and "input_schema" in tool):
            raise Refusal(f"tools.{index}.custom.input_schema: Field required")
        if not isinstance(tool, dict) or "name" not in tool:
            raise Refusal(f"tools.{index}.{kind}.name: Field required")
    choice = body.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else choice
        if kind not in {"auto", "any", "tool", "none"}:
            raise _tag("tool_choice", kind, ["auto", "any", "tool", "none"])
        if kind == "tool" and "name" not in choice:
            raise Refusal("tool_choice.tool.name: Field required")


def _check_thinking_config(body: dict[str, Any], betas: frozenset[str], counting: bool) -> None:
    thinking = body.get("thinking")
    if thinking is None:
        return
    kind = thinking.get("type") if isinstance(thinking, dict) else thinking
    if kind not in {"enabled", "disabled", "adaptive"}:
        raise _tag("thinking", kind, ["adaptive", "disabled", "enabled"])
    if kind != "enabled":
        return
    budget = thinking.get("budget_tokens")
    if budget is None:
        raise Refusal("thinking.enabled.budget_tokens: Field required")
    if not isinstance(budget, int) or budget < MIN_THINKING_BUDGET:
        raise Refusal(f"thinking.enabled.budget_tokens: Input should be greater than or equal to {MIN_THINKING_BUDGET}")
    # Interleaved thinking spreads the budget over a whole tool loop, so it may exceed one answer's max_tokens.
    interleaved = any(beta.startswith("interleaved-thinking") for beta in betas)
    if not counting and not interleaved and body["max_tokens"] <= budget:
        raise Refusal(
            "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at "
            f"{THINKING_DOCS}#max-tokens-and-context-window-size"
        )


def _check_block_fields(path: str, block: dict[str, Any]) -> None:
    kind = block.get("type")
    if kind not in BLOCK_FIELDS:
        raise _tag(path, kind, frozenset(BLOCK_FIELDS))
    required, optional = BLOCK_FIELDS[kind]
    for name in sorted(required):
        if name not in block:
            raise Refusal(f"{path}.{kind}.{name}: Field required")
    for name in block:
        if name != "type" and name not in required and name not in optional:
            raise _extra(f"{path}.{kind}.{name}")


def _check_messages(messages: list[Any]) -> None:
    previous = None
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise Refusal(f"messages.{index}: Input should be a valid dictionary")
        for name in message:
            if name not in {"role", "content"}:
                raise _extra(f"messages.{index}.{name}")
        role = message.get("role")
        if role not in {"user", "assistant"}:
            raise Refusal(f"messages.{index}.role: Input should be 'user' or 'assistant'")
        if role == previous:
            raise Refusal(
                'messages: roles must alternate between "user" and "assistant", '
                f'but found multiple "{role}" roles in a row'
            )
        previous = role
        content = message.get("content")
        final_assistant = role == "assistant" and index == len(messages) - 1
        if not content and not final_assistant:
            raise Refusal(
                "messages: all messages must have non-empty content except for the optional final assistant message"
            )
        if isinstance(content, list):
            for number, block in enumerate(content):
                if not isinstance(block, dict):
                    raise Refusal(f"messages.{index}.content.{number}: Input should be a valid dictionary")
                _check_block_fields(f"messages.{index}.content.{number}", block)
        elif not isinstance(content, str):
            raise Refusal(f"messages.{index}.content: Input should be a valid string or a valid list")


def _check_tool_pairs(messages: list[dict[str, Any]]) -> None:
    for index, message in enumerate(messages):
        blocks = blocks_of(message)
        if message["role"] == "assistant":
            servers: set[str] = set()
            for number, block in enumerate(blocks):
                if block["type"] == "server_tool_use":
                    servers.add(block["id"])
                elif block["type"] in SERVER_RESULT_TYPES and block["tool_use_id"] not in servers:
                    raise Refusal(
                        f"messages.{index}.content.{number}: unexpected `tool_use_id` found in `{block['type']}` "
                        f"blocks: {block['tool_use_id']}. Each `{block['type']}` block must have a corresponding "
                        "`server_tool_use` block before it."
                    )
            calls = [block["id"] for block in blocks if block["type"] == "tool_use"]
            if calls and index + 1 < len(messages):
                answered = {b["tool_use_id"] for b in blocks_of(messages[index + 1]) if b["type"] == "tool_result"}
                missing = [call for call in calls if call not in answered]
                if missing:
                    raise Refusal(
                        f"messages.{index}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                        f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block "
                        "in the next message."
                    )
            continue
        before = blocks_of(messages[index - 1]) if index > 0 else []
        asked = {block["id"] for block in before if block["type"] == "tool_use"}
        for number, block in enumerate(blocks):
            if block["type"] == "tool_result" and block["tool_use_id"] not in asked:
                raise Refusal(
                    f"messages.{index}.content.{number}: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{block['tool_use_id']}. Each `tool_result` block must have a corresponding `tool_use` block "
                    "in the previous message."
                )


def _breakpoints(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every block, tool or system part that carries ``cache_control`` (tool results' inner blocks too)."""
    system = body.get("system")
    parts = list(body.get("tools") or []) + (list(system) if isinstance(system, list) else [])
    for message in body["messages"]:
        for block in blocks_of(message):
            parts.append(block)
            if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
                parts.extend(block["content"])
    yield from (part for part in parts if isinstance(part, dict) and part.get("cache_control") is not None)


def _check_signatures(messages: list[dict[str, Any]], signer: ThinkingSigner) -> None:
    for index, message in enumerate(messages):
        blocks = blocks_of(message)
        for number, block in enumerate(blocks):
            if block["type"] in THINKING_TYPES and not signer.verify(block, tool_ids_after(blocks, number)):
                field = "signature" if block["type"] == "thinking" else "data"
                raise Refusal(f"messages.{index}.content.{number}: Invalid `{field}` in `{block['type']}` block")


def _check_thinking_turn(body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
    last = len(messages) - 1
    if not thinking_enabled(body):
        if last >= 0 and messages[last]["role"] == "assistant":
            for number, block in enumerate(blocks_of(messages[last])):
                if block["type"] in THINKING_TYPES:
                    raise Refusal(
                        f"messages.{last}.content.{number}: When thinking is disabled, an `assistant` message in the "
                        "final position cannot contain `thinking`. To use thinking blocks, enable `thinking` in your "
                        "request."
                    )
        return
    # The unfinished tool loop: from the end, user turns answering tool calls and the assistant turns that made
    # them. Its first assistant turn is where the model thought before its first call, so it must open with that.
    opening = None
    index = last
    while index >= 1 and messages[index]["role"] == "user":
        if not any(block["type"] == "tool_result" for block in blocks_of(messages[index])):
            break
        opening = index - 1
        index -= 2
    if opening is None:
        return
    first = blocks_of(messages[opening])[0]
    if first["type"] not in THINKING_TYPES:
        raise Refusal(
            f"messages.{opening}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
            f"`{first['type']}`. When `thinking` is enabled, a final `assistant` message must start with a thinking "
            "block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you include "
            f"thinking blocks from previous turns. To avoid this requirement, disable `thinking`. Please consult our "
            f"documentation at {THINKING_DOCS}"
        )
