"""The requests Codex CLI 0.171 really sent (tests/data/agents/codex-0.171.0), replayed through the proxy to a
native ``api: responses`` route in front of the strict Responses stand-in.

The first request of a capture is sent as Codex sent it. The next ones carry the capture server's answer
(a function call it made up, no reasoning), so the session goes on as Codex would go on with the stand-in:
the captured request with the stand-in's output items (its reasoning, sealed, then its call) in place of
the captured call, and the output naming the stand-in's call. Every request must be accepted, and the
stand-in must receive the native fields the capture carries: reasoning, include, store: false,
prompt_cache_key, text, tool_choice, parallel_tool_calls, client_metadata, and every tool as Codex defined
it (its custom apply_patch, its client-side tool_search, the hosted web_search).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.kernel.config import ModelRoute
from proxy.provider.science_script import SUMMARY_MARKER, checkpoint_for
from proxy.provider.scripted import serve_in_thread
from proxy.provider.scripted_responses import (
    DEFAULT_API_KEY,
    FunctionCall,
    Message,
    Reasoning,
    ResponseReply,
    ScriptedResponses,
)

CODEX = Path(__file__).parents[1] / "data" / "agents" / "codex-0.171.0"
DROPPED_HEADERS = {"host", "content-length", "authorization", "accept-encoding"}
FINAL = "The command printed: hello"
NATIVE_FIELDS = (
    "reasoning",
    "include",
    "store",
    "prompt_cache_key",
    "text",
    "tool_choice",
    "parallel_tool_calls",
    "client_metadata",
    "stream",
)


def capture(name: str) -> dict[str, Any]:
    return json.loads((CODEX / name).read_text())


def _texts(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content or [] if isinstance(part, dict))


def summary_request(body: dict[str, Any]) -> bool:
    """The proxy's checkpoint call (over litellm, bridged to /v1/responses): its system message first."""
    first = (body.get("input") or [{}])[0]
    return first.get("role") == "system" and _texts(first).startswith(SUMMARY_MARKER)


def codex_model(body: dict[str, Any]) -> ResponseReply:
    """Reasons, calls exec_command once; with its output (or a checkpoint of it) back, reasons and answers."""
    if summary_request(body):
        return ResponseReply((Message(checkpoint_for(_texts(body["input"][-1]))),))
    done = any(item.get("type") in ("function_call_output", "compaction") for item in body["input"])
    if done or "## Next step" in json.dumps(body["input"]):
        return ResponseReply((Reasoning(("It printed hello.",)), Message(FINAL)))
    return ResponseReply((Reasoning(("Run it in the shell.",)), FunctionCall("exec_command", {"cmd": "echo hello"})))


@pytest.fixture
def stand_in() -> Iterator[tuple[ScriptedResponses, str]]:
    responses = ScriptedResponses(codex_model)
    with serve_in_thread(responses.app()) as url:
        yield responses, url


def _proxy(start_proxy: Any, url: str) -> Any:
    route = ModelRoute(
        "gpt-5.5",
        {"model": "openai/gpt-5.5", "api_base": f"{url}/v1", "api_key": DEFAULT_API_KEY},
        max_input_tokens=200_000,
        max_output_tokens=8_000,
        configured_api="responses",
    )
    return start_proxy(models=(route,), trace_enabled=True)


def replay(proxy: Any, recorded: dict[str, Any], body: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """POST a captured request as Codex sent it; the events of its answer (which must be a 200 stream)."""
    headers = {k: v for k, v in recorded["headers"].items() if k.lower() not in DROPPED_HEADERS}
    answer = httpx.post(f"{proxy.url}{recorded['path']}", json=body or recorded["body"], headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    events = []
    for block in answer.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines:
            events.append(json.loads(lines["data"]))
    assert events[-1]["type"] == "response.completed", events[-1]
    return events


def output_items(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items Codex keeps from an answer: each ``response.output_item.done``, as it came."""
    return [event["item"] for event in events if event["type"] == "response.output_item.done"]


def continued(recorded: dict[str, Any], answer: list[dict[str, Any]]) -> dict[str, Any]:
    """The captured request with the stand-in's answer in place of the capture server's call, and the call's
    output naming the stand-in's call: what Codex would have sent after that answer."""
    body = json.loads(json.dumps(recorded["body"]))
    items = body["input"]
    index = next(i for i, item in enumerate(items) if item.get("type") == "function_call")
    call = next(item for item in answer if item["type"] == "function_call")
    for item in items:
        if item.get("type") == "function_call_output" and item["call_id"] == items[index]["call_id"]:
            item["call_id"] = call["call_id"]
    items[index : index + 1] = answer
    return body


def _native(received: Any, captured: dict[str, Any]) -> None:
    """What the stand-in received carries every native field of the captured request, as Codex sent it."""
    body = received.body
    assert received.header("authorization") == f"Bearer {DEFAULT_API_KEY}"
    for field in NATIVE_FIELDS:
        assert body.get(field) == captured.get(field), field
    assert body["store"] is False and "previous_response_id" not in body
    assert body["model"] == "gpt-5.5"
    assert body["tools"][: len(captured["tools"])] == captured["tools"]  # hosted and custom tools as they came
    assert {t.get("name") for t in body["tools"][len(captured["tools"]) :]} <= {"read_tool_output"}  # the proxy's
    task = next(_texts(i) for i in captured["input"] if _texts(i).startswith("Run the shell command"))
    assert task in json.dumps(body["input"])


def test_a_codex_session_passes_natively_with_every_field_it_sent(stand_in, start_proxy):
    responses, url = stand_in
    proxy = _proxy(start_proxy, url)
    first, second = capture("01-responses.json"), capture("02-responses.json")
    answer = output_items(replay(proxy, first))
    assert [item["type"] for item in answer] == ["reasoning", "function_call"]
    assert answer[0]["encrypted_content"].startswith("gAAAAA") and answer[1]["name"] == "exec_command"
    final = output_items(replay(proxy, second, continued(second, answer)))
    assert [item["type"] for item in final] == ["reasoning", "message"]
    assert final[1]["content"][0]["text"] == FINAL

    assert len(responses.requests) == 2  # both accepted (a refusal fails the replay above), nothing else sent
    for received, captured in zip(responses.requests, (first["body"], second["body"]), strict=True):
        _native(received, captured)
    # The stand-in's reasoning went back sealed as it was issued, right before the call it preceded.
    sent = responses.requests[1].body["input"]
    index = next(i for i, item in enumerate(sent) if item.get("type") == "reasoning")
    assert sent[index : index + 2] == answer
    trace = json.loads(next((proxy.settings.data_dir / "context-traces").glob("*/turn-0001.json")).read_text())
    assert trace["ingress"]["passage"] == "native"


def test_a_codex_remote_compaction_passes_natively_and_the_summarizer_stores_nothing(stand_in, start_proxy):
    responses, url = stand_in
    proxy = _proxy(start_proxy, url)
    folder = "compact-remote/"
    first, trigger, after = (capture(f"{folder}0{n}-responses.json") for n in (1, 2, 3))
    answer = output_items(replay(proxy, first))
    (item,) = output_items(replay(proxy, trigger, continued(trigger, answer)))
    assert item["type"] == "compaction"
    # Codex sends the item back in place of the history it dropped.
    body = json.loads(
        json.dumps(after["body"]).replace('"capture-checkpoint-1"', json.dumps(item["encrypted_content"]))
    )
    final = output_items(replay(proxy, after, body))
    assert [i["type"] for i in final] == ["reasoning", "message"] and final[1]["content"][0]["text"] == FINAL

    first_sent, summary, last_sent = responses.requests
    _native(first_sent, first["body"])
    _native(last_sent, after["body"])
    # The proxy's checkpoint call reached the same provider over litellm's bridge: store false, no tools.
    assert summary_request(summary.body) and summary.body["store"] is False
    assert set(summary.body) == {"model", "input", "store"} and summary.body["model"] == "gpt-5.5"
    assert "echo hello" in json.dumps(summary.body["input"])
    # The turn after carries the proxy's checkpoint, not the dropped call.
    assert "## Next step" in json.dumps(last_sent.body["input"])
    assert not any(i.get("type") in ("function_call", "reasoning") for i in last_sent.body["input"])
