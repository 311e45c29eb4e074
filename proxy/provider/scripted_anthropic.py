"""A strict, scripted stand-in for Anthropic's Messages API, served over real HTTP on loopback.

Tests of native passage point the proxy at it: it refuses what the real API refuses (see
``scripted_anthropic_rules``), so a proxy that reshapes a request wrongly fails here as it would there.
``POST /v1/messages`` answers from a ``Script``, a function of the request body returning a
``MessageReply`` of content blocks; ``POST /v1/messages/count_tokens`` counts. Every request, refused or
not, is kept in ``requests`` (path, headers, body) and every Messages body in ``history``.

Thinking blocks are signed (``scripted_anthropic_signing``) and only sent when the request enables
thinking, as the real model only thinks then. Usage bills a prompt cache (``scripted_anthropic_cache``).
Ids are numbered per request and nothing depends on the clock, so runs are byte-identical.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from proxy.provider.received import Received, receive
from proxy.provider.scripted_anthropic_cache import CacheBill, PromptCache, count_input_tokens
from proxy.provider.scripted_anthropic_rules import Refusal, check_request, thinking_enabled
from proxy.provider.scripted_anthropic_signing import ThinkingSigner, tool_ids_after
from proxy.provider.scripted_anthropic_stream import message_events, sse

DEFAULT_API_KEY = "sk-ant-scripted"
DEFAULT_SECRET = b"scripted-anthropic-thinking-secret"


@dataclass(frozen=True)
class Text:
    """A text block, with ``citations`` as the API gives them (e.g. ``web_search_result_location`` dicts)."""

    text: str
    citations: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class ToolUse:
    """A call of one of the client's tools; ``id`` defaults to one numbered by request and position."""

    name: str
    input: dict[str, Any]
    id: str = ""


@dataclass(frozen=True)
class Thinking:
    """A thinking block; the stand-in signs it, and drops it when the request does not enable thinking."""

    thinking: str


@dataclass(frozen=True)
class RedactedThinking:
    """A redacted_thinking block; its ``data`` is issued by the stand-in from ``hidden``."""

    hidden: str = ""


@dataclass(frozen=True)
class SearchResult:
    """One web page a server-side web search found."""

    url: str
    title: str
    page_age: str | None = None


@dataclass(frozen=True)
class WebSearch:
    """A server-side web search: a ``server_tool_use`` block and its ``web_search_tool_result``."""

    query: str
    results: tuple[SearchResult, ...] = ()
    id: str = ""


Block = Text | ToolUse | Thinking | RedactedThinking | WebSearch


@dataclass(frozen=True)
class MessageReply:
    """One scripted answer: its content blocks and stop reason, or a provider error (status + body).

    ``stop_reason`` defaults to ``tool_use`` when the content calls a client tool, else ``end_turn``;
    ``output_tokens`` defaults to a quarter of the content's JSON bytes.
    """

    content: tuple[Block, ...] = ()
    stop_reason: str | None = None
    stop_sequence: str | None = None
    output_tokens: int | None = None
    error_status: int | None = None
    error_body: Any = None


Script = Callable[[dict[str, Any]], MessageReply]


class ScriptedAnthropic:
    """The stand-in's behaviour: a script, the key it expects, its signing secret, its prompt cache, its record."""

    def __init__(
        self,
        script: Script,
        *,
        api_key: str = DEFAULT_API_KEY,
        accept_bearer: bool = True,
        secret: bytes = DEFAULT_SECRET,
        min_cacheable_tokens: int = 1024,
    ) -> None:
        self.script = script
        self.api_key = api_key
        # The official SDK (2.x) sends an API key as ``Authorization: Bearer``; ``x-api-key`` is the older
        # header. Both are accepted unless ``accept_bearer`` is off; ``requests`` shows which one came.
        self.accept_bearer = accept_bearer
        self.signer = ThinkingSigner(secret)
        self.cache = PromptCache(min_cacheable_tokens)
        self.requests: list[Received] = []  # every request, to any route, refused or not
        self.history: list[dict[str, Any]] = []  # the body of every POST /v1/messages, in order
        self._lock = threading.Lock()

    def app(self) -> Starlette:
        """The ASGI app serving the Messages routes."""
        return Starlette(
            routes=[
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
            ]
        )

    async def _record(self, request: Request, *, counting: bool) -> tuple[Received, int, str | None]:
        """Keep the request; it, its number, and why its body is not JSON (None when it is)."""
        received, not_json = await receive(request)
        with self._lock:
            self.requests.append(received)
            if not counting:
                self.history.append(received.body)
            return received, len(self.requests), not_json

    def _check(self, received: Received, not_json: str | None, *, counting: bool) -> None:
        """Raise ``Refusal`` as the API would: credentials, version header, JSON, then the body's rules."""
        key = received.header("x-api-key")
        bearer = received.header("authorization") if self.accept_bearer else None
        if key is None and bearer is None:
            raise Refusal("x-api-key header is required", 401, "authentication_error")
        if key is not None and key != self.api_key:
            raise Refusal("invalid x-api-key", 401, "authentication_error")
        if key is None and bearer != f"Bearer {self.api_key}":
            raise Refusal("Invalid authentication credentials", 401, "authentication_error")
        if received.header("anthropic-version") is None:
            raise Refusal("anthropic-version: header is required")
        if not_json is not None:
            raise Refusal(f"The request body is not valid JSON: {not_json}")
        betas = frozenset(part.strip() for part in (received.header("anthropic-beta") or "").split(",") if part)
        check_request(received.body, self.signer, betas, counting=counting)

    async def _count_tokens(self, request: Request) -> Response:
        received, number, not_json = await self._record(request, counting=True)
        try:
            self._check(received, not_json, counting=True)
        except Refusal as refusal:
            return _refused(refusal, number)
        return JSONResponse({"input_tokens": count_input_tokens(received.body)}, headers=_request_id(number))

    async def _messages(self, request: Request) -> Response:
        received, number, not_json = await self._record(request, counting=False)
        try:
            self._check(received, not_json, counting=False)
        except Refusal as refusal:
            return _refused(refusal, number)
        body = received.body
        reply = self.script(body)
        if reply.error_status is not None:
            return JSONResponse(reply.error_body, status_code=reply.error_status, headers=_request_id(number))
        message = self.message(body, reply, number, self.cache.bill(body))
        if body.get("stream"):
            return StreamingResponse(_stream(message), media_type="text/event-stream", headers=_request_id(number))
        return JSONResponse(message, headers=_request_id(number))

    def message(self, body: dict[str, Any], reply: MessageReply, number: int, bill: CacheBill) -> dict[str, Any]:
        """The API's answer to ``body``: ``reply``'s blocks (thinking signed, or dropped) with usage."""
        content = self._content(reply.content, number, thinking_enabled(body))
        searches = sum(1 for block in content if block["type"] == "server_tool_use")
        usage: dict[str, Any] = {
            "input_tokens": bill.input_tokens,
            "cache_creation_input_tokens": bill.cache_creation_input_tokens,
            "cache_read_input_tokens": bill.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": bill.cache_creation_input_tokens if bill.ttl != "1h" else 0,
                "ephemeral_1h_input_tokens": bill.cache_creation_input_tokens if bill.ttl == "1h" else 0,
            },
            "output_tokens": reply.output_tokens or max(1, len(json.dumps(content)) // 4),
            "service_tier": "standard",
        }
        if searches:
            usage["server_tool_use"] = {"web_search_requests": searches, "web_fetch_requests": 0}
        calls = any(block["type"] == "tool_use" for block in content)
        return {
            "id": f"msg_scripted_{number}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", ""),
            "content": content,
            "stop_reason": reply.stop_reason or ("tool_use" if calls else "end_turn"),
            "stop_sequence": reply.stop_sequence,
            "usage": usage,
        }

    def _content(self, blocks: tuple[Block, ...], number: int, thinking: bool) -> list[dict[str, Any]]:
        content: list[dict[str, Any]] = []
        for position, block in enumerate(blocks):
            if isinstance(block, Text):
                content.append({"type": "text", "text": block.text, "citations": list(block.citations) or None})
            elif isinstance(block, ToolUse):
                call_id = block.id or f"toolu_scripted_{number}_{position}"
                content.append({"type": "tool_use", "id": call_id, "name": block.name, "input": block.input})
            elif isinstance(block, WebSearch):
                content += _web_search(block, block.id or f"srvtoolu_scripted_{number}_{position}")
            elif thinking and isinstance(block, Thinking):
                content.append({"type": "thinking", "thinking": block.thinking, "signature": ""})
            elif thinking and isinstance(block, RedactedThinking):
                content.append({"type": "redacted_thinking", "data": block.hidden})
        # Signed last: a signature binds the tool calls that follow its block, so their ids must be known.
        for index, item in enumerate(content):
            if item["type"] == "thinking":
                item["signature"] = self.signer.sign_thinking(item["thinking"], tool_ids_after(content, index))
            elif item["type"] == "redacted_thinking":
                item["data"] = self.signer.redacted_data(item["data"], tool_ids_after(content, index))
        return content


def _web_search(search: WebSearch, call_id: str) -> list[dict[str, Any]]:
    results = [
        {
            "type": "web_search_result",
            "url": result.url,
            "title": result.title,
            "encrypted_content": f"scripted-page:{result.url}",
            "page_age": result.page_age,
        }
        for result in search.results
    ]
    return [
        {"type": "server_tool_use", "id": call_id, "name": "web_search", "input": {"query": search.query}},
        {"type": "web_search_tool_result", "tool_use_id": call_id, "content": results},
    ]


def _request_id(number: int) -> dict[str, str]:
    return {"request-id": f"req_scripted_{number}"}


def _refused(refusal: Refusal, number: int) -> Response:
    return JSONResponse(refusal.body(f"req_scripted_{number}"), status_code=refusal.status, headers=_request_id(number))


def _stream(message: dict[str, Any]) -> Iterator[str]:
    for event, data in message_events(message):
        yield sse(event, data)
