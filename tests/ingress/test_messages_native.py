"""The Messages codec of native passage: what the provider is sent and what the turn service reads back."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from proxy.ingress.messages.native import AnthropicCodec, native_request
from proxy.ingress.messages.request import to_chat
from proxy.ingress.messages.wire import parse_messages_request
from proxy.kernel.canonical import message_hash
from proxy.kernel.config import ModelRoute
from proxy.kernel.errors import InvalidRequest
from proxy.kernel.native import NATIVE

ROUTE = ModelRoute("claude", {"model": "anthropic/claude-sonnet-4-5", "api_key": "k"}, max_output_tokens=16_000)
THINKING = {"type": "thinking", "thinking": "Let me look.", "signature": "SIG-1"}
SEARCH = [
    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}},
    {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": [{"type": "web_search_result", "url": "u", "title": "t", "encrypted_content": "ENC"}],
    },
]
CITED = {
    "type": "text",
    "text": "It is x.",
    "citations": [{"type": "web_search_result_location", "url": "u", "title": "t", "encrypted_index": "EI"}],
}


def request(**extra: Any) -> dict[str, Any]:
    """A Claude Code-shaped request: marked system prompt, thinking, a server tool, a tool loop."""
    return {
        "model": "claude",
        "max_tokens": 32_000,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Find x.", "cache_control": {"type": "ephemeral"}}]},
            {
                "role": "assistant",
                "content": [
                    THINKING,
                    *SEARCH,
                    CITED,
                    {"type": "tool_use", "id": "tu_1", "name": "Bash", "input": {"c": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "tu_1",
                        "content": "out",
                        "cache_control": {"type": "ephemeral"},
                    },
                    {"type": "text", "text": "go on"},
                ],
            },
        ],
        "tools": [
            {"name": "Bash", "description": "run", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        ],
        "thinking": {"type": "enabled", "budget_tokens": 4000},
        "top_k": 5,
        "output_config": {"effort": "high"},
        "service_tier": "auto",
        "metadata": {"user_id": "u"},
        "stop_sequences": ["END"],
        "tool_choice": {"type": "auto"},
        "context_management": {"edits": []},
        **extra,
    }


def translated(raw: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], AnthropicCodec]:
    translation = to_chat(parse_messages_request(raw), raw, ROUTE, {}, native=True)
    notes: dict[str, Any] = {}
    passage = native_request(raw, ROUTE, {"anthropic-version": "2023-06-01"}, translation.body["max_tokens"], notes)
    assert isinstance(passage.codec, AnthropicCodec)
    return translation.body["messages"], translation.body.get("tools") or [], passage.codec


def test_an_unchanged_conversation_is_sent_as_the_client_sent_it() -> None:
    raw = request()
    messages, tools, codec = translated(raw)
    body = codec.body(messages, tools, stream=False)
    assert body["messages"] == raw["messages"]  # thinking, server blocks, citations and cache marks as sent
    assert body["system"] == raw["system"]
    assert body["tools"] == raw["tools"]  # the server tool too, in the client's order
    for key in ("thinking", "top_k", "output_config", "service_tier", "metadata", "stop_sequences", "tool_choice"):
        assert body[key] == raw[key], key
    assert "context_management" not in body  # superseded by the proxy's assembly
    assert body["model"] == "claude-sonnet-4-5" and body["max_tokens"] == 16_000  # the route's, clamped
    assert "stream" not in body and codec.body(messages, tools, stream=True)["stream"] is True


def test_what_the_assembly_changed_is_rendered_from_its_chat_form_and_the_rest_stays_native() -> None:
    messages, tools, codec = translated(request())
    preview = {**messages[3], "content": "[preview] ref=to_1"}  # the tool result became a preview
    system = {"role": "system", "content": "## Identity\nYou are Claude Code."}  # the rendered prompt
    hidden = {"role": "user", "content": '<context source="plan">...</context>'}
    body = codec.body([system, messages[1], messages[2], preview, messages[4], hidden], tools, stream=False)
    assert body["system"] == [
        {"type": "text", "text": "## Identity\nYou are Claude Code.", "cache_control": {"type": "ephemeral"}}
    ]  # the client's mark carried onto the prompt it became part of
    assert body["messages"][1] == request()["messages"][1]  # the signed assistant turn byte for byte
    mark = {"type": "ephemeral"}  # the client's mark stays on its block, whose content the preview replaced
    assert body["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "tu_1", "content": "[preview] ref=to_1", "cache_control": mark},
        {"type": "text", "text": "go on"},
        {"type": "text", "text": '<context source="plan">...</context>'},
    ]  # one user message: tool results first, as Anthropic requires


def test_the_answer_read_back_is_the_message_the_client_sends_next_so_the_session_does_not_fork() -> None:
    _, _, codec = translated(request())
    answer = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [THINKING, *SEARCH, CITED, {"type": "tool_use", "id": "tu_2", "name": "Bash", "input": {"c": 2}}],
        "stop_reason": "tool_use",
        "usage": {
            "input_tokens": 10,
            "output_tokens": 7,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 20,
        },
    }
    chat = codec.chat_view(answer)
    message = chat["choices"][0]["message"]
    resent = request()
    resent["messages"] += [{"role": "assistant", "content": answer["content"]}]
    resent["messages"].append(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_2", "content": "o"}]}
    )
    again, _, _ = translated(resent)
    assert message_hash(message) == message_hash(again[5])
    assert message[NATIVE]["parts"] == answer["content"]
    assert chat["choices"][0]["finish_reason"] == "tool_calls"
    assert chat["usage"]["prompt_tokens"] == 130 and chat["usage"]["prompt_tokens_details"] == {"cached_tokens": 100}


def test_a_stream_adds_up_to_the_answer_and_an_answer_becomes_its_stream() -> None:
    _, _, codec = translated(request())
    answer = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [
            THINKING,
            *SEARCH,
            CITED,
            {"type": "tool_use", "id": "tu_2", "name": "Bash", "input": {"c": [1, 2]}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 7},
    }
    events = codec.events_of(answer)
    assert [e["type"] for e in events][:2] == ["message_start", "content_block_start"]
    assert {"type": "signature_delta", "signature": "SIG-1"} in [e.get("delta") for e in events]
    assert codec.response_of(events) == answer


def test_proxy_owned_calls_are_taken_out_of_an_answer_past_the_round_limit() -> None:
    _, _, codec = translated(request())
    answer = {
        "content": [THINKING, {"type": "tool_use", "id": "t", "name": "read_tool_output", "input": {}}],
        "stop_reason": "tool_use",
    }
    kept = codec.without_tools(answer, frozenset({"read_tool_output"}))
    assert kept["content"][0] == THINKING and kept["stop_reason"] == "end_turn"
    assert [b["type"] for b in kept["content"]] == ["thinking", "text"]


def test_betas_the_proxy_supersedes_or_the_route_refuses_are_not_forwarded_and_are_named() -> None:
    raw = request()
    notes: dict[str, Any] = {}
    route = ModelRoute(**{**ROUTE.__dict__, "allowed_betas": frozenset({"interleaved-thinking-2025-05-14", "x-1"})})
    headers = {"anthropic-beta": "interleaved-thinking-2025-05-14,context-management-2025-06-27,other-1"}
    passage = native_request(raw, route, headers, 16_000, notes)
    assert passage.headers == {"anthropic-beta": "interleaved-thinking-2025-05-14"}
    assert notes["betasNotForwarded"] == ["context-management-2025-06-27", "other-1"]
    assert notes["passage"] == "native"


def test_the_trace_does_not_call_dropped_what_native_passage_sends() -> None:
    raw = request(future_beta_field={"on": True})
    translation = to_chat(parse_messages_request(raw), raw, ROUTE, {}, native=True)
    assert translation.notes["droppedServerTools"] and translation.notes["ignoredFields"]  # the chat path's losses
    passage = native_request(raw, ROUTE, {}, 16_000, translation.notes)
    assert not {"droppedServerTools", "droppedServerBlocks", "ignoredFields"} & set(translation.notes)
    body = passage.codec.body(translation.body["messages"], translation.body["tools"], stream=False)
    assert body["future_beta_field"] == {"on": True}  # a field of a newer beta passes as sent


def test_a_server_tool_the_route_does_not_allow_is_refused_naming_the_setting() -> None:
    route = ModelRoute(**{**ROUTE.__dict__, "allowed_server_tools": frozenset({"web_fetch"})})
    with pytest.raises(InvalidRequest, match="allowed_server_tools") as refused:
        native_request(request(), route, {}, 16_000, {})
    assert refused.value.param == "tools.1"
    native_request(
        request(), ModelRoute(**{**ROUTE.__dict__, "allowed_server_tools": frozenset({"web_search"})}), {}, 1, {}
    )


def test_the_clients_request_is_never_changed_by_rendering() -> None:
    raw = request()
    before = copy.deepcopy(raw)
    messages, tools, codec = translated(raw)
    body = codec.body(messages, tools, stream=True)
    body["messages"][1]["content"][0]["thinking"] = "edited"
    assert raw == before
