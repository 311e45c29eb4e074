"""What OpenAI's Responses API refuses, refused by the stand-in in OpenAI's words and error shape.

``check_parameters`` looks at the request's top level, ``check_input`` at its input items: a reasoning
item whose ``encrypted_content`` the stand-in did not issue for it (or that was altered), a reasoning
item without the item that followed it when issued, a reasoning item given by id only that was never
stored, and a tool output without its call. The messages are the real API's as quoted in public issue
threads; where no quote was found they follow the API's pattern (noted beside them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.provider.scripted_responses_sealing import Following, ReasoningSealer, summary_texts

KNOWN_PARAMETERS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "reasoning",
        "include",
        "store",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "service_tier",
        "text",
        "parallel_tool_calls",
        "max_output_tokens",
        "max_tool_calls",
        "previous_response_id",
        "conversation",
        "stream",
        "stream_options",
        "metadata",
        "temperature",
        "top_p",
        "top_logprobs",
        "truncation",
        "user",
        "background",
        "prompt",
        "context_management",
        # Not in the SDK's types, but accepted: Codex sends it on every turn to api.openai.com as well
        # (codex-rs/codex-api ``ResponsesApiRequest.client_metadata``; tests/data/agents/codex-0.171.0).
        "client_metadata",
    }
)
ITEM_TYPES = frozenset(
    {
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "web_search_call",
        "item_reference",
    }
)
OUTPUTS = {
    "function_call_output": ("function_call", "function call"),
    "custom_tool_call_output": ("custom_tool_call", "custom tool call"),
}


class ResponsesRefusal(Exception):
    """A request the stand-in refuses: status, and OpenAI's error message, type, param and code."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The error as OpenAI's API answers it."""
        error = {"message": self.message, "type": "invalid_request_error", "param": self.param, "code": self.code}
        return {"error": error}


def not_stored(item_id: str) -> ResponsesRefusal:
    """The API's answer to an item referenced by id that was never stored."""
    return ResponsesRefusal(
        f"Item with id '{item_id}' not found. Items are not persisted when `store` is set to false. Try again with "
        "`store` set to true, or remove this item from your input.",
        status=404,
        param="input",
    )


def item_type(item: dict[str, Any]) -> Any:
    """An input item's type; an item with a role and no type is a message (the "easy" input form)."""
    return item.get("type", "message" if "role" in item else None)


def check_parameters(body: dict[str, Any]) -> None:
    """Raise ``ResponsesRefusal`` for an unknown parameter, a missing model, or input of the wrong type."""
    for name in body:
        if name not in KNOWN_PARAMETERS:  # wording: the API's, from memory of its answers (no public quote found)
            raise ResponsesRefusal(f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")
    if "model" not in body:
        raise ResponsesRefusal("Missing required parameter: 'model'.", param="model", code="missing_required_parameter")
    if "input" in body and not isinstance(body["input"], str | list):
        raise ResponsesRefusal(
            "Invalid type for 'input': expected one of a string or array of input items.",
            param="input",
            code="invalid_type",
        )


def check_input(
    items: list[Any],
    earlier: list[dict[str, Any]],
    sealer: ReasoningSealer,
    stored: Mapping[str, tuple[dict[str, Any], Following]],
) -> None:
    """Raise ``ResponsesRefusal`` for the first input item the API would refuse.

    ``earlier`` is what ``previous_response_id`` brings in before ``items``; ``stored`` maps the id of
    every stored item to the item and, for a reasoning item, the item that followed it when issued.
    """
    calls = {str(item.get("call_id")) for item in earlier if item_type(item) in {"function_call", "custom_tool_call"}}
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise ResponsesRefusal(
                f"Invalid type for 'input[{index}]': expected an object.", param=f"input[{index}]", code="invalid_type"
            )
        kind = item_type(item)
        if kind not in ITEM_TYPES:
            supported = ", ".join(f"'{name}'" for name in sorted(ITEM_TYPES))
            raise ResponsesRefusal(
                f"Invalid value: '{kind}'. Supported values are: {supported}.",
                param=f"input[{index}].type",
                code="invalid_value",
            )
        if kind in {"function_call", "custom_tool_call"}:
            calls.add(str(item.get("call_id")))
        elif kind in OUTPUTS and str(item.get("call_id")) not in calls:
            raise ResponsesRefusal(
                f"No tool call found for {OUTPUTS[kind][1]} output with call_id {item.get('call_id')}.", param="input"
            )
        elif kind == "item_reference" and str(item.get("id")) not in stored:
            raise not_stored(str(item.get("id")))
        elif kind == "reasoning":
            following = _reasoning_following(item, sealer, stored)
            if following is not None and not _follows(items[index + 1 : index + 2], following):
                raise ResponsesRefusal(
                    f"Item '{item.get('id')}' of type 'reasoning' was provided without its required following item.",
                    param="input",
                )


def _reasoning_following(
    item: dict[str, Any], sealer: ReasoningSealer, stored: Mapping[str, tuple[dict[str, Any], Following]]
) -> Following:
    """What must follow a reasoning input item, once its encrypted content (or its stored copy) checks out."""
    item_id = str(item.get("id"))
    token = item.get("encrypted_content")
    if token is None:
        if item_id not in stored:
            raise not_stored(item_id)
        return stored[item_id][1]
    valid, following = sealer.open(token, item_id, summary_texts(item))
    if not valid:
        raise ResponsesRefusal(
            f"The encrypted content for item {item_id} could not be verified. "
            "Reason: Encrypted content could not be decrypted or parsed.",
            code="invalid_encrypted_content",
        )
    return following


def _follows(after: list[Any], following: tuple[str | None, str | None]) -> bool:
    """Whether the item after a reasoning item is the one that followed it when issued (by id or call_id)."""
    if not after or not isinstance(after[0], dict):
        return False
    item_id, call_id = following
    return (item_id is not None and after[0].get("id") == item_id) or (
        call_id is not None and after[0].get("call_id") == call_id
    )
