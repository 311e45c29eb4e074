"""The Anthropic request -> canonical chat body translation (proxy/ingress/messages/request.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.ingress.chat.wire import parse_chat_request
from proxy.ingress.front_door import identify
from proxy.ingress.messages.request import to_chat
from proxy.ingress.messages.wire import parse_messages_request
from proxy.kernel.config import ModelRoute
from proxy.kernel.errors import InvalidRequest

OPENAI = ModelRoute("m", {"model": "openai/gpt-4o"}, max_output_tokens=16_384)
ANTHROPIC = ModelRoute("m", {"model": "anthropic/claude-sonnet-4-5"})
HEADERS = {"anthropic-version": "2023-06-01", "anthropic-beta": "context-1m-2025-08-07", "x-api-key": "secret"}
EPHEMERAL = {"type": "ephemeral"}


def translate(body: dict[str, Any], route: ModelRoute = OPENAI, headers: dict[str, str] | None = None):
    body = {"model": "m", "max_tokens": 100, **body}
    translation = to_chat(parse_messages_request(body), body, route, headers or HEADERS)
    parse_chat_request(translation.body)  # every translation is a valid chat request
    return translation


CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "text", "text": "task", "cache_control": EPHEMERAL}]},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "let me see", "signature": "sig-1"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Running."},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": "no such dir",
                "is_error": True,
                "cache_control": EPHEMERAL,
            },
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
        ],
    },
    {"role": "system", "content": "Mid-conversation note."},
]


def test_blocks_become_chat_messages_with_marks_ids_and_errors_kept():
    translation = translate({"messages": CONVERSATION, "system": "You are Claude Code."}, ANTHROPIC)
    messages = translation.body["messages"]
    assert messages[0] == {"role": "system", "content": "You are Claude Code."}
    assert messages[1] == {"role": "user", "content": [{"type": "text", "text": "task", "cache_control": EPHEMERAL}]}
    assert messages[2] == {
        "role": "assistant",
        "content": "Running.",
        "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}
        ],
        "thinking_blocks": [
            {"type": "thinking", "thinking": "let me see", "signature": "sig-1"},
            {"type": "redacted_thinking", "data": "opaque"},
        ],
    }
    assert messages[3] == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": "Error: no such dir",
        "cache_control": EPHEMERAL,
    }
    assert messages[4] == {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}],
    }
    assert messages[5] == {"role": "system", "content": "Mid-conversation note."}
    assert translation.notes["droppedServerBlocks"] == 2


def test_openai_route_gets_neither_marks_nor_thinking_blocks():
    tools = [{"name": "Bash", "input_schema": {"type": "object"}, "cache_control": EPHEMERAL}]
    chat = translate({"messages": CONVERSATION, "tools": tools}).body
    assert "cache_control" not in json.dumps(chat)  # litellm would pass a message-level mark on to OpenAI
    assert chat["messages"][0] == {"role": "user", "content": "task"}
    assert chat["messages"][2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: no such dir"}
    assert "thinking_blocks" not in chat["messages"][1]  # signatures mean nothing to another provider


def test_anthropic_route_keeps_thinking_blocks_betas_and_anthropic_only_fields():
    body = {
        "messages": CONVERSATION,
        "thinking": {"type": "enabled", "budget_tokens": 2000},
        "top_k": 5,
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "max_tokens": 64_000,
    }
    translation = translate(body, ANTHROPIC)
    chat = translation.body
    assert chat["messages"][1]["thinking_blocks"] == [
        {"type": "thinking", "thinking": "let me see", "signature": "sig-1"},
        {"type": "redacted_thinking", "data": "opaque"},
    ]
    # litellm's own arguments, set by the ingress, apart from the client's fields the allow-list judges
    provider = translation.provider_fields
    assert not {"thinking", "top_k", "output_config", "extra_headers"} & set(chat)
    assert provider["thinking"] == {"type": "enabled", "budget_tokens": 2000}
    assert (provider["top_k"], provider["output_config"], chat["max_tokens"]) == (5, {"effort": "high"}, 64_000)
    assert provider["extra_headers"] == {"anthropic-version": "2023-06-01", "anthropic-beta": "context-1m-2025-08-07"}
    assert "context_management" not in chat
    assert translation.notes["notForwarded"] == {"context_management": "superseded by the proxy's own context assembly"}


def test_openai_route_gets_no_anthropic_fields_or_headers_and_a_clamped_max_tokens():
    body = {"messages": CONVERSATION, "thinking": {"type": "adaptive"}, "top_k": 5, "max_tokens": 64_000}
    translation = translate(body)
    assert not {"thinking", "top_k", "extra_headers"} & set(translation.body)
    assert translation.body["max_tokens"] == 16_384
    assert translation.notes["maxTokensClamped"] == {"requested": 64_000, "sent": 16_384}
    assert set(translation.notes["notForwarded"]) == {"thinking", "top_k"}


def test_client_cannot_reach_litellm_arguments_through_the_body():
    translation = translate(
        {"messages": CONVERSATION, "api_base": "http://evil", "extra_headers": {"x": "y"}}, ANTHROPIC
    )
    assert "api_base" not in translation.body and "extra_headers" not in translation.body
    assert translation.provider_fields["extra_headers"] == {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "context-1m-2025-08-07",
    }
    assert translation.notes["ignoredFields"] == ["api_base", "extra_headers"]


def test_tools_choice_and_server_tools():
    tools = [
        {"name": "Bash", "description": "Run", "input_schema": {"type": "object"}, "cache_control": EPHEMERAL},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
    ]
    translation = translate(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "tools": tools,
            "tool_choice": {"type": "tool", "name": "Bash", "disable_parallel_tool_use": True},
        },
        ANTHROPIC,
    )
    assert translation.body["tools"] == [
        {
            "type": "function",
            "function": {"name": "Bash", "parameters": {"type": "object"}, "description": "Run"},
            "cache_control": EPHEMERAL,
        }
    ]
    assert translation.body["tool_choice"] == {"type": "function", "function": {"name": "Bash"}}
    assert translation.body["parallel_tool_calls"] is False
    assert translation.notes["droppedServerTools"] == ["web_search (web_search_20250305)"]
    for kind, expected in (("auto", "auto"), ("any", "required"), ("none", "none")):
        chosen = translate(
            {"messages": [{"role": "user", "content": "hi"}], "tools": tools[:1], "tool_choice": {"type": kind}}
        )
        assert chosen.body["tool_choice"] == expected


def test_tool_result_blocks_and_documents():
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "doc body"},
                    "title": "T",
                },
            ],
        },
    ]
    chat = translate({"messages": messages}).body["messages"]
    assert chat[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "Read", "arguments": "{}"}}],
    }
    assert chat[2]["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert chat[3] == {"role": "user", "content": "T\n\ndoc body"}


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "bogus"}],
        [{"type": "tool_use", "id": "x", "name": "n", "input": {}}],  # a tool_use in a user message
        [{"type": "image", "source": {"type": "base64"}}],
        ["not a block"],
    ],
)
def test_bad_blocks_are_invalid_requests(content):
    with pytest.raises(InvalidRequest):
        translate({"messages": [{"role": "user", "content": content}]})


def test_claude_code_session_id_names_the_session_with_x_session_id_first():
    user_id = '{"device_id":"d","account_uuid":"","session_id":"c561-uuid"}'
    body = {"messages": [{"role": "user", "content": "hi"}], "metadata": {"user_id": user_id}}
    translation = translate(body)
    assert translation.body["user"] == user_id
    assert identify({}, translation.body).context_id == "c561-uuid"  # from metadata.user_id when no header
    by_header = identify({"X-Claude-Code-Session-Id": "cc-header"}, translation.body)
    assert (by_header.context_id, by_header.source) == ("cc-header", "header:x-claude-code-session-id")
    explicit = identify({"X-Claude-Code-Session-Id": "cc-header", "x-session-id": "mine"}, translation.body)
    assert explicit.context_id == "mine"
