"""A 40-step Claude-style tool loop through ``/v1/messages`` in a 16k window: the client resends its whole
history with ~12 KB tool results every turn; every provider request stays within the window and keeps the task."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
import tiktoken

from proxy.ingress.chat.wire import check_tool_pairing
from proxy.provider.science_script import PLANTED_FACT, TOOLS, ScienceModel, is_summary_request, tool_output
from tests.integration.conftest import route_to

WINDOW = 16_000
ENCODING = tiktoken.get_encoding("o200k_base")
TASK = "Run the 40-step calibration protocol, then report the calibration fact."
ANTHROPIC_TOOLS: list[Any] = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]


def _tokens(messages: list[dict[str, Any]]) -> int:
    return len(ENCODING.encode(json.dumps(messages, ensure_ascii=False)))


def _answer(sdk: anthropic.Anthropic, messages: list[dict[str, Any]], stream: bool) -> anthropic.types.Message:
    kwargs: dict[str, Any] = {
        "model": "science-model",
        "max_tokens": 8_000,  # more than the route declares (2k): the proxy clamps it
        "system": [
            {"type": "text", "text": "You are an autonomous lab agent.", "cache_control": {"type": "ephemeral"}}
        ],
        "tools": ANTHROPIC_TOOLS,
        "messages": messages,
        "extra_headers": {"X-Claude-Code-Session-Id": f"loop-{stream}"},
    }
    if stream:
        with sdk.messages.stream(**kwargs) as events:
            return events.get_final_message()
    return sdk.messages.create(**kwargs)


@pytest.mark.parametrize("stream", [False, True])
def test_forty_step_tool_loop_stays_in_the_window_with_the_task_in_every_request(start_proxy, provider, stream):
    steps = 40
    model = ScienceModel(steps)
    provider.script(model, context_window=WINDOW)
    provider.provider.token_scale = 1.0  # counts as tiktoken does, as this test measures
    proxy = start_proxy(models=(route_to(provider.url, "science-model", window=WINDOW),))
    sdk = proxy.anthropic_client()
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": TASK}]}]
    for _turn in range(steps + 3):
        reply = _answer(sdk, messages, stream)
        messages.append(
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in reply.content]}
        )
        calls = [block for block in reply.content if block.type == "tool_use"]
        if not calls:
            break
        assert reply.stop_reason == "tool_use"
        assert [call.name for call in calls] == ["run_step"], "a proxy-owned tool reached the client"
        results = [
            {"type": "tool_result", "tool_use_id": call.id, "content": tool_output(int(call.input["step"]))}  # type: ignore[index]
            for call in calls
        ]
        messages.append({"role": "user", "content": results})
    else:
        raise AssertionError("the agent did not finish")

    final_text = "".join(block.text for block in reply.content if block.type == "text")
    assert PLANTED_FACT in final_text  # read back from step 1's stored output by the proxy, not the client
    assert len(json.dumps(messages)) > 40 * 12_000  # the client's history really outgrew the window
    agent_requests = [body for body in provider.history if not is_summary_request(body)]
    assert len(agent_requests) >= steps + 1
    for body in agent_requests:
        assert _tokens(body["messages"]) <= WINDOW - 2_000
        assert body["max_tokens"] == 2_000
        assert TASK in json.dumps(body["messages"])
        check_tool_pairing(body["messages"])
    assert model.summaries >= 1
    assert all("read_tool_output" not in json.dumps(m) for m in messages)
