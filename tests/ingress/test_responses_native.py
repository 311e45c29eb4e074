"""The Responses codec of native passage: what OpenAI is sent and what the turn service reads back."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.ingress.responses.native import ResponsesCodec, native_request
from proxy.ingress.responses.request import (
    build_chat_body,
    input_items,
    parse_responses_request,
    translate_input,
    translate_tools,
)
from proxy.kernel.canonical import message_hash
from proxy.kernel.config import ModelRoute
from proxy.kernel.errors import InvalidRequest
from proxy.kernel.native import NATIVE

ROUTE = ModelRoute("codex", {"model": "openai/gpt-5-codex", "api_key": "k"}, max_output_tokens=64_000)
REASONING = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [{"type": "summary_text", "text": "s"}],
    "encrypted_content": "ENC-1",
}
CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell", "arguments": '{"cmd":"ls"}'}
PATCH = {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin"}
SEARCH = {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "q"}}


def request(**extra: Any) -> dict[str, Any]:
    """A Codex-shaped request: reasoning items before their calls, a custom tool, a hosted tool."""
    return {
        "model": "codex",
        "instructions": "You are Codex.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: on"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
            REASONING,
            SEARCH,
            CALL,
            {"type": "function_call_output", "call_id": "call_1", "output": "a.py"},
            PATCH,
            {"type": "custom_tool_call_output", "call_id": "call_2", "output": "done"},
        ],
        "tools": [
            {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}},
            {"type": "custom", "name": "apply_patch", "description": "patch"},
            {"type": "web_search"},
        ],
        "reasoning": {"effort": "high", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "store": False,
        "prompt_cache_key": "pck",
        "safety_identifier": "sid",
        "service_tier": "priority",
        "text": {"verbosity": "low"},
        "parallel_tool_calls": False,
        "max_output_tokens": 100_000,
        "tool_choice": "auto",
        "stream": True,
        **extra,
    }


def translated(raw: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], ResponsesCodec]:
    parsed = parse_responses_request(raw)
    tools = translate_tools(parsed.tools or [])
    items = translate_input(input_items(parsed), tools, {}, native=True)
    messages = [{"role": "system", "content": parsed.instructions or ""}, *items.messages]
    chat = build_chat_body(parsed, messages, items, tools)
    passage = native_request(raw, ROUTE, chat.tools, chat.notes)
    assert isinstance(passage.codec, ResponsesCodec) and chat.notes["passage"] == "native"
    return chat.body["messages"], chat.body.get("tools") or [], passage.codec


def test_an_unchanged_conversation_is_sent_as_the_client_sent_it() -> None:
    raw = request()
    messages, tools, codec = translated(raw)
    body = codec.body(messages, tools, stream=True)
    assert body["input"] == raw["input"]  # the reasoning item with its encrypted_content, in place
    assert body["instructions"] == "You are Codex."
    assert body["tools"] == raw["tools"]  # the hosted web_search too
    for key in ("reasoning", "include", "store", "prompt_cache_key", "safety_identifier", "service_tier", "text"):
        assert body[key] == raw[key], key
    assert body["parallel_tool_calls"] is False and body["tool_choice"] == "auto"
    assert body["max_output_tokens"] == 64_000 and body["model"] == "gpt-5-codex" and body["stream"] is True


def test_a_reasoning_item_travels_with_the_call_it_preceded() -> None:
    messages, _, _ = translated(request())
    (assistant,) = [m for m in messages if m["role"] == "assistant" and m["tool_calls"][0]["id"] == "call_1"]
    assert assistant[NATIVE]["parts"] == [REASONING, SEARCH, CALL]  # one atomic unit for the window


def test_a_previewed_output_is_rendered_from_its_chat_form_the_rest_stays_native() -> None:
    messages, tools, codec = translated(request())
    index = next(i for i, m in enumerate(messages) if m.get("tool_call_id") == "call_2")
    messages[index] = {**messages[index], "content": "[preview] ref=to_9"}
    body = codec.body([{"role": "system", "content": "## Identity"}, *messages[1:]], tools, stream=False)
    assert body["instructions"] == "## Identity"
    assert body["input"][-1] == {"type": "custom_tool_call_output", "call_id": "call_2", "output": "[preview] ref=to_9"}
    assert body["input"][2] == REASONING  # untouched
    assert body["stream"] is False  # the call's own choice, not the client's request


def test_the_answer_read_back_is_the_message_the_client_sends_next() -> None:
    _, _, codec = translated(request())
    answer = {
        "id": "resp_1",
        "status": "completed",
        "output": [REASONING, CALL],
        "usage": {
            "input_tokens": 50,
            "output_tokens": 5,
            "input_tokens_details": {"cached_tokens": 40},
            "output_tokens_details": {"reasoning_tokens": 3},
        },
    }
    chat = codec.chat_view(answer)
    message = chat["choices"][0]["message"]
    again = translate_input([REASONING, CALL], translate_tools(request()["tools"]), {}, native=True).messages[0]
    assert message_hash(message) == message_hash(again) and message[NATIVE]["parts"] == [REASONING, CALL]
    assert chat["choices"][0]["finish_reason"] == "tool_calls"
    assert chat["usage"]["prompt_tokens"] == 50 and chat["usage"]["prompt_tokens_details"]["cached_tokens"] == 40


def test_a_stream_ends_with_the_response_and_a_response_becomes_its_stream() -> None:
    _, _, codec = translated(request())
    message = {"type": "message", "id": "m", "role": "assistant", "status": "completed"}
    message["content"] = [{"type": "output_text", "text": "hi", "annotations": []}]
    answer = {"id": "r", "status": "completed", "output": [REASONING, message, CALL], "usage": {}}
    events = codec.events_of(answer)
    assert events[-1]["type"] == "response.completed" and codec.response_of(events) == answer
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    cut = codec.response_of([e for e in events if e["type"] != "response.completed"])
    assert cut["status"] == "incomplete" and cut["output"] == [REASONING, message, CALL]


def test_a_hosted_tool_the_route_does_not_allow_is_refused() -> None:
    route = ModelRoute(**{**ROUTE.__dict__, "allowed_server_tools": frozenset({"file_search"})})
    parsed = parse_responses_request(request())
    tools = translate_tools(parsed.tools or [])
    with pytest.raises(InvalidRequest, match="allowed_server_tools"):
        native_request(request(), route, tools, {})
