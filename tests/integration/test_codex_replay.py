"""Replays of what Codex CLI 0.171 really sent (tests/data/agents/codex-0.171.0) through the proxy.

Each captured request goes to the real proxy in front of the scripted provider; the assertions are on
what Codex would receive (the event sequence, the item types it takes its history from) and on what
the provider was shown. See tests/data/agents/NOTES.md for what Codex needs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from proxy.context.checkpoint import CHECKPOINT_OPEN
from proxy.provider.science_script import checkpoint_for, is_summary_request
from proxy.provider.scripted import Reply, ToolCall
from tests.integration.conftest import route_to

CODEX = Path(__file__).parents[1] / "data" / "agents" / "codex-0.171.0"
_DROP_HEADERS = {"host", "content-length", "authorization", "accept-encoding"}


def _capture(name: str) -> dict[str, Any]:
    return json.loads((CODEX / name).read_text())


def _proxy(start_proxy: Any, provider: Any) -> Any:
    route = route_to(provider.url, "gpt-5.5", window=200_000, max_output=8_000)
    return start_proxy(models=(route,), trace_enabled=True)


def _replay(proxy: Any, capture: dict[str, Any], body: dict[str, Any] | None = None) -> tuple[httpx.Response, list]:
    """POST a captured request as Codex sent it; returns the answer and its SSE events."""
    headers = {k: v for k, v in capture["headers"].items() if k.lower() not in _DROP_HEADERS}
    answer = httpx.post(f"{proxy.url}{capture['path']}", json=body or capture["body"], headers=headers, timeout=60)
    events = []
    for block in answer.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines:
            data = json.loads(lines["data"])
            assert lines["event"] == data["type"]
            events.append(data)
    return answer, events


def _done_items(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["item"] for e in events if e["type"] == "response.output_item.done"]


def test_codex_tool_call_turn_gets_a_function_call_and_completed_with_usage(start_proxy, provider):
    provider.script(lambda body: Reply(tool_calls=(ToolCall("exec_command", {"cmd": "echo hello"}, id="call_1"),)))
    proxy = _proxy(start_proxy, provider)
    capture = _capture("01-responses.json")
    answer, events = _replay(proxy, capture)

    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    assert answer.headers["x-context-id"] == capture["headers"]["session-id"]
    types = [e["type"] for e in events]
    deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) > 1  # relayed as the provider's fragments arrive, not once at the end
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * len(deltas),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    (item,) = _done_items(events)
    assert events[2]["item"]["id"] == item["id"] == deltas[0]["item_id"] and events[2]["item"]["arguments"] == ""
    assert "".join(d["delta"] for d in deltas) == item["arguments"]
    assert item["type"] == "function_call" and item["name"] == "exec_command" and item["call_id"] == "call_1"
    assert json.loads(item["arguments"]) == {"cmd": "echo hello"}
    usage = events[-1]["response"]["usage"]
    assert usage["input_tokens"] > 0 and usage["total_tokens"] >= usage["input_tokens"]

    sent = provider.history[-1]
    names = {tool["function"]["name"] for tool in sent["tools"]}
    assert {"exec_command", "apply_patch", "tool_search"} <= names  # custom and client tool_search kept
    # Codex's 9 tools (the hosted web_search is left out, not refused), then the proxy's reader.
    assert len(sent["tools"]) == 10 and sent["tools"][-1]["function"]["name"] == "read_tool_output"
    assert sent["messages"][-1]["content"].startswith("Run the shell command `echo hello`")


def test_codex_apply_patch_call_comes_back_as_a_custom_tool_call(start_proxy, provider):
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n"
    provider.script(lambda body: Reply(tool_calls=(ToolCall("apply_patch", {"input": patch}, id="call_p"),)))
    proxy = _proxy(start_proxy, provider)
    _, events = _replay(proxy, _capture("01-responses.json"))
    (item,) = _done_items(events)
    assert item == {
        "type": "custom_tool_call",
        "id": item["id"],
        "call_id": "call_p",
        "name": "apply_patch",
        "input": patch,
        "status": "completed",
    }
    assert "response.custom_tool_call_input.done" in [e["type"] for e in events]


def test_codex_final_turn_streams_text_in_the_sdk_order(start_proxy, provider):
    provider.script(lambda body: Reply(content="The command printed: hello"))
    proxy = _proxy(start_proxy, provider)
    _, events = _replay(proxy, _capture("02-responses.json"))
    types = [e["type"] for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == (
        "The command printed: hello"
    )
    # the history Codex resent (function_call + function_call_output) reached the provider as a tool step
    sent = provider.history[-1]["messages"]
    assistant = next(m for m in sent if m["role"] == "assistant")
    assert assistant["tool_calls"][0]["function"]["name"] == "exec_command"
    assert sent[-1]["role"] == "tool" and "hello" in sent[-1]["content"]


def test_codex_remote_compaction_returns_one_item_that_stands_for_the_checkpoint(start_proxy, provider):
    def script(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return Reply(content=checkpoint_for(body["messages"][-1]["content"]))
        if any(m["role"] == "tool" for m in body["messages"]):
            return Reply(content="The command printed: hello")
        if any(_is_checkpoint(m) for m in body["messages"]):
            return Reply(content="The command printed: hello")
        return Reply(tool_calls=(ToolCall("exec_command", {"cmd": "echo hello"}, id="call_0002"),))

    provider.script(script)
    proxy = _proxy(start_proxy, provider)
    folder = "compact-remote/"
    _replay(proxy, _capture(folder + "01-responses.json"))

    answer, events = _replay(proxy, _capture(folder + "02-responses.json"))
    assert answer.status_code == 200
    items = _done_items(events)
    assert len(items) == 1 and items[0]["type"] == "compaction"  # Codex: exactly one compaction item
    assert set(items[0]) == {"type", "id", "encrypted_content"}
    assert events[-1]["type"] == "response.completed"
    summary = provider.history[-1]
    assert is_summary_request(summary)
    assert "echo hello" in summary["messages"][-1]["content"]  # the compacted tool step was summarized
    trace = _compaction_trace(proxy, answer.headers["x-context-id"])
    assert trace["compaction"]["attempts"] == 1 and "fallback" not in trace["compaction"]
    assert trace["llmInput"]["messages"] == summary["messages"] and trace["ingress"]["request"] == "compaction_trigger"

    # Codex sends the item back verbatim in place of the history it dropped.
    capture = _capture(folder + "03-responses.json")
    body = json.loads(
        json.dumps(capture["body"]).replace('"capture-checkpoint-1"', json.dumps(items[0]["encrypted_content"]))
    )
    answer, events = _replay(proxy, capture, body)
    assert events[-1]["type"] == "response.completed"
    sent = provider.history[-1]["messages"]
    checkpoints = [m for m in sent if _is_checkpoint(m)]
    assert len(checkpoints) == 1 and "## Next step" in checkpoints[0]["content"]
    assert not any(m["role"] == "tool" for m in sent)  # the model sees the checkpoint, not the dropped step


def test_a_failing_summarizer_still_answers_with_a_deterministic_checkpoint(start_proxy, provider):
    def script(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return Reply(error_status=500, error_body={"error": {"message": "summarizer down", "type": "server_error"}})
        if any(m["role"] == "tool" for m in body["messages"]) or any(_is_checkpoint(m) for m in body["messages"]):
            return Reply(content="The command printed: hello")
        return Reply(tool_calls=(ToolCall("exec_command", {"cmd": "echo hello"}, id="call_0002"),))

    provider.script(script)
    proxy = _proxy(start_proxy, provider)
    folder = "compact-remote/"
    _replay(proxy, _capture(folder + "01-responses.json"))
    answer, events = _replay(proxy, _capture(folder + "02-responses.json"))
    assert answer.status_code == 200 and events[-1]["type"] == "response.completed"
    (item,) = _done_items(events)
    assert item["type"] == "compaction"
    trace = _compaction_trace(proxy, answer.headers["x-context-id"])
    assert trace["compaction"]["fallback"]["kind"] == "deterministic"
    assert "summarizer down" in trace["compaction"]["fallback"]["reason"]
    assert trace["summarizerCalls"][0]["error"]["message"]

    capture = _capture(folder + "03-responses.json")
    body = json.loads(
        json.dumps(capture["body"]).replace('"capture-checkpoint-1"', json.dumps(item["encrypted_content"]))
    )
    answer, events = _replay(proxy, capture, body)
    assert events[-1]["type"] == "response.completed"
    (checkpoint,) = [m for m in provider.history[-1]["messages"] if _is_checkpoint(m)]
    # The dropped step is still there, listed mechanically: the call, its arguments, the start of its result.
    assert "exec_command" in checkpoint["content"] and "echo hello" in checkpoint["content"]
    assert "## Next step" in checkpoint["content"]


def _compaction_trace(proxy: Any, context_id: str) -> dict[str, Any]:
    """The one trace of a remote compaction in the session's trace folder."""
    folder = proxy.settings.data_dir / "context-traces" / context_id
    traces = [json.loads(p.read_text()) for p in sorted(folder.glob("turn-*.json"))]
    (found,) = [t for t in traces if (t.get("compaction") or {}).get("reason") == "client_compaction_request"]
    return found


def test_a_compaction_item_the_proxy_did_not_issue_is_dropped_not_refused(start_proxy, provider):
    provider.script(lambda body: Reply(content="ok"))
    proxy = _proxy(start_proxy, provider)
    answer, events = _replay(proxy, _capture("compact-remote/03-responses.json"))
    assert answer.status_code == 200 and events[-1]["type"] == "response.completed"
    assert not any(_is_checkpoint(m) for m in provider.history[-1]["messages"])


def test_responses_compact_endpoint_answers_with_user_messages_and_the_compaction_item(start_proxy, provider):
    provider.script(lambda body: Reply(content=checkpoint_for(body["messages"][-1]["content"])))
    proxy = _proxy(start_proxy, provider)
    capture = _capture("compact-remote/02-responses.json")
    body = {k: v for k, v in capture["body"].items() if k != "stream"}
    body["input"] = body["input"][:-1]  # v1 has no trigger item: the path says it
    answer = httpx.post(
        f"{proxy.url}/v1/responses/compact", json=body, headers={"session-id": "compact-v1"}, timeout=60
    )
    assert answer.status_code == 200
    output = answer.json()["output"]
    assert [item["type"] for item in output][-1] == "compaction"
    assert all(item["role"] == "user" for item in output[:-1]) and len(output) == 3


def _is_checkpoint(message: dict[str, Any]) -> bool:
    """A checkpoint message under whatever framing nonce the proxy's session has."""
    content = message.get("content")
    return message.get("role") == "user" and isinstance(content, str) and CHECKPOINT_OPEN.match(content) is not None
