"""The strict Anthropic Messages stand-in, over real HTTP on loopback, with the official SDK as the client."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import anthropic
import httpx
import pytest

from proxy.provider.scripted_anthropic import (
    DEFAULT_API_KEY,
    MessageReply,
    RedactedThinking,
    ScriptedAnthropic,
    SearchResult,
    Text,
    Thinking,
    ToolUse,
    WebSearch,
)
from tests.provider.conftest import Loopback

Serve = Callable[..., AbstractContextManager[anthropic.Anthropic]]
MODEL = "claude-scripted"
THINKING = {"type": "enabled", "budget_tokens": 2048}
TOOLS = [{"name": "weather", "description": "The weather in a city", "input_schema": {"type": "object"}}]
CITATION = {
    "type": "web_search_result_location",
    "cited_text": "Sunny all week.",
    "url": "https://weather.example/paris",
    "title": "Paris weather",
    "encrypted_index": "ix1",
}


@pytest.fixture
def serve(loopback: Loopback) -> Serve:
    """Serves a stand-in on loopback and yields an SDK client pointed at it."""

    @contextmanager
    def serving(stand_in: ScriptedAnthropic, **client: Any) -> Iterator[anthropic.Anthropic]:
        with (
            loopback.mount(stand_in.app()) as url,
            anthropic.Anthropic(base_url=url, api_key=DEFAULT_API_KEY, max_retries=0, **client) as sdk,
        ):
            yield sdk

    return serving


def thinking_then_tool(body: dict[str, Any]) -> MessageReply:
    """Think, then call the weather tool (``toolu_<n>`` on the n-th user turn); to "Thanks", think and say bye."""
    if body["messages"][-1]["content"] == "Thanks":
        return MessageReply((Thinking("nothing to look up"), Text("Bye.")))
    turn = len(body["messages"]) // 2
    return MessageReply((Thinking(f"thought {turn}"), ToolUse("weather", {"city": "Paris"}, id=f"toolu_{turn}")))


def create(sdk: anthropic.Anthropic, messages: list[Any], **extra: Any) -> anthropic.types.Message:
    """One Messages call with the weather tool, thinking enabled unless ``extra`` says otherwise."""
    arguments: dict[str, Any] = {"model": MODEL, "max_tokens": 4096, "thinking": THINKING, "tools": TOOLS, **extra}
    return sdk.messages.create(messages=messages, **arguments)


def refusal(error: anthropic.APIStatusError) -> str:
    """The message of an Anthropic-shaped error body."""
    body = error.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == ("invalid_request_error" if error.status_code == 400 else "authentication_error")
    return str(body["error"]["message"])


def result(call_id: str, text: str = "sunny") -> dict[str, Any]:
    """A user turn answering tool call ``call_id``."""
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text}]}


def tool_loop(sdk: anthropic.Anthropic) -> list[dict[str, Any]]:
    """Two rounds of the weather tool loop, the assistant turns as the API issued them, ending with a result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris, twice?"}]
    for _ in range(2):
        answer = create(sdk, messages)
        messages.append(
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in answer.content]}
        )
        messages.append(result(answer.content[-1].id))
    return messages


def test_an_answer_carries_its_blocks_and_the_request_is_recorded_with_its_headers(serve: Serve) -> None:
    stand_in = ScriptedAnthropic(lambda body: MessageReply((Text("Sunny.", (CITATION,)),)))
    with serve(stand_in, default_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"}) as sdk:
        answer = sdk.messages.create(
            model=MODEL,
            max_tokens=256,
            system=[{"type": "text", "text": "Be brief."}],
            messages=[{"role": "user", "content": "Weather?"}],
            metadata={"user_id": "u1"},
        )

    assert answer.content[0].type == "text" and answer.content[0].text == "Sunny."
    assert answer.content[0].citations is not None and answer.content[0].citations[0].url == CITATION["url"]
    assert answer.stop_reason == "end_turn" and answer.model == MODEL
    [received] = stand_in.requests
    assert stand_in.history == [received.body] and received.body["system"] == [{"type": "text", "text": "Be brief."}]
    assert received.path == "/v1/messages"
    assert (
        received.header("anthropic-version") and received.header("anthropic-beta") == "interleaved-thinking-2025-05-14"
    )
    assert received.header("authorization") == f"Bearer {DEFAULT_API_KEY}"  # how the SDK sends its key


def test_a_stream_is_the_real_event_sequence_and_the_sdk_rebuilds_the_same_message(serve: Serve) -> None:
    def script(body: dict[str, Any]) -> MessageReply:
        return MessageReply(
            (
                Thinking("The user wants the weather; search, then look it up."),
                WebSearch(
                    "paris weather",
                    (SearchResult("https://weather.example/paris", "Paris weather", "2 days"),),
                    "srv_1",
                ),
                RedactedThinking("hidden reasoning"),
                Text("Sunny all week.", (CITATION,)),
                ToolUse("weather", {"city": "Paris", "days": [1, 2, 3], "note": "a longer argument string"}, "toolu_w"),
            )
        )

    stand_in = ScriptedAnthropic(script)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    with serve(stand_in) as sdk:
        plain = create(sdk, messages)
        with sdk.messages.stream(
            model=MODEL, max_tokens=4096, thinking=THINKING, tools=TOOLS, messages=messages
        ) as stream:
            streamed = stream.get_final_message()
        events = list(create(sdk, messages, stream=True))

    assert [block.type for block in plain.content] == [
        "thinking", "server_tool_use", "web_search_tool_result", "redacted_thinking", "text", "tool_use",
    ]  # fmt: skip
    assert plain.content[0].signature
    assert [block.model_dump(exclude_none=True) for block in streamed.content] == [
        block.model_dump(exclude_none=True) for block in plain.content
    ]
    assert streamed.usage == plain.usage and plain.usage.server_tool_use is not None
    assert (streamed.stop_reason, plain.stop_reason) == ("tool_use", "tool_use")
    kinds = [event.type if event.type != "content_block_delta" else event.delta.type for event in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    thinking = kinds[kinds.index("content_block_start") : kinds.index("content_block_stop") + 1]
    assert thinking[1] == "thinking_delta" and thinking[-2:] == ["signature_delta", "content_block_stop"]
    assert kinds.count("input_json_delta") >= 4 and "citations_delta" in kinds  # tool input in a few pieces


def test_thinking_blocks_are_sent_only_when_the_request_enables_thinking(serve: Serve) -> None:
    stand_in = ScriptedAnthropic(lambda body: MessageReply((Thinking("hmm"), RedactedThinking(), Text("Hi."))))
    with serve(stand_in) as sdk:
        answer = sdk.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "Hi"}])
    assert [block.type for block in answer.content] == ["text"]


def test_a_tool_loop_that_sends_back_the_signed_thinking_is_answered(serve: Serve) -> None:
    stand_in = ScriptedAnthropic(thinking_then_tool)
    with serve(stand_in) as sdk:
        messages = tool_loop(sdk)
        create(sdk, messages)
    assert len(stand_in.history) == 3 and stand_in.history[-1]["messages"][3]["content"][0]["type"] == "thinking"


@pytest.mark.parametrize(
    ("spoil", "expected"),
    [
        ("tampered text", "messages.1.content.0: Invalid `signature` in `thinking` block"),
        ("emptied signature", "messages.1.content.0: Invalid `signature` in `thinking` block"),
        ("moved to the other turn", "messages.3.content.0: Invalid `signature` in `thinking` block"),
        ("moved after its tool call", "messages.1.content.1: Invalid `signature` in `thinking` block"),
        ("moved from a tool-free answer", "messages.1.content.0: Invalid `signature` in `thinking` block"),
        ("never issued", "messages.1.content.0: Invalid `signature` in `thinking` block"),
        ("another stand-in's", "messages.1.content.0: Invalid `signature` in `thinking` block"),
    ],
)
def test_a_thinking_block_not_issued_for_its_place_is_refused(serve: Serve, spoil: str, expected: str) -> None:
    stand_in = ScriptedAnthropic(thinking_then_tool)
    with serve(stand_in) as sdk:
        messages = tool_loop(sdk)
        first, second = messages[1]["content"], messages[3]["content"]
        if spoil == "tampered text":
            first[0]["thinking"] += " and more"
        elif spoil == "emptied signature":
            first[0]["signature"] = ""
        elif spoil == "moved to the other turn":
            second[0] = first[0]
        elif spoil == "moved after its tool call":
            first.reverse()
        elif spoil == "moved from a tool-free answer":
            first[0] = create(sdk, [{"role": "user", "content": "Thanks"}]).content[0].model_dump()
        elif spoil == "never issued":
            first[0]["signature"] = "EqQBCkgIARABGAIiQL1r3P4cb2GcnI4IHk+3ZEY5dPVK0Q=="
        else:
            other = ScriptedAnthropic(thinking_then_tool, secret=b"another secret")
            first[0]["signature"] = other.signer.sign_thinking(first[0]["thinking"], ["toolu_1"])
        with pytest.raises(anthropic.BadRequestError) as refused:
            create(sdk, messages)
    assert refusal(refused.value) == expected


def test_a_redacted_thinking_block_whose_data_was_altered_is_refused(serve: Serve) -> None:
    stand_in = ScriptedAnthropic(
        lambda body: MessageReply((RedactedThinking("secret"), ToolUse("weather", {}, "toolu_r")))
    )
    with serve(stand_in) as sdk:
        answer = create(sdk, [{"role": "user", "content": "Weather?"}])
        turn = {"role": "assistant", "content": [block.model_dump() for block in answer.content]}
        create(sdk, [{"role": "user", "content": "Weather?"}, turn, result("toolu_r")])  # as issued: answered
        turn["content"][0]["data"] = turn["content"][0]["data"][:-4] + "AAA="
        with pytest.raises(anthropic.BadRequestError) as refused:
            create(sdk, [{"role": "user", "content": "Weather?"}, turn, result("toolu_r")])
    assert refusal(refused.value) == "messages.1.content.0: Invalid `data` in `redacted_thinking` block"


def test_a_thinking_tool_loop_whose_assistant_turn_does_not_open_with_thinking_is_refused(serve: Serve) -> None:
    stand_in = ScriptedAnthropic(thinking_then_tool)
    with serve(stand_in) as sdk:
        messages = tool_loop(sdk)
        messages[1]["content"] = messages[1]["content"][1:]  # the turn's first answer, its thinking dropped
        with pytest.raises(anthropic.BadRequestError) as refused:
            create(sdk, messages)
        create(sdk, messages, thinking={"type": "disabled"})  # without thinking the same history is fine
    message = refusal(refused.value)
    assert message.startswith(
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `tool_use`. When `thinking` "
        "is enabled, a final `assistant` message must start with a thinking block (preceeding the lastmost set of "
        "`tool_use` and `tool_result` blocks)."
    )


def test_a_fifth_cache_control_breakpoint_is_refused(serve: Serve) -> None:
    stand_in = ScriptedAnthropic(lambda body: MessageReply((Text("ok"),)))
    mark = {"type": "ephemeral"}
    tools = [{**TOOLS[0], "cache_control": mark}]
    system = [
        {"type": "text", "text": "one", "cache_control": mark},
        {"type": "text", "text": "two", "cache_control": mark},
    ]
    user = [{"type": "text", "text": "three", "cache_control": mark}]
    with serve(stand_in) as sdk:
        sdk.messages.create(
            model=MODEL, max_tokens=64, tools=tools, system=system, messages=[{"role": "user", "content": user}]
        )
        fifth = [*user, {"type": "text", "text": "four", "cache_control": mark}]
        with pytest.raises(anthropic.BadRequestError) as refused:
            sdk.messages.create(
                model=MODEL, max_tokens=64, tools=tools, system=system, messages=[{"role": "user", "content": fifth}]
            )
    assert refusal(refused.value) == "A maximum of 4 blocks with cache_control may be provided. Found 5."


def system_of(size: int) -> list[dict[str, Any]]:
    """A system block whose canonical JSON part, ``{"system":{"text":…,"type":"text"}}``, is ``size`` bytes."""
    return [{"type": "text", "text": "s" * (size - 36), "cache_control": {"type": "ephemeral"}}]


def test_the_prompt_cache_bills_reads_writes_and_the_rest_like_anthropic(serve: Serve) -> None:
    stand_in = ScriptedAnthropic(lambda body: MessageReply((Text("ok"),)))
    system = system_of(5000)  # 1,250 tokens: over the 1,024 minimum
    first = [{"role": "user", "content": "Question one?"}]
    longer = [
        *first,
        {"role": "assistant", "content": "Answer one."},
        {"role": "user", "content": [{"type": "text", "text": "q" * 6000, "cache_control": {"type": "ephemeral"}}]},
    ]
    with serve(stand_in) as sdk:

        def usage(messages: list[Any]) -> tuple[int, int, int]:
            found = sdk.messages.create(model=MODEL, max_tokens=64, system=system, messages=messages).usage
            total = sdk.messages.count_tokens(model=MODEL, system=system, messages=messages).input_tokens
            assert (
                found.input_tokens + (found.cache_read_input_tokens or 0) + (found.cache_creation_input_tokens or 0)
                == total
            )
            return found.cache_read_input_tokens or 0, found.cache_creation_input_tokens or 0, found.input_tokens

        cold, warm, grown, again = usage(first), usage(first), usage(longer), usage(longer)
        other_model = sdk.messages.create(model="claude-other", max_tokens=64, system=system, messages=first).usage

    assert cold[:2] == (0, 1250) and warm[:2] == (1250, 0)  # written once, then read
    assert grown[0] == 1250 and grown[1] > 1500  # the system read, the new turns up to the breakpoint written
    assert again[:2] == (1250 + grown[1], 0)
    assert cold[2] == warm[2] > 0  # the user turn after the breakpoint is never cached
    assert other_model.cache_read_input_tokens == 0  # the cache is per model


def test_nothing_under_the_minimum_is_cached(serve: Serve) -> None:
    stand_in = ScriptedAnthropic(lambda body: MessageReply((Text("ok"),)))
    with serve(stand_in) as sdk:
        for _ in range(2):
            found = sdk.messages.create(
                model=MODEL, max_tokens=64, system=system_of(4000), messages=[{"role": "user", "content": "Hi"}]
            )
            assert (found.usage.cache_read_input_tokens, found.usage.cache_creation_input_tokens) == (0, 0)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda body: body.update(temperatur=0.5), "temperatur: Extra inputs are not permitted"),
        (
            lambda body: body["messages"][0].update(content=[{"type": "txt", "text": "Hi"}]),
            "messages.0.content.0: Input tag 'txt' found using 'type' does not match any of the expected tags:",
        ),
        (
            lambda body: body["messages"].append({"role": "user", "content": "Again"}),
            'messages: roles must alternate between "user" and "assistant", but found multiple "user" roles in a row',
        ),
        (
            lambda body: body["messages"].extend(
                [{"role": "assistant", "content": "Let me see."}, result("toolu_nowhere")]
            ),
            "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_nowhere. Each "
            "`tool_result` block must have a corresponding `tool_use` block in the previous message.",
        ),
        (
            lambda body: body["messages"].extend(
                [
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_x", "name": "w", "input": {}}]},
                    {"role": "user", "content": "Never mind."},
                ]
            ),
            "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_x. Each "
            "`tool_use` block must have a corresponding `tool_result` block in the next message.",
        ),
        (lambda body: body.pop("max_tokens"), "max_tokens: Field required"),
    ],
    ids=["unknown field", "unknown block", "roles", "orphan result", "unanswered call", "no max_tokens"],
)
def test_a_request_anthropic_would_refuse_is_refused_in_its_words(serve: Serve, change: Any, expected: str) -> None:
    stand_in = ScriptedAnthropic(lambda body: MessageReply((Text("ok"),)))
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}
    change(body)
    with serve(stand_in) as sdk, pytest.raises(anthropic.BadRequestError) as refused:
        sdk.post("/v1/messages", cast_to=object, body=copy.deepcopy(body))
    assert refusal(refused.value).startswith(expected)
    assert stand_in.history == [body]  # refused requests are recorded too


def test_credentials_and_the_version_header_are_required(loopback: Loopback) -> None:
    stand_in = ScriptedAnthropic(lambda body: MessageReply((Text("ok"),)), accept_bearer=False)
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    with loopback.mount(stand_in.app()) as url:
        version = {"anthropic-version": "2023-06-01"}
        bearer = httpx.post(
            f"{url}/v1/messages", json=body, headers={**version, "authorization": f"Bearer {DEFAULT_API_KEY}"}
        )
        wrong = httpx.post(f"{url}/v1/messages", json=body, headers={**version, "x-api-key": "sk-wrong"})
        unversioned = httpx.post(f"{url}/v1/messages", json=body, headers={"x-api-key": DEFAULT_API_KEY})
        right = httpx.post(f"{url}/v1/messages", json=body, headers={**version, "x-api-key": DEFAULT_API_KEY})
    assert (bearer.status_code, bearer.json()["error"]["message"]) == (401, "x-api-key header is required")
    assert (wrong.status_code, wrong.json()["error"]) == (
        401,
        {"type": "authentication_error", "message": "invalid x-api-key"},
    )
    assert (unversioned.status_code, unversioned.json()["error"]["message"]) == (
        400,
        "anthropic-version: header is required",
    )
    assert right.status_code == 200 and stand_in.requests[-1].header("x-api-key") == DEFAULT_API_KEY


def test_count_tokens_counts_what_a_message_would_bill(serve: Serve) -> None:
    stand_in = ScriptedAnthropic(lambda body: MessageReply((Text("ok"),)))
    with serve(stand_in) as sdk:
        counted = sdk.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Hello there"}])
        billed = sdk.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hello there"}])
    assert counted.input_tokens == billed.usage.input_tokens > 0
    assert [request.path for request in stand_in.requests] == ["/v1/messages/count_tokens", "/v1/messages"]
    assert len(stand_in.history) == 1  # history holds the Messages bodies only
