"""Dynamic mode through real HTTP: a long tool run stays within the window, and nothing is lost.

The client is a plain agent loop that resends its whole, ever-growing history each turn; the proxy
compacts what the provider sees (previews with references, then checkpoints) and the model reads a
compacted output back through the proxy-owned ``read_tool_output`` without the client noticing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tiktoken

from proxy.ingress.chat.wire import check_tool_pairing
from proxy.provider.science_script import PLANTED_FACT, TOOLS, ScienceModel, client_tool_result, is_summary_request
from tests.integration.conftest import route_to

WINDOW = 16_000
ENCODING = tiktoken.get_encoding("o200k_base")


def _tokens(messages: list[dict[str, Any]]) -> int:
    return len(ENCODING.encode(json.dumps(messages, ensure_ascii=False)))


def _run_agent(client: Any, steps: int, session: str, stream: bool = False) -> tuple[str, list[dict[str, Any]], int]:
    """Drive the agent loop to its final answer; returns it, the client's history and the turns taken."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an autonomous lab agent. Run the protocol step by step."},
        {"role": "user", "content": f"Run the {steps}-step calibration protocol, then report the calibration fact."},
    ]
    for turn in range(1, steps + 5):
        kwargs = {
            "model": "science-model",
            "messages": messages,
            "tools": TOOLS,
            "extra_headers": {"x-session-id": session},
        }
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **kwargs))
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls: dict[int, dict[str, Any]] = {}
            for c in chunks:
                for delta in (c.choices[0].delta.tool_calls or []) if c.choices else []:
                    slot = calls.setdefault(
                        delta.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                    slot["id"] = delta.id or slot["id"]
                    slot["function"]["name"] += delta.function.name or ""
                    slot["function"]["arguments"] += delta.function.arguments or ""
            message = {"role": "assistant", "content": content or None, "tool_calls": list(calls.values()) or None}
        else:
            completion = client.chat.completions.create(**kwargs)
            message = completion.choices[0].message.model_dump(exclude_none=True)
        message = {k: v for k, v in message.items() if v is not None}
        messages.append(message)
        if not message.get("tool_calls"):
            return str(message.get("content")), messages, turn
        for call in message["tool_calls"]:
            assert call["function"]["name"] == "run_step", "a proxy-owned tool reached the client"
            messages.append(client_tool_result(call))
    raise AssertionError("the agent did not finish")


def test_long_tool_run_stays_in_the_window_and_reads_back_a_compacted_fact(start_proxy, provider):
    steps = 150
    model = ScienceModel(steps)
    provider.script(model, context_window=WINDOW)
    proxy = start_proxy(
        mode="dynamic", models=(route_to(provider.url, "science-model", window=WINDOW),), trace_enabled=True
    )
    answer, history, turns = _run_agent(proxy.client(), steps, "long-run")

    assert PLANTED_FACT in answer
    agent_requests = [body for body in provider.history if not is_summary_request(body)]
    assert len(agent_requests) == turns + 1  # + the proxy-owned read_tool_output round
    effective_limit = WINDOW - 2_000
    # Measured as the provider counts (what its window is in): the proxy calibrates to that count.
    counted = dict(zip(map(id, provider.history), provider.provider.prompt_tokens, strict=True))
    largest = max(counted[id(body)] for body in agent_requests)
    assert largest <= effective_limit
    for body in agent_requests:
        check_tool_pairing(body["messages"])  # protocol-valid: every call answered, no orphan results
        assert {t["function"]["name"] for t in body["tools"]} <= {"run_step", "read_tool_output"}
    assert model.summaries >= 1  # previews alone could not hold 150 outputs of 12 KB
    # The read-back happened inside the proxy: the client's history has no read_tool_output step.
    assert all("read_tool_output" not in json.dumps(m) for m in history)
    final_request = agent_requests[-1]
    assert any(m.get("role") == "tool" and PLANTED_FACT in str(m.get("content")) for m in final_request["messages"])

    sent = sum(_tokens(body["messages"]) for body in provider.history)
    passthrough = sum(_tokens(history[: 2 + 2 * k]) for k in range(turns))
    print(
        f"\nprompt tokens sent {sent:,} vs passthrough {passthrough:,} ({1 - sent / passthrough:.1%} fewer); "
        f"largest request {largest:,} of {effective_limit:,}; summaries {model.summaries}"
    )
    assert sent < passthrough * 0.25


def test_compacted_run_streams_and_keeps_traces_per_call(start_proxy, provider, tmp_path):
    steps = 25
    model = ScienceModel(steps)
    provider.script(model, context_window=WINDOW)
    proxy = start_proxy(
        mode="dynamic", models=(route_to(provider.url, "science-model", window=WINDOW),), trace_enabled=True
    )
    answer, _, turns = _run_agent(proxy.client(), steps, "streamed-run", stream=True)
    assert PLANTED_FACT in answer
    folder = proxy.settings.data_dir / "context-traces" / "streamed-run"
    traces = sorted(folder.glob("turn-*.json"))
    assert len(traces) == turns + 1  # one file per model call: the proxy-owned round is a turn of its own
    compactions = [json.loads(p.read_text())["compaction"] for p in traces]
    assert any(c and c.get("compactedRefs") for c in compactions)


@pytest.mark.parametrize("stream", [False, True])
def test_mixed_proxy_and_client_calls_never_reach_the_client(start_proxy, provider, stream):
    from proxy.provider.scripted import Reply, ToolCall

    deferred = {
        "type": "function",
        "function": {
            "name": "mcp__lims__lookup",
            "description": "Look up a LIMS sample.",
            "parameters": {"type": "object", "properties": {}},
        },
    }

    def script(body: dict[str, Any]) -> Reply:
        if any(m.get("tool_call_id") == "f1" for m in body["messages"]):
            return Reply(content="found it")
        return Reply(
            tool_calls=(ToolCall("find_tools", {"query": "LIMS"}, id="f1"), ToolCall("run_step", {"step": 1}, id="c1"))
        )

    provider.script(script)
    options = {"capabilities": {"deferred": ["mcp__*"]}}
    proxy = start_proxy(
        mode="dynamic", models=(route_to(provider.url, "science-model", window=WINDOW),), contributor_options=options
    )
    result = proxy.client().chat.completions.create(
        model="science-model", messages=[{"role": "user", "content": "go"}], tools=[*TOOLS, deferred], stream=stream
    )
    if stream:
        chunks = list(result)
        names = [d.function.name for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        names = [c.function.name for c in result.choices[0].message.tool_calls or []]
        text = result.choices[0].message.content
    assert names == [] and text == "found it"  # neither the proxy's call nor the dropped client call
    # The provider saw the proxy's step (its call and result) before answering, and only that step.
    last = provider.history[-1]["messages"]
    (step,) = [m for m in last if m.get("role") == "assistant" and m.get("tool_calls")]
    assert [c["function"]["name"] for c in step["tool_calls"]] == ["find_tools"]
    assert any(m.get("tool_call_id") == "f1" and "mcp__lims__lookup" in m["content"] for m in last)
    assert len(provider.history) == 2


def test_read_tool_output_is_offered_from_the_first_call_of_a_tool_session(start_proxy, provider):
    """The tool list heads the provider's cached prefix: the reader does not appear with the first preview."""
    provider.script(ScienceModel(6))
    proxy = start_proxy(mode="dynamic", models=(route_to(provider.url, "science-model", window=WINDOW),))
    _run_agent(proxy.client(), 6, "references")
    calls = [body for body in provider.history if not is_summary_request(body)]
    previews = ["ref=to_" in json.dumps(body["messages"]) for body in calls]
    assert previews[0] is False and any(previews)  # compaction previewed outputs on the way
    assert all("read_tool_output" in {t["function"]["name"] for t in body["tools"]} for body in calls)
    assert len({json.dumps(body["tools"], sort_keys=True) for body in calls}) == 1  # byte-stable tool list


def test_read_tool_output_is_not_offered_in_a_session_without_tools(start_proxy, provider):
    provider.script(ScienceModel(1))
    proxy = start_proxy(mode="dynamic", models=(route_to(provider.url, "science-model", window=WINDOW),))
    proxy.client().chat.completions.create(
        model="science-model", messages=[{"role": "user", "content": "What is a titration?"}]
    )
    assert "tools" not in provider.history[-1] or not provider.history[-1]["tools"]


def test_shadow_sends_the_clients_request_and_traces_the_candidate(start_proxy, provider):
    provider.script(ScienceModel(3))
    proxy = start_proxy(
        mode="shadow", models=(route_to(provider.url, "science-model", window=WINDOW),), trace_enabled=True
    )
    messages = [{"role": "system", "content": "lab agent"}, {"role": "user", "content": "start"}]
    proxy.client().chat.completions.create(
        model="science-model", messages=messages, tools=TOOLS, extra_headers={"x-session-id": "shadowed"}
    )
    assert provider.history[-1] == {"model": "scripted", "messages": messages, "tools": TOOLS}
    trace = json.loads((proxy.settings.data_dir / "context-traces" / "shadowed" / "turn-0001.json").read_text())
    assert trace["mode"] == "shadow" and trace["selectedPath"] == "dynamic"
    assert trace["renderedContext"]["callHistory"][0]["role"] == "system"
    assert trace["llmInput"]["messages"] == messages


def test_summarizer_overflow_falls_back_to_trimming_without_recursion(start_proxy, provider):
    from proxy.provider.scripted import Reply

    model = ScienceModel(40)
    overflow = {
        "error": {
            "message": "This model's maximum context length is 16000 tokens.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }

    def script(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return Reply(error_status=400, error_body=overflow)
        return model(body)

    provider.script(script)
    proxy = start_proxy(
        mode="dynamic", models=(route_to(provider.url, "science-model", window=WINDOW),), trace_enabled=True
    )
    _, _, turns = _run_agent(proxy.client(), 40, "no-summary")
    summary_calls = [b for b in provider.history if is_summary_request(b)]
    assert summary_calls, "the run never needed a checkpoint"
    folder: Path = proxy.settings.data_dir / "context-traces" / "no-summary"
    errors = [json.loads(p.read_text())["compaction"].get("errors") for p in sorted(folder.glob("turn-*.json"))]
    assert any(errors)
    agent_calls = len(provider.history) - len(summary_calls)
    assert agent_calls == len(list(folder.glob("turn-*.json")))  # one call per trace: nothing was retried
    assert not list(folder.glob("*recovery*"))
    assert agent_calls >= turns


@pytest.mark.parametrize(("retry_after", "retried"), [(None, False), (1, True)])
def test_a_failed_summary_is_tried_again_once_the_history_grew_by_the_setting(
    start_proxy, provider, retry_after, retried
):
    from proxy.provider.scripted import Reply
    from tests.integration.test_branches import TOOLS as MEASURE
    from tests.integration.test_branches import _long_run

    def script(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return Reply(error_status=500, error_body={"error": {"message": "summarizer down", "type": "server_error"}})
        return Reply(content="ok")

    provider.script(script)
    # SCIENCE_AGENT_SUMMARY_RETRY_AFTER_MESSAGES: unset (20), or 1 (the next, one message longer, history).
    overrides = {} if retry_after is None else {"summary_retry_after_messages": retry_after}
    route = route_to(provider.url, window=6_000, max_output=1_000)
    proxy = start_proxy(models=(route,), trace_enabled=True, **overrides)
    client = proxy.client()
    run = _long_run("a", 8)  # finished steps whose reasoning only a summary can shrink
    for messages in (run, [*run, {"role": "user", "content": "go on"}]):
        client.chat.completions.create(
            model="test-model", messages=messages, tools=MEASURE, extra_headers={"x-session-id": "retry"}
        )
    folder: Path = proxy.settings.data_dir / "context-traces" / "retry"
    first, second = (json.loads(p.read_text()) for p in sorted(folder.glob("turn-*.json")))
    assert first["summarizerCalls"] and "summaryBackoff" not in first  # tried, and the summary failed
    assert bool(second["summarizerCalls"]) is retried
    assert ("summaryBackoff" in second) is not retried
