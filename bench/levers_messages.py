"""The Messages edge's work on a resent Claude Code history (issue 42, part 3), as a lever of part 7.

``messages_resent_lever``: a body in Claude Code's order (model, then the whole conversation, then its
system prompt and tools) resending the previous call's messages with two new ones, on a route spoken to
in the Messages API (native passage, as Claude Code in front of Anthropic). Before: what the ingress did
with every body, the whole of it decoded, every message validated, translated with its native blocks
digested, the chat form validated again and digested for the chain memo. After: the ingress's own parse
(``proxy/ingress/messages/adapter._parse``), the previous call served first (outside the clock, its answer
followed by what follows every answer): the resent messages neither decoded (``edge/resent_requests.py``)
nor validated, translated or digested again (``ingress/messages/translations.py``).

Alone: ``.venv/bin/python -m bench.levers_messages``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from proxy.edge.request_body import decode_body
from proxy.edge.resent_requests import ResentRequests
from proxy.ingress.chat.wire import parse_chat_request
from proxy.ingress.messages.adapter import _parse
from proxy.ingress.messages.request import to_chat
from proxy.ingress.messages.translations import MessageTranslations
from proxy.ingress.messages.wire import parse_messages_request
from proxy.kernel.canonical import exact_digest
from proxy.kernel.config import ModelRoute

MESSAGES = 400  # 200 tool calls and their results: a long Claude Code session
ROUTE = ModelRoute("claude", {"model": "anthropic/claude-sonnet-4-5", "api_key": "k"}, configured_api="messages")
CAP = 100_000  # the default CONTEXT_PROXY_MAX_REQUEST_MESSAGES
RESULT = "src/module_{n}.py:{n}: the readings agree within 0.2 %; {n} rows were kept. " * 20


def claude_code_bodies(messages: int = MESSAGES) -> tuple[bytes, bytes]:
    """A Claude Code call over ``messages`` messages of tool loop, and the next call, which resends them
    with the answer and a new user message; both in Claude Code's field order."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    for n in range(messages // 2):
        call = {"type": "tool_use", "id": f"toolu_{n:04}", "name": "Bash", "input": {"command": f"pytest -k t{n}"}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{n:04}", "content": RESULT.format(n=n)}
        history += [
            {"role": "assistant", "content": [{"type": "text", "text": f"Running test {n}."}, call]},
            {"role": "user", "content": [result]},
        ]
    later = [*history, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Now commit."}]
    system = [{"type": "text", "text": "You are Claude Code. " * 400, "cache_control": {"type": "ephemeral"}}]
    tools = [
        {"name": f"Tool{n}", "description": "A tool. " * 40, "input_schema": {"type": "object"}} for n in range(24)
    ]

    def body(conversation: list[dict[str, Any]]) -> bytes:
        made = {"model": "claude", "messages": conversation, "system": system, "tools": tools, "max_tokens": 32_000}
        return json.dumps(made).encode()

    return body(history), body(later)


def messages_resent_lever(messages: int = MESSAGES, repeats: int = 15) -> dict[str, Any]:
    """Before and after, best of ``repeats`` each (see the module's docstring)."""
    previous, raw = claude_code_bodies(messages)

    def whole() -> None:
        body = decode_body(raw)
        translation = to_chat(parse_messages_request(body), body, ROUTE, {}, native=True)
        parse_chat_request(translation.body)
        [exact_digest(message) for message in translation.body["messages"]]  # the chain memo's own digests

    def remembered() -> float:
        resent, translations = ResentRequests(), MessageTranslations()
        _parse(
            previous, MESSAGES + 2, lambda model: ROUTE, {}, resent, translations
        )  # the previous call, outside the clock
        resent.make_spares()  # what follows its answer
        started = time.perf_counter()
        _parse(raw, CAP, lambda model: ROUTE, {}, resent, translations)
        return time.perf_counter() - started

    before = min(_timed(whole) for _ in range(repeats))
    after = min(remembered() for _ in range(repeats))
    return {
        "lever": "Messages: resent history decoded, validated and translated once",
        "before_ms": round(before * 1000, 3),
        "after_ms": round(after * 1000, 3),
        "what": f"best of {repeats}: the Messages edge's work on a resent {messages:,}-message Claude Code history "
        f"({len(raw) // 1024:,} KB, native route, 2 new messages): the whole body decoded, validated, translated "
        "and digested (before) against the resent messages taken from the previous call's (after)",
        "messages": messages,
    }


def _timed(work: Any) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


if __name__ == "__main__":
    print(json.dumps(messages_resent_lever(), indent=1))
