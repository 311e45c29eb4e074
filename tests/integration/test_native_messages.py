"""Claude Code's kind of session through the proxy to its own provider, natively (the Messages API end to end).

The provider is the strict Anthropic stand-in (``proxy/provider/scripted_anthropic.py``): it signs its thinking
blocks and refuses a block whose signature does not verify, a thinking-enabled tool loop whose assistant turn
does not open with thinking, a fifth cache breakpoint, unpaired tool results. The client is the official
``anthropic`` SDK, its answers appended as it returns them (and streams read through its own accumulator).
Ten tool steps of ~12 KB outputs in a 16k window make the proxy compact and offer its ``read_tool_output``,
which the model calls once: every request must still be accepted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from proxy.app import create_app
from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.science_script import tool_output
from proxy.provider.scripted import serve_in_thread
from proxy.provider.scripted_anthropic import (
    DEFAULT_API_KEY,
    MessageReply,
    ScriptedAnthropic,
    SearchResult,
    Text,
    Thinking,
    ToolUse,
    WebSearch,
)

STEPS = 10
BETA = "interleaved-thinking-2025-05-14"
TOOLS = [
    {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object", "properties": {}}},
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
]
SYSTEM = [{"type": "text", "text": "You are Claude Code, a coding agent.", "cache_control": {"type": "ephemeral"}}]
_REF = re.compile(r"ref=([A-Za-z0-9_.:-]+)")


class Model:
    """The scripted model: thinks, runs ``Bash`` step by step (a web search on step 2), reads one compacted
    output back through the proxy's ``read_tool_output`` once it is offered, then answers."""

    def __init__(self) -> None:
        self.read_back = False

    def __call__(self, body: dict[str, Any]) -> MessageReply:
        names = {tool.get("name") for tool in body.get("tools") or []}
        text = json.dumps(body["messages"])
        if "read_tool_output" in names and not self.read_back and (ref := _REF.search(text)):
            self.read_back = True
            return MessageReply(
                (
                    Thinking("An output was compacted; read it back."),
                    ToolUse("read_tool_output", {"ref": ref.group(1), "query": "step=1"}),
                )
            )
        step = text.count('"tool_use_id"')  # the client's results so far (and the proxy's own)
        if step >= STEPS:
            return MessageReply((Thinking("All steps ran."), Text("Done.")))
        if step == 2:
            search = WebSearch("calibration", (SearchResult("https://lab.example/cal", "Calibration"),))
            return MessageReply((Thinking("Look it up."), search, ToolUse("Bash", {"step": step + 1})))
        return MessageReply((Thinking(f"Step {step + 1}."), ToolUse("Bash", {"step": step + 1})))


@pytest.fixture
def provider() -> Iterator[tuple[ScriptedAnthropic, str]]:
    stand_in = ScriptedAnthropic(Model(), accept_bearer=False)  # the proxy sends x-api-key, as Anthropic documents
    with serve_in_thread(stand_in.app()) as url:
        yield stand_in, url


def proxy_for(url: str, tmp_path: Any, **settings: Any) -> Any:
    route = ModelRoute(
        "claude",
        {"model": "anthropic/claude-sonnet-4-5", "api_base": url, "api_key": DEFAULT_API_KEY},
        max_input_tokens=16_000,
        max_output_tokens=4_000,
    )
    return serve_in_thread(create_app(Settings(data_dir=tmp_path / "data", models=(route,), **settings)))


def run_claude_code(sdk: anthropic.Anthropic, *, stream: bool) -> list[Any]:
    """The agent's loop: ask, run each Bash call (a ~12 KB log), send the results back, until it answers."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Calibrate the rig."}]}]
    answers = []
    for _ in range(STEPS + 3):
        kwargs: dict[str, Any] = {
            "model": "claude",
            "max_tokens": 32_000,
            "system": SYSTEM,
            "messages": messages,
            "tools": TOOLS,
            "thinking": {"type": "enabled", "budget_tokens": 4000},
            "metadata": {"user_id": '{"session_id": "native-cc-1"}'},
            "extra_headers": {"anthropic-beta": f"{BETA},context-management-2025-06-27"},
            "extra_body": {"top_k": 40, "service_tier": "auto"},
        }
        if stream:
            with sdk.messages.stream(**kwargs) as events:
                answer = events.get_final_message()
        else:
            answer = sdk.messages.create(**kwargs, timeout=60)
        answers.append(answer)
        content = [block.model_dump(exclude_none=True) for block in answer.content]
        messages.append({"role": "assistant", "content": content})
        calls = [block for block in answer.content if block.type == "tool_use"]
        if not calls:
            return answers
        results = [
            {"type": "tool_result", "tool_use_id": call.id, "content": tool_output(int(call.input["step"]))}
            for call in calls
        ]
        messages.append({"role": "user", "content": results})
    raise AssertionError("the agent did not finish")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_thinking_tool_loop_that_compacts_is_accepted_at_every_call(provider, tmp_path, stream: bool) -> None:
    stand_in, url = provider
    with (
        proxy_for(url, tmp_path) as proxy,
        anthropic.Anthropic(base_url=proxy, api_key="sk-client", max_retries=0) as sdk,
    ):
        answers = run_claude_code(sdk, stream=stream)

    assert answers[-1].content[-1].text == "Done."
    # Every request reached the stand-in and was accepted: its refusals would have failed the loop above.
    received = [r for r in stand_in.requests if r.path == "/v1/messages"]
    assert len(received) == len(answers) + 1  # and one proxy-owned round: read_tool_output, run by the proxy
    for request in received:
        body = request.body
        assert body["thinking"] == {"type": "enabled", "budget_tokens": 4000}
        assert body["top_k"] == 40 and body["service_tier"] == "auto"
        assert body["metadata"] == {"user_id": '{"session_id": "native-cc-1"}'}
        assert request.header("anthropic-beta") == BETA  # the context-management beta the proxy supersedes is out
        assert request.header("x-api-key") == DEFAULT_API_KEY
        assert body["tools"][:2] == TOOLS  # the server tool passes, as the client declared it
        # The client's mark on its system prompt, carried; once outputs are previewed, the proxy's after the
        # latest preview (what stays byte-stable until the next compaction).
        previewed = "[tool output compacted:" in json.dumps(body["messages"])
        assert json.dumps(body).count('"cache_control"') == 1 + previewed
    # The proxy compacted: old outputs became previews, and the model read one back through the proxy.
    assert any("ref=" in json.dumps(r.body["messages"]) for r in received)
    proxy_round = [r for r in received if '"name": "read_tool_output"' in json.dumps(r.body["messages"])]
    assert proxy_round, "the proxy's own round was sent back to the provider"
    # Every thinking block the client got carries the signature the provider issued.
    for answer in answers:
        thinking = [b for b in answer.content if b.type == "thinking"]
        assert thinking and all(b.signature for b in thinking)
    searched = answers[2].content
    assert [b.type for b in searched][:3] == ["thinking", "server_tool_use", "web_search_tool_result"]


def test_a_provider_overflow_is_retried_once_after_a_forced_compaction(provider, tmp_path) -> None:
    stand_in, url = provider
    model = stand_in.script
    refused: list[int] = []

    def overflowing_once(body: dict[str, Any]) -> MessageReply:
        if json.dumps(body["messages"]).count('"tool_use_id"') == 4 and not refused:
            refused.append(len(json.dumps(body)))
            error = {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 210000 tokens > 200000 maximum",
                },
            }
            return MessageReply(error_status=400, error_body=error)
        return model(body)

    stand_in.script = overflowing_once
    with (
        proxy_for(url, tmp_path) as proxy,
        anthropic.Anthropic(base_url=proxy, api_key="sk-client", max_retries=0) as sdk,
    ):
        answers = run_claude_code(sdk, stream=False)
    assert answers[-1].content[-1].text == "Done." and refused
    retried = [r.body for r in stand_in.requests if r.path == "/v1/messages"]
    index = next(i for i, body in enumerate(retried) if len(json.dumps(body)) == refused[0])
    assert len(json.dumps(retried[index + 1])) < refused[0]  # the one retry, smaller, and accepted


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_anthropic_route_spoken_to_in_chat_still_gets_what_the_ingress_set(provider, tmp_path, stream) -> None:
    """``api: chat`` on an Anthropic route: litellm's chat translation, but ``thinking``, ``top_k`` and the beta
    header the Messages ingress set are its own arguments, not the client's, so the allow-list lets them by."""
    stand_in, url = provider
    route = ModelRoute(
        "claude",
        {"model": "anthropic/claude-sonnet-4-5", "api_base": url, "api_key": DEFAULT_API_KEY},
        max_input_tokens=100_000,
        max_output_tokens=4_000,
        configured_api="chat",
    )
    app = create_app(Settings(data_dir=tmp_path / "data", models=(route,)))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Calibrate the rig."}]
    with serve_in_thread(app) as proxy, anthropic.Anthropic(base_url=proxy, api_key="x", max_retries=0) as sdk:
        for _ in range(2):  # the second turn sends the signed thinking block back: the stand-in verifies it
            kwargs: dict[str, Any] = {
                "model": "claude",
                "max_tokens": 2_000,
                "messages": messages,
                "tools": TOOLS[:1],
                "thinking": {"type": "enabled", "budget_tokens": 1024},
                "extra_headers": {"anthropic-beta": BETA},
                "extra_body": {"top_k": 40},
            }
            if stream:
                with sdk.messages.stream(**kwargs) as events:
                    answer = events.get_final_message()
            else:
                answer = sdk.messages.create(**kwargs)
            assert answer.content[0].type == "thinking" and answer.content[0].signature  # and back, signed
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]})
            (call,) = [b for b in answer.content if b.type == "tool_use"]
            messages.append(
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "ok"}]}
            )
    received = [r for r in stand_in.requests if r.path == "/v1/messages"]
    assert len(received) == 2
    for request in received:
        assert request.body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
        assert request.body["top_k"] == 40 and BETA in (request.header("anthropic-beta") or "")


def test_an_answer_mixing_a_proxy_call_and_a_client_call_keeps_its_thinking_and_every_call_answered(
    provider, tmp_path
) -> None:
    """The model calls ``read_tool_output`` and ``Bash`` in one signed answer: the proxy runs its own call and
    keeps the answer whole (editing it would break the signature), answering ``Bash`` as not run; the model,
    asked again, calls ``Bash`` alone, which reaches the client."""
    stand_in, url = provider
    model = Model()
    again: list[bool] = []

    def mixing(body: dict[str, Any]) -> MessageReply:
        text = json.dumps(body["messages"])
        names = {tool.get("name") for tool in body.get("tools") or []}
        if "read_tool_output" in names and not model.read_back and (ref := _REF.search(text)):
            model.read_back = True
            read = ToolUse("read_tool_output", {"ref": ref.group(1), "query": "step=1"})
            return MessageReply((Thinking("Read back and run the next step."), read, ToolUse("Bash", {"step": 99})))
        if model.read_back and not again:  # the next call, with the results it asked for
            again.append(True)
            assert "Not run" in text  # its Bash call in the stored step was answered, not dropped
            return MessageReply((Thinking("Run it again."), ToolUse("Bash", {"step": 99})))
        return model(body)

    stand_in.script = mixing
    with proxy_for(url, tmp_path) as proxy, anthropic.Anthropic(base_url=proxy, api_key="x", max_retries=0) as sdk:
        answers = run_claude_code(sdk, stream=False)
    mixed = next(r.body for r in stand_in.requests if "Not run" in json.dumps(r.body["messages"]))
    # The stored step went back to the provider whole: its thinking first, both calls, both answered.
    step = next(m for m in mixed["messages"] if m["role"] == "assistant" and "read_tool_output" in json.dumps(m))
    assert [b["type"] for b in step["content"]] == ["thinking", "tool_use", "tool_use"]
    client_calls = [b for a in answers for b in a.content if b.type == "tool_use"]
    assert all(call.name == "Bash" for call in client_calls)  # the client never saw the proxy's tool
    assert any(call.input == {"step": 99} for call in client_calls)  # the call it made again reached it


def test_a_thinking_budget_over_the_clamped_max_tokens_is_brought_under_it(provider, tmp_path) -> None:
    """Without interleaved thinking Anthropic refuses a budget not below ``max_tokens``: when the proxy clamps
    ``max_tokens`` to the route's output limit, it brings the budget under it too and names both in the trace,
    so a request the client could send directly is not turned into a refusal."""
    stand_in, url = provider
    stand_in.script = lambda body: MessageReply((Thinking("Short."), Text("Hello.")))
    with (
        proxy_for(url, tmp_path, trace_enabled=True) as proxy,
        anthropic.Anthropic(base_url=proxy, api_key="sk-client", max_retries=0) as sdk,
    ):
        answer = sdk.messages.create(
            model="claude",
            max_tokens=32_000,  # the route's output limit is 4,000
            thinking={"type": "enabled", "budget_tokens": 8_000},
            messages=[{"role": "user", "content": "Hello"}],
            extra_headers={"x-session-id": "thinking-clamp"},
            timeout=60,  # the SDK asks a 32k-token answer to stream unless a timeout is given
        )
    assert answer.content[-1].text == "Hello."
    (sent,) = [r.body for r in stand_in.requests if r.path == "/v1/messages"]
    assert sent["max_tokens"] == 4_000 and sent["thinking"] == {"type": "enabled", "budget_tokens": 3_999}
    (trace_file,) = (tmp_path / "data" / "context-traces").rglob("*.json")
    ingress = json.loads(trace_file.read_text())["ingress"]
    assert ingress["maxTokensClamped"] == {"requested": 32_000, "sent": 4_000}
    assert ingress["thinkingBudgetClamped"] == {"requested": 8_000, "sent": 3_999}
