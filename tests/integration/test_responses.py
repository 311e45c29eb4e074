"""The Responses API ingress through real HTTP with the official OpenAI SDK as client.

The proxy translates each request to the canonical chat body, serves it with the same turn runner as
``/v1/chat/completions`` (assembly, store, traces) and translates the answer back; the assertions are on
what the SDK assembles and on what the scripted provider received.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
import tiktoken

from proxy.ingress.chat.wire import check_tool_pairing
from proxy.provider.science_script import TOOLS as SCIENCE_TOOLS
from proxy.provider.science_script import ScienceModel, client_tool_result, is_summary_request
from proxy.provider.scripted import Reply, ToolCall
from tests.integration.conftest import MODEL, route_to

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Apply a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
}


def _last_user_text(body: dict[str, Any]) -> str:
    users = [m for m in body["messages"] if m["role"] == "user"]
    content = users[-1]["content"]
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


def test_create_translates_instructions_input_and_answers_a_response(start_proxy, provider):
    provider.script(lambda body: Reply(content=f"echo: {_last_user_text(body)}"))
    proxy = start_proxy(mode="legacy")
    response = proxy.client().responses.create(
        model=MODEL, instructions="Be brief.", input="hello there", max_output_tokens=50, temperature=0.2
    )
    assert response.status == "completed"
    assert response.output_text == "echo: hello there"
    assert response.output[0].type == "message"
    assert response.usage is not None and response.usage.input_tokens > 0
    sent = provider.history[-1]
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    assert sent["max_tokens"] == 50 and sent["temperature"] == 0.2


def test_function_and_custom_tools_round_trip_with_their_item_types(start_proxy, provider):
    def script(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["role"] == "tool":
            return Reply(content="done")
        return Reply(
            tool_calls=(
                ToolCall("get_weather", {"city": "Oslo"}, id="call_w"),
                ToolCall("apply_patch", {"input": "*** Begin Patch\n*** End Patch"}, id="call_p"),
            )
        )

    provider.script(script)
    proxy = start_proxy()
    client = proxy.client()
    tools = [WEATHER, PATCH, {"type": "web_search"}]
    first = client.responses.create(model=MODEL, input="go", tools=tools, extra_headers={"x-session-id": "tools-1"})
    kinds = [(item.type, getattr(item, "name", None)) for item in first.output]
    assert kinds == [("function_call", "get_weather"), ("custom_tool_call", "apply_patch")]
    assert json.loads(first.output[0].arguments) == {"city": "Oslo"}
    assert first.output[1].input == "*** Begin Patch\n*** End Patch"
    offered = provider.history[-1]["tools"]
    assert {t["function"]["name"] for t in offered} >= {"get_weather", "apply_patch"}
    assert all(t["type"] == "function" for t in offered)  # web_search left out, not refused
    patch_fn = next(t["function"] for t in offered if t["function"]["name"] == "apply_patch")
    assert patch_fn["parameters"]["required"] == ["input"] and "start: /.+/" in patch_fn["description"]

    history: list[Any] = ["go", *[item.model_dump(exclude_none=True) for item in first.output]]
    history = [{"role": "user", "content": "go"}, *history[1:]]
    history += [
        {"type": "function_call_output", "call_id": "call_w", "output": "sunny"},
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "applied"},
    ]
    second = client.responses.create(model=MODEL, input=history, tools=tools, extra_headers={"x-session-id": "tools-1"})
    assert second.output_text == "done"
    sent = provider.history[-1]["messages"]
    assistant = next(m for m in sent if m["role"] == "assistant")
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["get_weather", "apply_patch"]
    assert json.loads(assistant["tool_calls"][1]["function"]["arguments"]) == {
        "input": "*** Begin Patch\n*** End Patch"
    }
    assert [m["content"] for m in sent if m["role"] == "tool"] == ["sunny", "applied"]


def test_stream_assembles_in_the_sdk_with_the_documented_event_order(start_proxy, provider):
    provider.script(lambda body: Reply(content="streamed answer"))
    proxy = start_proxy()
    with proxy.client().responses.stream(model=MODEL, input="hi", extra_headers={"x-session-id": "s-1"}) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == "streamed answer"
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    for expected in (
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ):
        assert expected in types
    assert final.usage is not None and final.usage.total_tokens > 0


def test_streamed_tool_call_carries_arguments_events(start_proxy, provider):
    provider.script(lambda body: Reply(tool_calls=(ToolCall("get_weather", {"city": "Rome"}, id="call_r"),)))
    proxy = start_proxy()
    with proxy.client().responses.stream(model=MODEL, input="weather?", tools=[WEATHER]) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    call = final.output[0]
    assert call.type == "function_call" and call.call_id == "call_r" and json.loads(call.arguments) == {"city": "Rome"}
    assert "response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types


def test_previous_response_id_continues_the_stored_chain_and_retrieve_returns_it(start_proxy, provider):
    provider.script(lambda body: Reply(content=f"turn {sum(m['role'] == 'user' for m in body['messages'])}"))
    proxy = start_proxy(mode="legacy")  # the provider then receives exactly the chain the proxy rebuilt
    client = proxy.client()
    first = client.responses.create(model=MODEL, instructions="Count turns.", input="one")
    second = client.responses.create(model=MODEL, input="two", previous_response_id=first.id)
    assert second.output_text == "turn 2"
    # as at OpenAI, the previous response's instructions are not inherited
    assert provider.history[-1]["messages"] == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "turn 1"},
        {"role": "user", "content": "two"},
    ]
    client.responses.create(model=MODEL, instructions="New rules.", input="three", previous_response_id=second.id)
    sent = provider.history[-1]["messages"]
    assert sent[0] == {"role": "system", "content": "New rules."}
    assert [m["content"] for m in sent if m["role"] == "user"] == ["one", "two", "three"]
    again = client.responses.retrieve(first.id)
    assert again.id == first.id and again.output_text == "turn 1"


def test_store_false_is_not_retrievable_nor_continuable(start_proxy, provider):
    proxy = start_proxy()
    client = proxy.client()
    hidden = client.responses.create(model=MODEL, input="secret", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(hidden.id)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=MODEL, input="more", previous_response_id=hidden.id)
    assert caught.value.body["code"] == "previous_response_not_found"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "input": [{"type": "message", "role": "wizard", "content": "x"}]}, "input.0.role"),
        ({"model": MODEL, "input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, None),
        ({"model": MODEL, "input": 5}, "input"),
        ({"model": MODEL, "input": [{"type": "teleport"}]}, "input.0.type"),
        ({"model": MODEL, "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ],
)
def test_bad_input_is_a_400_in_openai_shape_before_any_provider_call(start_proxy, provider, body, param):
    proxy = start_proxy()
    answer = httpx.post(f"{proxy.url}/v1/responses", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param
    assert provider.history == []


def test_unknown_model_is_404(start_proxy):
    proxy = start_proxy()
    with pytest.raises(openai.NotFoundError) as caught:
        proxy.client().responses.create(model="no-such-model", input="hi")
    assert caught.value.body["code"] == "model_not_found"


def test_provider_failure_before_the_stream_is_an_http_error_in_openai_shape(start_proxy, provider):
    provider.script(lambda body: Reply(error_status=429, error_body={"error": {"message": "slow down"}}))
    proxy = start_proxy()
    answer = httpx.post(f"{proxy.url}/v1/responses", json={"model": MODEL, "input": "x", "stream": True})
    assert answer.status_code == 429
    assert answer.json()["error"]["type"] == "rate_limit_error"


def test_failure_mid_stream_becomes_response_failed():
    from proxy.ingress.responses.request import ResponsesRequest, ToolMap
    from proxy.ingress.responses.stream import ResponseStream
    from proxy.kernel.errors import ProviderError

    async def chunks():
        yield {"choices": [{"index": 0, "delta": {"content": "partial"}}]}
        raise ProviderError("the provider went away", code="upstream_closed")

    async def collect():
        stream = ResponseStream("resp_x", ResponsesRequest(model=MODEL), ToolMap())
        return [event async for event in stream.events(chunks())]

    import asyncio

    events = asyncio.run(collect())
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"] == {"code": "upstream_closed", "message": "the provider went away"}
    assert "response.output_text.delta" in [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


ENCODING = tiktoken.get_encoding("o200k_base")
WINDOW = 16_000


def test_forty_step_tool_loop_in_a_16k_window_keeps_every_request_within_the_limit(start_proxy, provider):
    steps = 40
    model = ScienceModel(steps)
    provider.script(model, context_window=WINDOW)
    provider.provider.token_scale = 1.0  # counts as tiktoken does, as this test measures
    route = route_to(provider.url, "science-model", window=WINDOW)
    proxy = start_proxy(mode="dynamic", models=(route,))
    client = proxy.client()
    task = f"Run the {steps}-step calibration protocol, then report the calibration fact."
    tools = [{"type": "function", **{k: v for k, v in t["function"].items()}} for t in SCIENCE_TOOLS]
    items: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for _ in range(steps + 5):
        response = client.responses.create(
            model="science-model",
            instructions="You are an autonomous lab agent. Run the protocol step by step.",
            input=items,
            tools=tools,
            store=False,
            extra_headers={"session-id": "forty-steps"},
        )
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            break
        for call in calls:
            assert call.name == "run_step", "a proxy-owned tool reached the client"
            items.append(call.model_dump(exclude_none=True))
            result = client_tool_result({"id": call.call_id, "function": {"arguments": call.arguments}})
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": result["content"]})
    else:
        raise AssertionError("the agent did not finish")
    agent_requests = [body for body in provider.history if not is_summary_request(body)]
    assert len(agent_requests) >= steps
    assert sum(1 for item in items if item["type" if "type" in item else "role"] == "function_call") == steps
    for body in agent_requests:
        assert len(ENCODING.encode(json.dumps(body["messages"], ensure_ascii=False))) <= WINDOW - 2_000
        assert any(m["role"] == "user" and m["content"] == task for m in body["messages"]), "the task was dropped"
        check_tool_pairing(body["messages"])
    assert len(json.dumps(items)) > 400_000  # the client's own history is far beyond the window
