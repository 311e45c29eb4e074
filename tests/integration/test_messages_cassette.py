"""The provider input of a Messages (Claude Code style) session, pinned by a cassette, through a compaction.

Same machinery as ``test_cassettes.py`` (replay by default; ``CONTEXT_PROXY_RECORD_CASSETTES=1``
re-records): the client is the official ``anthropic`` SDK, so a change in the Messages translation or in
the assembly of a translated session changes the recorded provider bodies and fails here.
"""

from __future__ import annotations

import json
import re
from typing import Any

from proxy.provider.science_script import TOOLS as SCIENCE_TOOLS
from proxy.provider.science_script import checkpoint_for, is_summary_request, tool_output
from proxy.provider.scripted import Reply, ToolCall
from tests.integration.test_cassettes import (  # noqa: F401  (fixtures used by name)
    _assert_llm_input_was_sent,
    _sent,
    _traces,
    pinned_proxy,
    replay_checked,
    use_cassette,
)

STEP = re.compile(r"step=(\d+) measurement log")
STEPS = 14
TASK = f"Run the {STEPS}-step calibration protocol."
TOOLS: list[Any] = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in SCIENCE_TOOLS
]


def _script(body: dict[str, Any]) -> Reply:
    if is_summary_request(body):
        return Reply(content=checkpoint_for(body["messages"][-1]["content"]))
    text = json.dumps([m["content"] for m in body["messages"] if m["role"] == "tool"])
    last = max((int(step) for step in STEP.findall(text)), default=0)
    if last >= STEPS:
        return Reply(content=f"Calibrated in {STEPS} steps.")
    return Reply(tool_calls=(ToolCall("run_step", {"step": last + 1}, id=f"toolu_{last + 1:02d}"),))


def test_messages_session_through_a_compaction_is_pinned(provider, pinned_proxy, replay_checked):  # noqa: F811
    provider.script(_script)
    proxy = pinned_proxy(window=7_000, output=1_000)
    sdk = proxy.anthropic_client()
    system = [{"type": "text", "text": "You are a calibration agent.", "cache_control": {"type": "ephemeral"}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    with use_cassette(proxy.url, "messages_compaction.yaml") as cassette:
        for _ in range(STEPS + 2):
            reply = sdk.messages.create(
                model="lab-model",
                max_tokens=4_000,
                system=system,
                tools=TOOLS,
                messages=messages,
                extra_headers={"X-Claude-Code-Session-Id": "cc-pinned", "anthropic-beta": "context-1m-2025-08-07"},
                extra_body={"context_management": {"edits": [{"type": "clear_thinking_20251015"}]}},
            )
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
            calls = [b for b in reply.content if b.type == "tool_use"]
            if not calls:
                break
            results = [
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "content": tool_output(int(call.input["step"]), 3_000),  # type: ignore[index]
                    "cache_control": {"type": "ephemeral"},
                }
                for call in calls
            ]
            messages.append({"role": "user", "content": results})
    assert reply.content[0].text == f"Calibrated in {STEPS} steps."  # type: ignore[union-attr]

    all_sent = _sent(cassette)
    summaries = [b for b in all_sent if is_summary_request(b)]
    sent = [b for b in all_sent if not is_summary_request(b)]
    assert summaries, "the session never crossed the compaction threshold"
    traces = _traces(proxy, "cc-pinned")
    assert len(traces) == len(sent) == STEPS + 1
    for trace, body in zip(traces, sent, strict=True):
        _assert_llm_input_was_sent(trace, body)
        assert trace["contextIdSource"] == "header:x-claude-code-session-id"
        assert trace["ingress"]["notForwarded"] == {
            "context_management": "superseded by the proxy's own context assembly"
        }
        assert trace["ingress"]["maxTokensClamped"] == {"requested": 4_000, "sent": 1_000}
        assert body["max_tokens"] == 1_000
        assert TASK in json.dumps(body["messages"])
        assert "cache_control" not in json.dumps(body)  # an openai/ route: litellm drops Anthropic's marks
        assert "anthropic-beta" not in json.dumps(trace)
    assert any(t["compaction"]["summarizedMessages"] for t in traces)
