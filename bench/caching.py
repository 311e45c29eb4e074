"""Part 9: what the provider's prompt cache saves across a compacted session, through the proxy and without it.

One agent session (a tool call per step, each answered with a ~8 KB measurement log) runs twice under each
provider's caching rules: through the proxy in dynamic mode at a window it outgrows (so it compacts, and its
summarizer's calls are billed too), and straight to the provider, whose window never ends (what a user pays
without the proxy if nothing overflowed). The providers are the stand-ins that cache and bill like the real
ones, in this process (the figures are tokens, not times):

- Anthropic's rules over ``/v1/messages`` (``proxy/provider/scripted_anthropic_cache.py``): explicit
  breakpoints, at most four, nothing cached under 1,024 tokens; the client is Claude Code-shaped (its system
  prompt marked, and the last block of its two newest user messages).
- OpenAI's rules over ``/v1/responses`` (``proxy/provider/scripted_responses_cache.py``): prefixes of 1,024
  tokens and more cached by themselves, in 128-token steps, per ``prompt_cache_key``; the client sends none
  (the Agents SDK's way), so the proxy's session key is what groups a session's calls.
- Anthropic's rules again under a Chat Completions client with litellm's moving mark (its system prompt and the
  last part of its newest message marked), through litellm's adaptation; its passthrough is the proxy in
  legacy mode (a plain litellm gateway), since a chat client cannot speak to Anthropic itself.

Every figure is read at the provider's socket: each stand-in keeps the usage it billed for every request,
the summarizer's included. Input is priced at the rules' multiples of the input price (a cache read 0.1x,
an Anthropic cache write 1.25x); *caching saves* is one minus what the input cost against the same tokens
uncached; *proxy / passthrough* is the proxy's input cost over the passthrough's, in the same run.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import openai

from proxy.app import create_app
from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.science_script import SUMMARY_MARKER, checkpoint_for, tool_output
from proxy.provider.scripted import serve_in_thread
from proxy.provider.scripted_anthropic import DEFAULT_API_KEY as ANTHROPIC_KEY
from proxy.provider.scripted_anthropic import MessageReply, ScriptedAnthropic, Text, ToolUse
from proxy.provider.scripted_anthropic_cache import CacheBill
from proxy.provider.scripted_responses import DEFAULT_API_KEY as OPENAI_KEY
from proxy.provider.scripted_responses import FunctionCall, Message, ResponseReply, ScriptedResponses

WINDOW_TOKENS = 64_000
OUTPUT_BYTES = 12_000
READ_PRICE, WRITE_PRICE = 0.1, 1.25  # of the input price
SYSTEM_TEXT = "You are a careful research agent. Run the protocol step by step. " + "Keep to the house rules. " * 150
MARK = {"type": "ephemeral"}
_STEP = re.compile(r"step=(\d+)")


def _last_step(text: str) -> int:
    found = _STEP.search(text)
    return int(found.group(1)) if found else 0


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(part.get("text") or part.get("content") or part.get("output")) for part in content)
    return "" if content is None else str(content)


class BillingAnthropic(ScriptedAnthropic):
    """The Anthropic stand-in, keeping the usage it billed for every request."""

    def __init__(self, steps: int) -> None:
        super().__init__(self._script)
        self.steps = steps
        self.bills: list[dict[str, Any]] = []  # per request: prompt, read, write, and whether it was a summary
        self.summary_next = False

    def _script(self, body: dict[str, Any]) -> MessageReply:
        if SUMMARY_MARKER in _text(body.get("system")) + _text((body.get("messages") or [{}])[0].get("content")):
            self.summary_next = True
            return MessageReply((Text(checkpoint_for(_text(body["messages"][-1]["content"]))),))
        step = _last_step(_text(body["messages"][-1]["content"]))
        if step >= self.steps:
            return MessageReply((Text("Done."),))
        return MessageReply((ToolUse("run_step", {"step": step + 1}),))

    def message(self, body: dict[str, Any], reply: MessageReply, number: int, bill: CacheBill) -> dict[str, Any]:
        """The stand-in's answer; its usage is kept."""
        answer = super().message(body, reply, number, bill)
        usage = answer["usage"]
        read, write = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
        bill = {"prompt": usage["input_tokens"] + read + write, "read": read, "write": write}
        self.bills.append({**bill, "summary": self.summary_next})
        self.summary_next = False
        return answer


class BillingResponses(ScriptedResponses):
    """The Responses stand-in, keeping the usage it billed for every request."""

    def __init__(self, steps: int) -> None:
        super().__init__(self._script)
        self.steps = steps
        self.bills: list[dict[str, Any]] = []  # per request: prompt, read, write, and whether it was a summary
        self.summary_next = False

    def _script(self, body: dict[str, Any]) -> ResponseReply:
        items = body.get("input") or []
        head = _text(body.get("instructions")) + (_text(items[0].get("content")) if items else "")
        if SUMMARY_MARKER in head:
            self.summary_next = True
            return ResponseReply((Message(checkpoint_for(_text(items[-1].get("content")))),))
        outputs = [item for item in items if item.get("type") == "function_call_output"]
        step = _last_step(str(outputs[-1].get("output"))) if outputs else 0
        if step >= self.steps:
            return ResponseReply((Message("Done."),))
        return ResponseReply((FunctionCall("run_step", {"step": step + 1}),))

    def response(
        self, body: dict[str, Any], items: list[dict[str, Any]], reply: ResponseReply, number: int
    ) -> dict[str, Any]:
        """The stand-in's answer; its usage is kept."""
        answer = super().response(body, items, reply, number)
        usage = answer["usage"]
        cached = usage["input_tokens_details"]["cached_tokens"]
        self.bills.append({"prompt": usage["input_tokens"], "read": cached, "write": 0, "summary": self.summary_next})
        self.summary_next = False
        return answer


def _claude_code_marks(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Claude Code's marks: the last block of each of the two newest user messages."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"][-2:]
    marked = []
    for index, message in enumerate(messages):
        blocks = [dict(block) for block in message["content"]]
        if index in users:
            blocks[-1]["cache_control"] = MARK
        marked.append({**message, "content": blocks})
    return marked


def _anthropic_session(sdk: anthropic.Anthropic, model: str, steps: int) -> int:
    """The Claude Code-shaped session; returns its client calls."""
    tools = [{"name": "run_step", "description": "Run one step.", "input_schema": {"type": "object"}}]
    system = [{"type": "text", "text": SYSTEM_TEXT, "cache_control": MARK}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Run the protocol."}]}]
    for call in range(1, steps + 3):
        answer = sdk.messages.create(
            model=model,
            max_tokens=1_000,
            system=system,  # type: ignore[arg-type]
            messages=_claude_code_marks(messages),  # type: ignore[arg-type]
            tools=tools,  # type: ignore[arg-type]
            extra_headers={"x-session-id": "bench-caching"},
        )
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]})
        uses = [b for b in answer.content if b.type == "tool_use"]
        if not uses:
            return call
        results = [
            {"type": "tool_result", "tool_use_id": u.id, "content": tool_output(u.input["step"], OUTPUT_BYTES)}
            for u in uses
        ]
        messages.append({"role": "user", "content": results})
    raise RuntimeError("the Anthropic session did not finish")


def _responses_session(sdk: openai.OpenAI, model: str, steps: int) -> int:
    """The Agents SDK-shaped session (no ``prompt_cache_key``); returns its client calls."""
    tools = [{"type": "function", "name": "run_step", "parameters": {"type": "object", "properties": {}}}]
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Run the protocol."}]
    for call in range(1, steps + 3):
        answer = sdk.responses.create(
            model=model,
            instructions=SYSTEM_TEXT,
            input=items,  # type: ignore[arg-type]
            tools=tools,  # type: ignore[arg-type]
            store=False,
            extra_headers={"x-session-id": "bench-caching"},
        )
        items += [item.model_dump(exclude_none=True) for item in answer.output]
        calls = [item for item in answer.output if item.type == "function_call"]
        if not calls:
            return call
        for c in calls:
            output = tool_output(int(json.loads(c.arguments)["step"]), OUTPUT_BYTES)
            items.append({"type": "function_call_output", "call_id": c.call_id, "output": output})
    raise RuntimeError("the Responses session did not finish")


def _moving_mark(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chat client's moving mark (litellm's documented way to cache with Anthropic over Chat Completions):
    its messages' text is kept as content parts, and the newest message's last part carries ``cache_control``;
    the mark moves on with every turn."""
    *older, newest = messages
    parts = [dict(part) for part in newest["content"]]
    parts[-1]["cache_control"] = MARK
    return [*older, {**newest, "content": parts}]


def _chat_session(sdk: openai.OpenAI, model: str, steps: int) -> int:
    """A Chat Completions agent on an Anthropic model, its system prompt marked and a moving mark on its
    newest message; returns its client calls."""
    tools = [
        {
            "type": "function",
            "function": {"name": "run_step", "description": "Run one step.", "parameters": {"type": "object"}},
        }
    ]
    system = {"role": "system", "content": [{"type": "text", "text": SYSTEM_TEXT, "cache_control": MARK}]}
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Run the protocol."}]}]
    for call in range(1, steps + 3):
        answer = sdk.chat.completions.create(
            model=model,
            max_tokens=1_000,
            messages=[system, *_moving_mark(messages)],  # type: ignore[list-item]
            tools=tools,  # type: ignore[arg-type]
            extra_headers={"x-session-id": "bench-caching"},
        )
        message = answer.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return call
        for tool_call in message.tool_calls:
            step = int(json.loads(tool_call.function.arguments)["step"])  # type: ignore[union-attr]
            output = [{"type": "text", "text": tool_output(step, OUTPUT_BYTES)}]
            messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": output})
    raise RuntimeError("the chat session did not finish")


def summarize(bills: list[dict[str, Any]], write_price: float) -> dict[str, Any]:
    """One path's billed input: tokens read from the cache, written to it and uncached, and what they cost
    against the same tokens uncached (in input-price units)."""
    prompt = sum(b["prompt"] for b in bills)
    read = sum(b["read"] for b in bills)
    write = sum(b["write"] for b in bills)
    uncached = prompt - read - write
    cost = uncached + READ_PRICE * read + write_price * write
    return {
        "requests": len(bills),
        "prompt_tokens": prompt,
        "cache_read_tokens": read,
        "cache_write_tokens": write,
        "uncached_tokens": uncached,
        "cache_read_share": read / prompt if prompt else None,
        "input_cost": round(cost, 1),
        "caching_saves": 1 - cost / prompt if prompt else None,
    }


def _rules(
    stand_in: BillingAnthropic | BillingResponses,
    route: Callable[[str], ModelRoute],
    session: Callable[[str, bool], int],
    window: int,
    write_price: float,
) -> dict[str, Any]:
    """The session through the proxy, then straight to the provider; both paths' billed input."""
    with serve_in_thread(stand_in.app()) as url, tempfile.TemporaryDirectory(prefix="bench-caching-") as folder:
        settings = Settings(data_dir=Path(folder), models=(route(url),), trace_enabled=True)
        with serve_in_thread(create_app(settings)) as proxy:
            proxy_calls = session(proxy, True)
        compacted = _compacted_turns(settings.resolved_trace_dir)
        proxy_bills, stand_in.bills = stand_in.bills, []
        direct_calls = session(url, False)
        direct_bills = stand_in.bills
    through, passthrough = summarize(proxy_bills, write_price), summarize(direct_bills, write_price)
    return {
        "client_calls": {"proxy": proxy_calls, "passthrough": direct_calls},
        "proxy": through,
        "passthrough": passthrough,
        "proxy_vs_passthrough": through["input_cost"] / passthrough["input_cost"]
        if passthrough["input_cost"]
        else None,
        "uncompacted_read_share": _uncompacted_read_share(proxy_bills, compacted),
        # The same figure straight to the provider (it never compacts): what the session's own new tokens allow.
        "passthrough_read_share": _uncompacted_read_share(direct_bills, [False] * len(direct_bills)),
        "while_passthrough_fits": _while_fits(proxy_bills, direct_bills, window, write_price),
    }


def _compacted_turns(traces: Path) -> list[bool]:
    """Per model call of the client's (the proxy's traces in turn order): whether the proxy compacted on it
    (a body previewed for the first time, or a checkpoint written)."""
    records = sorted(
        (json.loads(path.read_text()) for path in traces.rglob("*.json")), key=lambda t: (t["turn"], t.get("round", 0))
    )
    return [bool(t["compaction"]["compactedRefs"] or t["compaction"]["summarizedMessages"]) for t in records]


def _uncompacted_read_share(bills: list[dict[str, Any]], compacted: list[bool]) -> dict[str, Any]:
    """Cache reads over prompt tokens, summed over the client's calls after its first on which the proxy did
    not compact (issue 38's goal: at least 90%)."""
    calls = [bill for bill in bills if not bill["summary"]]
    kept = [i for i, changed in enumerate(compacted[: len(calls)]) if i and not changed]
    prompt = sum(calls[i]["prompt"] for i in kept)
    read = sum(calls[i]["read"] for i in kept)
    # What those turns could have read at most: the whole prompt the call before them sent (their own new
    # messages, the tool output the agent just added, were never sent before).
    before = sum(calls[i - 1]["prompt"] for i in kept)
    return {
        "turns": len(kept),
        "share": read / prompt if prompt else None,
        "of_previous_prompt": read / before if before else None,
    }


def _while_fits(
    proxy_bills: list[dict[str, Any]], direct_bills: list[dict[str, Any]], window: int, write_price: float
) -> dict[str, Any]:
    """The proxy's input cost over the passthrough's on the client's calls where the passthrough still fit the
    window, the summarizer calls made meanwhile included (issue 38's goal: at most 1.05x)."""
    fits = next((i for i, bill in enumerate(direct_bills) if bill["prompt"] > window), len(direct_bills))
    through: list[dict[str, Any]] = []
    calls = 0
    for bill in proxy_bills:
        if calls == fits:
            break
        through.append(bill)
        calls += not bill["summary"]
    direct = summarize(direct_bills[:fits], write_price)["input_cost"]
    return {
        "client_calls": fits,
        "ratio": summarize(through, write_price)["input_cost"] / direct if direct else None,
    }


def run_caching(steps: int, window: int = WINDOW_TOKENS) -> dict[str, Any]:
    """Part 9's figures for ``steps`` agent steps at a ``window``-token window, under both providers' rules."""
    started = time.perf_counter()

    def anthropic_route(url: str) -> ModelRoute:
        params = {"model": "anthropic/claude-sonnet-4-5", "api_base": url, "api_key": ANTHROPIC_KEY}
        return ModelRoute("agent", params, max_input_tokens=window, max_output_tokens=4_000)

    def anthropic_session(base: str, through_proxy: bool) -> int:
        key, model = ("x", "agent") if through_proxy else (ANTHROPIC_KEY, "claude-sonnet-4-5")
        with anthropic.Anthropic(base_url=base, api_key=key, max_retries=0) as sdk:
            return _anthropic_session(sdk, model, steps)

    def responses_route(url: str) -> ModelRoute:
        params = {"model": "openai/gpt-5", "api_base": f"{url}/v1", "api_key": OPENAI_KEY}
        return ModelRoute("agent", params, max_input_tokens=window, max_output_tokens=4_000, configured_api="responses")

    def responses_session(base: str, through_proxy: bool) -> int:
        key, model = ("x", "agent") if through_proxy else (OPENAI_KEY, "gpt-5")
        with openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0) as sdk:
            return _responses_session(sdk, model, steps)

    def chat_route(url: str) -> ModelRoute:
        params = {"model": "anthropic/claude-sonnet-4-5", "api_base": url, "api_key": ANTHROPIC_KEY}
        return ModelRoute("agent", params, max_input_tokens=window, max_output_tokens=4_000, configured_api="chat")

    def chat_session(base: str, through_proxy: bool) -> int:
        if through_proxy:
            with openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0) as sdk:
                return _chat_session(sdk, "agent", steps)
        # A chat client cannot speak to Anthropic itself: its passthrough is the proxy in legacy mode, which
        # forwards what the client sent through litellm unchanged (what a plain litellm gateway does).
        with (
            tempfile.TemporaryDirectory(prefix="bench-caching-legacy-") as folder,
            serve_in_thread(
                create_app(Settings(data_dir=Path(folder), models=(chat_route(base),), mode="legacy"))
            ) as gateway,
            openai.OpenAI(base_url=f"{gateway}/v1", api_key="x", max_retries=0) as sdk,
        ):
            return _chat_session(sdk, "agent", steps)

    return {
        "steps": steps,
        "window_tokens": window,
        "tool_output_bytes": OUTPUT_BYTES,
        "rules": {
            "anthropic_messages": _rules(
                BillingAnthropic(steps), anthropic_route, anthropic_session, window, WRITE_PRICE
            ),
            "openai_responses": _rules(BillingResponses(steps), responses_route, responses_session, window, 1.0),
            "anthropic_chat": _rules(BillingAnthropic(steps), chat_route, chat_session, window, WRITE_PRICE),
        },
        "seconds": round(time.perf_counter() - started, 1),
    }


if __name__ == "__main__":
    import sys

    print(json.dumps(run_caching(int(sys.argv[1]) if len(sys.argv) > 1 else 100), indent=1))
