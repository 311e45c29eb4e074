"""Codex's kind of session through the proxy to its own provider, natively (the Responses API end to end).

The provider is the strict Responses stand-in (``proxy/provider/scripted_responses.py``): it seals the
``encrypted_content`` of its reasoning items and refuses one it did not issue, or one sent without the item it
preceded, and records ``store``. The client is the official ``openai`` SDK with reasoning on and
``store: false``, sending each answer's output items back as Codex does (streams read through the SDK's own
accumulator). Ten tool steps of ~12 KB outputs in a 16k window make the proxy compact and offer its
``read_tool_output``: every request must still be accepted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from proxy.app import create_app
from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.science_script import tool_output
from proxy.provider.scripted import serve_in_thread
from proxy.provider.scripted_responses import (
    DEFAULT_API_KEY,
    FunctionCall,
    Message,
    Reasoning,
    ResponseReply,
    ScriptedResponses,
    WebSearchCall,
)

STEPS = 10
TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}},
    },
    {"type": "web_search"},
]
_REF = re.compile(r"ref=([A-Za-z0-9_.:-]+)")


class Model:
    """The scripted model: reasons, runs ``shell`` step by step (a web search on step 2), reads one compacted
    output back through the proxy's ``read_tool_output`` once offered, then answers."""

    def __init__(self) -> None:
        self.read_back = False

    def __call__(self, body: dict[str, Any]) -> ResponseReply:
        names = {tool.get("name") for tool in body.get("tools") or []}
        text = json.dumps(body["input"])
        if "read_tool_output" in names and not self.read_back and (ref := _REF.search(text)):
            self.read_back = True
            call = FunctionCall("read_tool_output", {"ref": ref.group(1), "query": "step=1"})
            return ResponseReply((Reasoning(("Read a compacted output.",)), call))
        step = text.count('"function_call_output"')
        if step >= STEPS:
            return ResponseReply((Reasoning(("Finished.",)), Message("Done.")))
        items: tuple[Any, ...] = (Reasoning((f"Step {step + 1}.",)),)
        if step == 2:
            items += (WebSearchCall("calibration"),)
        return ResponseReply((*items, FunctionCall("shell", {"step": step + 1})))


@pytest.fixture
def provider() -> Iterator[tuple[ScriptedResponses, str]]:
    stand_in = ScriptedResponses(Model())
    with serve_in_thread(stand_in.app()) as url:
        yield stand_in, url


def proxy_for(url: str, tmp_path: Any) -> Any:
    route = ModelRoute(
        "codex",
        {"model": "openai/gpt-5-codex", "api_base": f"{url}/v1", "api_key": DEFAULT_API_KEY},
        max_input_tokens=16_000,
        max_output_tokens=4_000,
        configured_api="responses",  # an api_base that is not api.openai.com speaks chat unless told
    )
    return serve_in_thread(create_app(Settings(data_dir=tmp_path / "data", models=(route,))))


def run_codex(sdk: openai.OpenAI, *, stream: bool) -> list[Any]:
    """Codex's loop: the whole input each turn, the answer's output items appended as they came."""
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Calibrate the rig."}]
    answers = []
    for _ in range(STEPS + 3):
        kwargs: dict[str, Any] = {
            "model": "codex",
            "instructions": "You are Codex.",
            "input": items,
            "tools": TOOLS,
            "reasoning": {"effort": "high", "summary": "auto"},
            "include": ["reasoning.encrypted_content"],
            "store": False,
            "prompt_cache_key": "native-codex-1",
            "parallel_tool_calls": False,
            "extra_headers": {"session-id": "native-codex-1"},
        }
        if stream:
            with sdk.responses.stream(**kwargs) as events:
                answer = events.get_final_response()
        else:
            answer = sdk.responses.create(**kwargs)
        answers.append(answer)
        output = [item.model_dump(exclude_none=True) for item in answer.output]
        items += output
        calls = [item for item in answer.output if item.type == "function_call"]
        if not calls:
            return answers
        for call in calls:
            step = int(json.loads(call.arguments)["step"])
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": tool_output(step)})
    raise AssertionError("the agent did not finish")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_reasoning_tool_loop_that_compacts_is_accepted_at_every_call(provider, tmp_path, stream: bool) -> None:
    stand_in, url = provider
    with proxy_for(url, tmp_path) as proxy, openai.OpenAI(base_url=f"{proxy}/v1", api_key="x", max_retries=0) as sdk:
        answers = run_codex(sdk, stream=stream)

    assert answers[-1].output_text == "Done."
    received = [r for r in stand_in.requests if r.path == "/v1/responses"]
    assert len(received) == len(answers) + 1  # one proxy-owned round (read_tool_output) on the way
    for request in received:
        body = request.body
        assert body["store"] is False  # the provider stores nothing the user asked it not to
        assert body["reasoning"] == {"effort": "high", "summary": "auto"}
        assert body["include"] == ["reasoning.encrypted_content"] and body["prompt_cache_key"] == "native-codex-1"
        assert body["parallel_tool_calls"] is False and body["tools"][:2] == TOOLS
        assert "previous_response_id" not in body
    # Reasoning items reached the provider again with their encrypted content, each before its call.
    later = received[-1].body["input"]
    reasoning = [item for item in later if item.get("type") == "reasoning"]
    assert len(reasoning) >= STEPS and all(item["encrypted_content"] for item in reasoning)
    assert any("ref=" in json.dumps(r.body["input"]) for r in received)  # the proxy compacted
    # Every reasoning item the client got carries what the provider issued (the provider verified it back).
    for answer in answers:
        assert answer.output[0].type == "reasoning"
        assert all(i.encrypted_content for i in answer.output if i.type == "reasoning")
    assert [i.type for i in answers[2].output][:2] == ["reasoning", "web_search_call"]


def test_an_answer_mixing_a_proxy_call_and_a_client_call_keeps_its_reasoning_with_its_call(provider, tmp_path) -> None:
    """A reasoning item followed by a ``read_tool_output`` call and a ``shell`` call: the proxy keeps the answer
    whole (the reasoning item stays with the call it preceded, as the provider requires), runs its own call
    and answers ``shell`` as not run; the model, asked again, calls ``shell`` alone, which reaches the client."""
    stand_in, url = provider
    model = Model()
    again: list[bool] = []

    def mixing(body: dict[str, Any]) -> ResponseReply:
        text = json.dumps(body["input"])
        names = {tool.get("name") for tool in body.get("tools") or []}
        if "read_tool_output" in names and not model.read_back and (ref := _REF.search(text)):
            model.read_back = True
            read = FunctionCall("read_tool_output", {"ref": ref.group(1), "query": "step=1"})
            return ResponseReply((Reasoning(("Read back, then run.",)), read, FunctionCall("shell", {"step": 99})))
        if model.read_back and not again:
            again.append(True)
            assert "Not run" in text
            return ResponseReply((Reasoning(("Run it again.",)), FunctionCall("shell", {"step": 99})))
        return model(body)

    stand_in.script = mixing
    with proxy_for(url, tmp_path) as proxy, openai.OpenAI(base_url=f"{proxy}/v1", api_key="x", max_retries=0) as sdk:
        answers = run_codex(sdk, stream=False)
    mixed = next(r.body for r in stand_in.requests if "Not run" in json.dumps(r.body["input"]))
    kinds = [(i.get("type"), i.get("name")) for i in mixed["input"]]
    at = kinds.index(("function_call", "read_tool_output"))
    assert kinds[at - 1][0] == "reasoning" and kinds[at + 1] == ("function_call", "shell")
    calls = [i for a in answers for i in a.output if i.type == "function_call"]
    assert all(call.name == "shell" for call in calls) and any('"step": 99' in call.arguments for call in calls)


def test_a_provider_overflow_is_retried_once_after_a_forced_compaction(provider, tmp_path) -> None:
    stand_in, url = provider
    model = stand_in.script
    refused: list[int] = []

    def overflowing_once(body: dict[str, Any]) -> ResponseReply:
        if json.dumps(body["input"]).count('"function_call_output"') == 4 and not refused:
            refused.append(len(json.dumps(body)))
            message = "Your input exceeds the context window of this model. Please adjust your input and try again."
            error = {"error": {"message": message, "type": "invalid_request_error", "code": "context_length_exceeded"}}
            return ResponseReply(error_status=400, error_body=error)
        return model(body)

    stand_in.script = overflowing_once
    with proxy_for(url, tmp_path) as proxy, openai.OpenAI(base_url=f"{proxy}/v1", api_key="x", max_retries=0) as sdk:
        answers = run_codex(sdk, stream=True)
    assert answers[-1].output_text == "Done." and refused
    sent = [r.body for r in stand_in.requests if r.path == "/v1/responses"]
    index = next(i for i, body in enumerate(sent) if len(json.dumps(body)) == refused[0])
    retry = sent[index + 1]
    assert len(json.dumps(retry)) < refused[0]  # the one retry, smaller, and accepted
    assert retry["store"] is False and retry["reasoning"] == {"effort": "high", "summary": "auto"}  # still native
