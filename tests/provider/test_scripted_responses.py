"""The strict OpenAI Responses stand-in, over real HTTP on loopback, with the official SDK as the client."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import httpx
import openai
import pytest

from proxy.provider.scripted_responses import (
    DEFAULT_API_KEY,
    CustomToolCall,
    FunctionCall,
    Message,
    Reasoning,
    ResponseReply,
    ScriptedResponses,
    WebSearchCall,
)
from tests.provider.conftest import Loopback

Serve = Callable[..., AbstractContextManager[openai.OpenAI]]
MODEL = "gpt-scripted"
TOOLS = [{"type": "function", "name": "weather", "parameters": {"type": "object"}}, {"type": "web_search"}]
REASONED = {"include": ["reasoning.encrypted_content"], "reasoning": {"effort": "low", "summary": "auto"}}
CITATION = {"type": "url_citation", "start_index": 0, "end_index": 5, "url": "https://weather.example", "title": "W"}


@pytest.fixture
def serve(loopback: Loopback) -> Serve:
    """Serves a stand-in on loopback and yields an SDK client pointed at it."""

    @contextmanager
    def serving(stand_in: ScriptedResponses) -> Iterator[openai.OpenAI]:
        with (
            loopback.mount(stand_in.app()) as url,
            openai.OpenAI(base_url=f"{url}/v1", api_key=DEFAULT_API_KEY, max_retries=0) as sdk,
        ):
            yield sdk

    return serving


def reason_then_call(body: dict[str, Any]) -> ResponseReply:
    """Reason, then call the weather tool; a request whose input ends with a tool output gets an answer."""
    given = body.get("input")
    if isinstance(given, list) and given and given[-1].get("type") == "function_call_output":
        return ResponseReply((Reasoning(("Summing up.",)), Message("Sunny in Paris.", (CITATION,))))
    return ResponseReply((Reasoning(("Looking up **the weather**.",)), FunctionCall("weather", {"city": "Paris"})))


def plain(item: Any) -> dict[str, Any]:
    """An SDK output item as the JSON a client sends back."""
    found: dict[str, Any] = item.model_dump(exclude_none=True)
    return found


def error_of(raised: pytest.ExceptionInfo[openai.APIStatusError]) -> dict[str, Any]:
    """The OpenAI-shaped error the stand-in answered (the SDK hands over its ``error`` object)."""
    body = raised.value.body
    assert isinstance(body, dict) and body["type"] == "invalid_request_error"
    return body


def test_an_answer_carries_its_items_and_the_request_is_recorded_with_its_headers(serve: Serve) -> None:
    def script(body: dict[str, Any]) -> ResponseReply:
        return ResponseReply(
            (
                Reasoning(("Plan: search.",)),
                WebSearchCall("paris weather"),
                Message("Sunny.", (CITATION,)),
                CustomToolCall("patch", "*** Begin Patch"),
            )
        )

    stand_in = ScriptedResponses(script)
    with serve(stand_in) as sdk:
        answer = sdk.responses.create(
            model=MODEL,
            instructions="Be brief.",
            input="Weather?",
            tools=TOOLS,
            store=False,
            prompt_cache_key="user-1",
            safety_identifier="hash-1",
            **REASONED,
        )

    assert [item.type for item in answer.output] == ["reasoning", "web_search_call", "message", "custom_tool_call"]
    reasoning = answer.output[0]
    assert (
        reasoning.type == "reasoning" and reasoning.encrypted_content and reasoning.summary[0].text == "Plan: search."
    )
    assert answer.output_text == "Sunny." and answer.status == "completed" and answer.store is False
    assert answer.usage is not None and answer.usage.output_tokens_details.reasoning_tokens > 0
    [received] = stand_in.requests
    assert stand_in.history == [received.body] and received.body["store"] is False
    assert (
        received.body["prompt_cache_key"] == "user-1"
        and received.header("authorization") == f"Bearer {DEFAULT_API_KEY}"
    )


def test_summaries_and_encrypted_content_are_sent_only_when_asked_for(serve: Serve) -> None:
    stand_in = ScriptedResponses(lambda body: ResponseReply((Reasoning(("Hidden plan.",)), Message("Hi."))))
    with serve(stand_in) as sdk:
        answer = sdk.responses.create(model=MODEL, input="Hi")
    reasoning = answer.output[0]
    assert reasoning.type == "reasoning" and reasoning.summary == [] and reasoning.encrypted_content is None


def test_a_stream_is_the_real_event_sequence_and_the_sdk_rebuilds_the_same_response(serve: Serve) -> None:
    def script(body: dict[str, Any]) -> ResponseReply:
        return ResponseReply(
            (
                Reasoning(("First I plan.", "Then I search."), id="rs_s"),
                WebSearchCall("paris weather", id="ws_s"),
                Message("Sunny all week in Paris, says the forecast.", (CITATION,), id="msg_s"),
                FunctionCall("weather", {"city": "Paris", "days": 3}, call_id="call_s", id="fc_s"),
            )
        )

    stand_in = ScriptedResponses(script)
    arguments: dict[str, Any] = {"model": MODEL, "input": "Weather?", "tools": TOOLS, **REASONED}
    with serve(stand_in) as sdk:
        answer = sdk.responses.create(**arguments)
        with sdk.responses.stream(**arguments) as stream:
            events = list(stream)
            streamed = stream.get_final_response()

    assert [plain(item) for item in streamed.output] == [plain(item) for item in answer.output]
    assert streamed.usage == answer.usage and streamed.status == "completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed"
    for expected in (
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.web_search_call.searching",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ):
        assert expected in kinds
    assert kinds.count("response.reasoning_summary_part.added") == 2


def test_an_incomplete_answer_says_why_and_its_stream_ends_incomplete(serve: Serve) -> None:
    stand_in = ScriptedResponses(lambda body: ResponseReply((Message("Sunny in"),), status="incomplete"))
    with serve(stand_in) as sdk:
        answer = sdk.responses.create(model=MODEL, input="Weather?", max_output_tokens=16)
        events = list(sdk.responses.create(model=MODEL, input="Weather?", max_output_tokens=16, stream=True))
    assert answer.status == "incomplete" and answer.incomplete_details is not None
    assert answer.incomplete_details.reason == "max_output_tokens"
    assert events[-1].type == "response.incomplete"


def test_a_stateless_tool_loop_that_sends_back_the_encrypted_reasoning_is_answered(serve: Serve) -> None:
    stand_in = ScriptedResponses(reason_then_call)
    with serve(stand_in) as sdk:
        first = sdk.responses.create(model=MODEL, input="Weather?", store=False, tools=TOOLS, **REASONED)
        call = first.output[1]
        assert call.type == "function_call"
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        items = [{"role": "user", "content": "Weather?"}, *map(plain, first.output), output]
        second = sdk.responses.create(model=MODEL, input=items, store=False, tools=TOOLS, **REASONED)
    assert second.output_text == "Sunny in Paris." and not stand_in.stored


@pytest.mark.parametrize("spoil", ["summary edited", "token edited", "never issued", "moved to another item"])
def test_reasoning_whose_encrypted_content_the_stand_in_did_not_issue_is_refused(serve: Serve, spoil: str) -> None:
    stand_in = ScriptedResponses(reason_then_call)
    with serve(stand_in) as sdk:
        first = sdk.responses.create(model=MODEL, input="Weather?", store=False, tools=TOOLS, **REASONED)
        reasoning, call = map(plain, first.output)
        if spoil == "summary edited":
            reasoning["summary"][0]["text"] = "Looking up the weather."
        elif spoil == "token edited":
            reasoning["encrypted_content"] = reasoning["encrypted_content"][:-6] + "AAAAA="
        elif spoil == "never issued":
            reasoning["encrypted_content"] = "gAAAAABpZ3JlYXQgcmVhc29uaW5nIGl0IHdhcw=="
        else:
            reasoning["id"] = "rs_elsewhere"
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.responses.create(model=MODEL, input=[reasoning, call, output], store=False, **REASONED)
    assert error_of(refused) == {
        "message": f"The encrypted content for item {reasoning['id']} could not be verified. "
        "Reason: Encrypted content could not be decrypted or parsed.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_encrypted_content",
    }


def test_reasoning_without_the_item_that_followed_it_is_refused(serve: Serve) -> None:
    stand_in = ScriptedResponses(reason_then_call)
    with serve(stand_in) as sdk:
        first = sdk.responses.create(model=MODEL, input="Weather?", store=False, tools=TOOLS, **REASONED)
        reasoning, _ = map(plain, first.output)
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.responses.create(model=MODEL, input=[{"role": "user", "content": "Weather?"}, reasoning], store=False)
    expected = f"Item '{reasoning['id']}' of type 'reasoning' was provided without its required following item."
    assert error_of(refused) == {"message": expected, "type": "invalid_request_error", "param": "input", "code": None}


def test_store_false_is_recorded_and_its_response_cannot_be_continued(serve: Serve) -> None:
    stand_in = ScriptedResponses(reason_then_call)
    with serve(stand_in) as sdk:
        kept = sdk.responses.create(model=MODEL, input="Weather?", tools=TOOLS)
        dropped = sdk.responses.create(model=MODEL, input="Weather?", tools=TOOLS, store=False)
        call = kept.output[1]
        assert call.type == "function_call"
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        continued = sdk.responses.create(model=MODEL, previous_response_id=kept.id, input=[output])
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.responses.create(model=MODEL, previous_response_id=dropped.id, input=[output])
        # A reasoning item given by id only resolves when its response was stored.
        by_id = [{"type": "reasoning", "id": dropped.output[0].id, "summary": []}, plain(dropped.output[1])]
        with pytest.raises(openai.NotFoundError) as missing:
            sdk.responses.create(model=MODEL, input=by_id, store=False)
        by_id = [{"type": "reasoning", "id": kept.output[0].id, "summary": []}, plain(call)]
        sdk.responses.create(model=MODEL, input=by_id, store=False)

    assert continued.output_text == "Sunny in Paris."
    assert stand_in.conversation(stand_in.history[2])[-3:] == [plain(item) for item in kept.output] + [output]
    assert [body.get("store") for body in stand_in.history[:3]] == [None, False, None]
    assert set(stand_in.stored) == {kept.id, continued.id}
    assert error_of(refused) == {
        "message": f"Previous response with id '{dropped.id}' not found.",
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": "previous_response_not_found",
    }
    assert error_of(missing)["message"].startswith(f"Item with id '{dropped.output[0].id}' not found.")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"input": [{"type": "function_call_output", "call_id": "call_nowhere", "output": "x"}]},
            ("No tool call found for function call output with call_id call_nowhere.", "input", None),
        ),
        ({"input": "Hi", "temprature": 0.2}, ("Unknown parameter: 'temprature'.", "temprature", "unknown_parameter")),
    ],
    ids=["orphan output", "unknown parameter"],
)
def test_a_request_openai_would_refuse_is_refused_in_its_words(
    serve: Serve, body: dict[str, Any], expected: tuple[str, str, str | None]
) -> None:
    stand_in = ScriptedResponses(lambda body: ResponseReply((Message("ok"),)))
    with serve(stand_in) as sdk, pytest.raises(openai.BadRequestError) as refused:
        sdk.post("/responses", cast_to=object, body={"model": MODEL, **body})
    error = error_of(refused)
    assert (error["message"], error["param"], error["code"]) == expected


def test_the_automatic_prompt_cache_reports_cached_tokens_like_openai(serve: Serve) -> None:
    stand_in = ScriptedResponses(lambda body: ResponseReply((Message("ok"),)))
    prompt = "p" * (
        5200 - 29
    )  # its input line, {"content":…,"role":"user"} and a newline, is 5,200 bytes: 1,300 tokens
    with serve(stand_in) as sdk:

        def usage(text: str, key: str = "user-1", model: str = MODEL) -> tuple[int, int]:
            found = sdk.responses.create(model=model, input=text, prompt_cache_key=key).usage
            assert found is not None
            return found.input_tokens, found.input_tokens_details.cached_tokens

        cold, warm = usage(prompt), usage(prompt)
        other_key, other_model = usage(prompt, key="user-2"), usage(prompt, model="gpt-other")
        short = usage("s" * 3000), usage("s" * 3000)

    assert cold == (1300, 0) and warm == (1300, 1280)  # 1,024 + 2 x 128: the longest whole step of 1,300
    assert other_key == (1300, 0) and other_model == (1300, 0)  # keyed by prompt_cache_key and model
    assert short[1][1] == 0  # under 1,024 tokens nothing is cached


def test_an_api_key_is_required(loopback: Loopback) -> None:
    stand_in = ScriptedResponses(lambda body: ResponseReply((Message("ok"),)))
    body = {"model": MODEL, "input": "Hi"}
    with loopback.mount(stand_in.app()) as url:
        missing = httpx.post(f"{url}/v1/responses", json=body)
        wrong = httpx.post(f"{url}/v1/responses", json=body, headers={"authorization": "Bearer sk-wrong-key-123"})
    assert missing.status_code == 401 and missing.json()["error"]["message"].startswith(
        "You didn't provide an API key."
    )
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert wrong.json()["error"]["message"].startswith("Incorrect API key provided: sk-*********-123.")
