"""Native passage pinned by cassettes: what Anthropic and the Responses API receive when the client speaks
its route's own API.

Same machinery as ``test_cassettes.py`` (replay by default, ``CONTEXT_PROXY_RECORD_CASSETTES=1`` re-records,
hosts normalized, the framing secret pinned, the shipped defaults), with the strict stand-ins as providers:
``scripted_anthropic.py`` signs its thinking and ``scripted_responses.py`` seals its reasoning, so a recorded
session is one the provider accepted at every call. A cassette holds every provider request of a session:
the native ones the codec rendered and posted as they are (``provider/native_transport.py``: httpx with a
pre-encoded body, matched on its JSON like litellm's), and the summarizer's checkpoint request, which goes
over litellm's chat path to the same route (Anthropic: litellm's Messages adapter; ``gpt-5-codex``: litellm
bridges it to ``/v1/responses``). The Messages cassette keeps ``anthropic-version`` and ``anthropic-beta``
and matches them: the betas are part of what the provider receives. In replay the stand-ins are running
(the route needs an address) but must see no request at all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from proxy.kernel.config import ModelRoute
from proxy.provider.science_script import SUMMARY_MARKER, checkpoint_for, tool_output
from proxy.provider.scripted import serve_in_thread
from proxy.provider.scripted_anthropic import (
    DEFAULT_API_KEY as ANTHROPIC_KEY,
)
from proxy.provider.scripted_anthropic import (
    MessageReply,
    ScriptedAnthropic,
    SearchResult,
    Text,
    Thinking,
    ToolUse,
    WebSearch,
)
from proxy.provider.scripted_responses import DEFAULT_API_KEY as RESPONSES_KEY
from proxy.provider.scripted_responses import (
    FunctionCall,
    Message,
    Reasoning,
    ResponseReply,
    ScriptedResponses,
    WebSearchCall,
)
from tests.integration.test_cassettes import (  # noqa: F401  (fixtures used by name)
    RECORDING,
    _is_checkpoint,
    _sent,
    _traces,
    pinned_proxy,
    replay_checked,
    use_cassette,
)

STEPS = 10
STEP_LOG = re.compile(r"^step=(\d+) measurement log$", re.MULTILINE)
CHECKPOINT_STEP = re.compile(r"^- step (\d+) output", re.MULTILINE)
REF = re.compile(r"ref=([A-Za-z0-9_.:-]+)")
TASK = f"Run the {STEPS}-step calibration protocol."
ANTHROPIC_HEADERS = frozenset({"anthropic-version", "anthropic-beta"})
BETA = "interleaved-thinking-2025-05-14"


def _checkpoint(transcript: str) -> str:
    """A checkpoint naming the steps the transcript logged (with their references when it gives them: a
    client's remote compaction summarizes a history the proxy never stored, so it gives none)."""
    text = checkpoint_for(transcript)
    logged = sorted({int(n) for n in re.findall(r"step=(\d+) measurement log", transcript)})
    if "ref=" in text or not logged:
        return text
    return text.replace(
        "## Evidence\n- (none)", "## Evidence\n" + "\n".join(f"- step {n} output logged" for n in logged)
    )


def _last_step(text: str) -> int:
    """The last step the model is shown: in a whole log or its preview (first line kept), or a checkpoint."""
    return max((int(n) for n in STEP_LOG.findall(text) + CHECKPOINT_STEP.findall(text)), default=0)


@pytest.fixture
def replay_only() -> Iterator[list[Any]]:
    """The stand-ins a test started: in replay mode none of them may have been called."""
    stand_ins: list[Any] = []
    yield stand_ins
    if not RECORDING:
        for stand_in in stand_ins:
            assert stand_in.requests == [], "a provider request was not answered from the cassette"


def _replayed_whole(cassette: Any) -> None:
    """In replay, every recorded request was asked for again (a call the proxy no longer makes fails)."""
    if not RECORDING:
        assert cassette.all_played, "the cassette holds provider requests this run no longer made"


# --- Messages -> Anthropic ----------------------------------------------------------------------------------

ANTHROPIC_TOOLS: list[dict[str, Any]] = [
    {
        "name": "run_step",
        "description": "Run one measurement step of the protocol and return its raw log.",
        "input_schema": {"type": "object", "properties": {"step": {"type": "integer"}}, "required": ["step"]},
    },
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
]
SYSTEM = [{"type": "text", "text": "You are a calibration agent.", "cache_control": {"type": "ephemeral"}}]


def _anthropic_summary(body: dict[str, Any]) -> bool:
    system = body.get("system")
    return isinstance(system, list) and bool(system) and str(system[0].get("text", "")).startswith(SUMMARY_MARKER)


class ThinkingModel:
    """Thinks, then runs ``run_step`` (a web search beside step 3), reads one compacted output back through
    the proxy's ``read_tool_output`` once it is offered, answers after ``STEPS``; writes checkpoints."""

    def __init__(self) -> None:
        self.read_back = False
        self.summaries = 0

    def __call__(self, body: dict[str, Any]) -> MessageReply:
        if _anthropic_summary(body):
            self.summaries += 1
            last = body["messages"][-1]["content"]
            text = last if isinstance(last, str) else "".join(b.get("text", "") for b in last)
            return MessageReply((Text(_checkpoint(text)),))
        shown = json.dumps(body["messages"])
        names = {tool.get("name") for tool in body.get("tools") or []}
        if "read_tool_output" in names and not self.read_back and (ref := REF.search(shown)):
            self.read_back = True
            read = ToolUse("read_tool_output", {"ref": ref.group(1), "query": "step="})
            return MessageReply((Thinking("An output was compacted; read it back."), read))
        last = _last_step("\n".join(_texts(body["messages"])))
        if last >= STEPS:
            return MessageReply((Thinking("All steps ran."), Text(f"Calibrated in {last} steps.")))
        call = ToolUse("run_step", {"step": last + 1})
        if last == 2:
            search = WebSearch("diffractometer calibration", (SearchResult("https://lab.example/cal", "Calibration"),))
            return MessageReply((Thinking("Look the procedure up first."), search, call))
        return MessageReply((Thinking(f"Step {last + 1}."), call))


def _texts(messages: list[dict[str, Any]]) -> list[str]:
    """Every text the model is shown: string contents, text blocks, tool results' contents."""
    out: list[str] = []
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            out.append(content)
            continue
        for block in content:
            if block.get("type") == "text":
                out.append(block["text"])
            elif block.get("type") == "tool_result":
                inner = block.get("content")
                out += [inner] if isinstance(inner, str) else [b.get("text", "") for b in inner or []]
    return out


@pytest.fixture
def anthropic_stand_in(replay_only: list[Any]) -> Iterator[tuple[ScriptedAnthropic, str]]:
    stand_in = ScriptedAnthropic(ThinkingModel(), accept_bearer=False)
    replay_only.append(stand_in)
    with serve_in_thread(stand_in.app()) as url:
        yield stand_in, url


def test_messages_to_anthropic_natively_through_a_checkpoint_is_pinned(
    anthropic_stand_in,
    pinned_proxy,  # noqa: F811
    replay_checked,  # noqa: F811
):
    _, url = anthropic_stand_in
    route = ModelRoute(
        "claude",
        {"model": "anthropic/claude-sonnet-4-5", "api_base": url, "api_key": ANTHROPIC_KEY},
        max_input_tokens=7_000,
        max_output_tokens=1_000,
    )
    proxy = pinned_proxy(models=(route,))
    sdk = proxy.anthropic_client()
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    answers = []
    with use_cassette(proxy.url, "native_messages_anthropic.yaml", ANTHROPIC_HEADERS) as cassette:
        for turn in range(STEPS + 3):
            kwargs: dict[str, Any] = {
                "model": "claude",
                "max_tokens": 8_000,
                "system": SYSTEM,
                "tools": ANTHROPIC_TOOLS,
                "messages": messages,
                "thinking": {"type": "enabled", "budget_tokens": 2_000},
                "metadata": {"user_id": "native-cassette-user"},
                "extra_headers": {
                    "X-Claude-Code-Session-Id": "native-anthropic",
                    "anthropic-version": "2023-06-01",  # as Claude Code sends it (the SDK's own default moves)
                    "anthropic-beta": f"{BETA},context-management-2025-06-27",
                },
            }
            if turn % 2:  # every other turn streamed: both of the provider's answer forms are pinned
                with sdk.messages.stream(**kwargs) as events:
                    answer = events.get_final_message()
            else:
                answer = sdk.messages.create(**kwargs)
            answers.append(answer)
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]})
            calls = [b for b in answer.content if b.type == "tool_use"]
            if not calls:
                break
            results = [
                {"type": "tool_result", "tool_use_id": c.id, "content": tool_output(int(c.input["step"]), 3_000)}
                for c in calls
            ]
            messages.append({"role": "user", "content": results})
    assert answers[-1].content[-1].text == f"Calibrated in {STEPS} steps."
    _replayed_whole(cassette)

    requests = cassette.requests
    summaries = [(r, b) for r, b in zip(requests, _sent(cassette), strict=True) if _anthropic_summary(b)]
    native = [(r, b) for r, b in zip(requests, _sent(cassette), strict=True) if not _anthropic_summary(b)]
    assert summaries, "the session never reached a checkpoint"
    # The summarizer's call went over litellm to the same route: plain Messages, no thinking, no betas.
    for request, body in summaries:
        assert request.path == "/v1/messages" and "anthropic-beta" not in request.headers
        assert set(body) == {"model", "system", "messages", "max_tokens"} and body["model"] == "claude-sonnet-4-5"
    traces = _traces(proxy, "native-anthropic")
    assert len(traces) == len(native) == len(answers) + 1  # one proxy-owned round: read_tool_output
    for trace, (request, body) in zip(traces, native, strict=True):
        assert trace["ingress"]["passage"] == "native" and trace["llmInput"] == body
        assert request.path == "/v1/messages"
        assert request.headers["anthropic-beta"] == BETA  # context-management is the proxy's to supersede
        assert request.headers["anthropic-version"] == "2023-06-01"
        assert body["thinking"] == {"type": "enabled", "budget_tokens": 2_000}
        assert body["metadata"] == {"user_id": "native-cassette-user"} and body["max_tokens"] == 1_000
        assert body["tools"][:2] == ANTHROPIC_TOOLS  # the server tool as the client declared it
        # The client's mark on its system prompt, and the proxy's at the end of what stays byte-identical until
        # the next compaction: after the latest checkpoint, and after the latest preview past it.
        marks = json.dumps(body).count('"cache_control"')
        checkpointed = any(_is_checkpoint(m) for m in _user_texts(body))
        previewed = "[tool output compacted:" in json.dumps(body["messages"])
        assert 1 + checkpointed <= marks <= 1 + checkpointed + previewed <= 4
    # The proxy compacted (previews, then a checkpoint) and every call after kept the thinking it was issued.
    assert any(t["compaction"]["compactedRefs"] for t in traces)
    assert any(t["compaction"]["summarizedMessages"] for t in traces)
    later = [b for _, b in native if any(_is_checkpoint(m) for m in _user_texts(b))]
    assert later, "no call after the checkpoint carried it"
    for body in later:
        assistants = [m for m in body["messages"] if m["role"] == "assistant"]
        assert assistants and all(m["content"][0]["type"] == "thinking" for m in assistants)
        assert all(block.get("signature") for m in assistants for block in m["content"] if block["type"] == "thinking")
    searched = answers[2].content
    assert [b.type for b in searched][:3] == ["thinking", "server_tool_use", "web_search_tool_result"]


def _user_texts(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The user side's text blocks as chat messages (what ``_is_checkpoint`` reads)."""
    found = []
    for message in body["messages"]:
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        found += [{"role": message["role"], "content": b["text"]} for b in blocks if b.get("type") == "text"]
    return found


# --- Responses -> OpenAI Responses ---------------------------------------------------------------------------

RESPONSES_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "run_step",
        "description": "Run one measurement step of the protocol and return its raw log.",
        "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}, "required": ["step"]},
    },
    {"type": "web_search"},
]
RESPONSES_STEPS = 14
COMPACT_AFTER = 12  # Codex's own remote compaction (compaction_trigger), after the proxy's own checkpoint


def _responses_summary(body: dict[str, Any]) -> bool:
    first = (body.get("input") or [{}])[0]
    content = first.get("content") if isinstance(first, dict) else None
    text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content or [])
    return first.get("role") == "system" and text.startswith(SUMMARY_MARKER)


def _item_texts(items: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for item in items:
        if item.get("type") == "function_call_output":
            out.append(str(item.get("output")))
        content = item.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [str(p.get("text", "")) for p in content if isinstance(p, dict)]
    return out


def reasoning_model(body: dict[str, Any]) -> ResponseReply:
    """Reasons, runs ``run_step`` (a web search beside step 3), answers after ``RESPONSES_STEPS``; writes
    checkpoints."""
    if _responses_summary(body):
        return ResponseReply((Message(_checkpoint(_item_texts(body["input"][-1:])[0])),))
    last = _last_step("\n".join(_item_texts(body["input"])))
    if last >= RESPONSES_STEPS:
        return ResponseReply((Reasoning(("All steps ran.",)), Message(f"Calibrated in {last} steps.")))
    items: tuple[Any, ...] = (Reasoning((f"Step {last + 1}.",)),)
    if last == 2:
        items += (WebSearchCall("diffractometer calibration"),)
    return ResponseReply((*items, FunctionCall("run_step", {"step": last + 1})))


@pytest.fixture
def responses_stand_in(replay_only: list[Any]) -> Iterator[tuple[ScriptedResponses, str]]:
    stand_in = ScriptedResponses(reasoning_model)
    replay_only.append(stand_in)
    with serve_in_thread(stand_in.app()) as url:
        yield stand_in, url


def test_responses_to_openai_natively_through_compactions_is_pinned(
    responses_stand_in,
    pinned_proxy,  # noqa: F811
    replay_checked,  # noqa: F811
):
    """Codex's kind of session: reasoning with encrypted content, ``store: false``, the whole input each turn;
    the proxy's own compaction, then Codex's remote one and the turns that carry its item."""
    _, url = responses_stand_in
    route = ModelRoute(
        "codex",
        {"model": "openai/gpt-5-codex", "api_base": f"{url}/v1", "api_key": RESPONSES_KEY},
        max_input_tokens=6_000,
        max_output_tokens=1_000,
        configured_api="responses",
    )
    proxy = pinned_proxy(models=(route,))
    client = proxy.client()
    task = f"Run the {RESPONSES_STEPS}-step calibration protocol."
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": task}]
    answers = []

    def turn(number: int, extra: list[dict[str, Any]] | None = None) -> Any:
        kwargs: dict[str, Any] = {
            "model": "codex",
            "instructions": "You are Codex, a calibration agent.",
            "input": items + (extra or []),
            "tools": RESPONSES_TOOLS,
            "reasoning": {"effort": "high", "summary": "auto"},
            "include": ["reasoning.encrypted_content"],
            "store": False,
            "prompt_cache_key": "native-responses",
            "parallel_tool_calls": False,
            "extra_headers": {"session-id": "native-responses"},
        }
        if number % 2:
            with client.responses.stream(**kwargs) as events:
                return events.get_final_response()
        return client.responses.create(**kwargs)

    with use_cassette(proxy.url, "native_responses_openai.yaml") as cassette:
        for number in range(RESPONSES_STEPS + 3):
            if number == COMPACT_AFTER:
                (item,) = turn(number, [{"type": "compaction_trigger"}]).output
                assert item.type == "compaction"
                # What Codex keeps: its messages, then the item verbatim.
                items = [i for i in items if i.get("type") == "message"] + [item.model_dump(exclude_none=True)]
            answer = turn(number)
            answers.append(answer)
            items += [o.model_dump(exclude_none=True) for o in answer.output]
            calls = [o for o in answer.output if o.type == "function_call"]
            if not calls:
                break
            for call in calls:
                output = tool_output(json.loads(call.arguments)["step"], 3_000)
                items.append({"type": "function_call_output", "call_id": call.call_id, "output": output})
    assert answers[-1].output_text == f"Calibrated in {RESPONSES_STEPS} steps."
    _replayed_whole(cassette)

    sent = _sent(cassette)
    summaries = [b for b in sent if _responses_summary(b)]
    native = [b for b in sent if not _responses_summary(b)]
    assert len(summaries) >= 2  # the proxy's own checkpoint, and the remote compaction's
    for body in summaries:  # litellm's bridge from the summarizer's chat call
        assert set(body) == {"model", "input", "store"} and body["model"] == "gpt-5-codex"
        assert body["store"] is False  # the provider keeps no copy of the summarized history either
    traces = _traces(proxy, "native-responses")
    (remote,) = [t for t in traces if (t["compaction"] or {}).get("reason") == "client_compaction_request"]
    traces = [t for t in traces if t is not remote]
    assert len(traces) == len(native) == len(answers)
    for trace, body in zip(traces, native, strict=True):
        assert trace["ingress"]["passage"] == "native" and trace["llmInput"] == body
        assert body["store"] is False and "previous_response_id" not in body
        assert body["reasoning"] == {"effort": "high", "summary": "auto"}
        assert body["include"] == ["reasoning.encrypted_content"] and body["prompt_cache_key"] == "native-responses"
        assert body["tools"][:2] == RESPONSES_TOOLS and body["parallel_tool_calls"] is False
        for index, item in enumerate(body["input"]):  # reasoning goes back sealed, before the item it preceded
            if item.get("type") == "reasoning":
                assert item["encrypted_content"].startswith("gAAAAA")
                assert body["input"][index + 1]["type"] in ("function_call", "web_search_call", "message")
    assert any(t["compaction"]["compactedRefs"] for t in traces)
    assert any(t["compaction"]["summarizedMessages"] for t in traces)
    after = [b for b in native if any(_is_checkpoint(m) for m in _input_messages(b))]
    assert after, "no turn after a compaction saw its checkpoint"
    assert [i.type for i in answers[2].output][:2] == ["reasoning", "web_search_call"]


def _input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The input's messages as chat messages (what ``_is_checkpoint`` reads)."""
    return [
        {"role": item.get("role"), "content": "".join(_item_texts([item]))}
        for item in body["input"]
        if item.get("type") == "message"
    ]
