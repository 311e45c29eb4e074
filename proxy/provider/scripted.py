"""A scripted, deterministic OpenAI-compatible provider served over real HTTP on loopback.

It stands in for the LLM, and only for the LLM: the demo and the tests point litellm at it. Every
request body it receives is kept in ``history`` so callers can assert on exactly what the provider
got. Replies come from a ``Script``: a function of the request body, so a reply can depend on what
the model was shown (a tool result, a compacted preview). Ids and timestamps are fixed, which keeps
recorded cassettes byte-identical between runs.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from proxy.process.drain import KEEP_ALIVE_SECONDS
from proxy.process.offline import prepare_offline_environment

FIXED_CREATED = 1_700_000_000


@dataclass(frozen=True)
class ToolCall:
    """A tool call the scripted model makes."""

    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass(frozen=True)
class Reply:
    """One scripted answer: text, tool calls, or a provider error (status + body)."""

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    error_status: int | None = None
    error_body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    break_after: int | None = None  # a stream breaks off (connection cut) after this many chunks
    # Faults of a provider that answers 200 with something that is not an answer: ``body`` is sent as
    # the JSON answer (a stream request gets its items as SSE events, then [DONE]); ``cut_after`` closes
    # the connection after that many bytes of the answer, mid-body.
    body: Any = None
    cut_after: int | None = None


class BrokenStream(Exception):
    """Raised inside a scripted stream to cut the connection mid-body, as a crashing provider does."""


Script = Callable[[dict[str, Any]], Reply]


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """A deterministic stand-in for the provider's token count: a quarter of the messages' JSON bytes."""
    return max(1, len(json.dumps(body.get("messages", []), ensure_ascii=False).encode()) // 4)


def tiktoken_prompt_tokens(body: dict[str, Any], scale: float) -> int:
    """A provider whose tokenizer counts ``scale`` times ``o200k_base``: OpenAI's own chat framing
    (3 tokens a message, the role, the content, tool calls' names and arguments, 3 priming the reply,
    the tools' JSON), then scaled, as a provider with another vocabulary would count the same text."""
    import tiktoken  # only the scaled provider needs it

    prepare_offline_environment()  # the encodings bundled with litellm, never a download
    encoding = tiktoken.get_encoding("o200k_base")

    def count(text: Any) -> int:
        return len(encoding.encode(text if isinstance(text, str) else json.dumps(text), disallowed_special=()))

    total = 3
    for message in body.get("messages") or []:
        total += 3 + count(message.get("role", ""))
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        total += count(content or "")
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            total += 3 + count(function.get("name", "")) + count(function.get("arguments", ""))
        if message.get("tool_call_id"):
            total += count(message["tool_call_id"])
    if body.get("tools"):
        total += count(body["tools"])
    return max(1, math.ceil(total * scale))


class ScriptedProvider:
    """The provider's behaviour: a script, an optional context window, and the record of requests."""

    def __init__(
        self,
        script: Script,
        *,
        context_window: int | None = None,
        chunk_delay: float = 0.0,
        latency: float = 0.0,
        token_scale: float | None = None,
    ) -> None:
        self.script = script
        self.context_window = context_window
        # None: count a quarter of the messages' JSON bytes (what the cassettes were recorded with);
        # a number: count as a tokenizer that gives that many times tiktoken's o200k_base count.
        self.token_scale = token_scale
        self.prompt_tokens: list[int] = []  # the count of every request, in order (over the window or not)
        self.chunk_delay = chunk_delay  # seconds between stream chunks, to let a test disconnect mid-stream
        self.latency = latency  # seconds before every answer, like a real model's time to respond
        self.most_concurrent = 0  # the most requests ever waiting out ``latency`` at once
        self._waiting = 0
        self.history: list[dict[str, Any]] = []
        self.streams_finished = 0
        self.streams_abandoned = 0  # the caller went away before the last chunk
        self._lock = threading.Lock()

    def app(self) -> Starlette:
        """The ASGI app serving the OpenAI routes."""
        routes = [
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ]
        return Starlette(routes=routes)

    async def _models(self, request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": "scripted", "object": "model", "created": 0, "owned_by": "scripted"}]}
        )

    async def _read(self, request: Request) -> dict[str, Any]:
        """The request's JSON body (the bench's provider decodes it faster)."""
        body: dict[str, Any] = await request.json()
        return body

    def _count_prompt_tokens(self, body: dict[str, Any]) -> int:
        if self.token_scale is None:
            return estimate_prompt_tokens(body)
        return tiktoken_prompt_tokens(body, self.token_scale)

    async def _chat(self, request: Request) -> Response:
        body = await self._read(request)
        with self._lock:
            self.history.append(body)
            number = len(self.history)
        if self.latency:
            await self._respond_later()
        prompt_tokens = self._count_prompt_tokens(body)
        with self._lock:
            self.prompt_tokens.append(prompt_tokens)
        if self.context_window is not None and prompt_tokens > self.context_window:
            return JSONResponse(_overflow_body(self.context_window, prompt_tokens), status_code=400)
        reply = self.script(body)
        if reply.error_status is not None:
            return JSONResponse(reply.error_body, status_code=reply.error_status, headers=reply.headers)
        if reply.body is not None:
            return _raw_answer(reply.body, bool(body.get("stream")), reply.cut_after)
        completion_id = f"chatcmpl-scripted-{number}"
        message = _message(reply, number)
        completion_tokens = max(1, len(json.dumps(message)) // 4)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        finish = "tool_calls" if reply.tool_calls else "stop"
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            chunks = _stream_chunks(
                completion_id, body.get("model", ""), message, finish, usage if include_usage else None
            )
            return StreamingResponse(self._sse(chunks, reply.break_after), media_type="text/event-stream")
        return JSONResponse(
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": FIXED_CREATED,
                "model": body.get("model", ""),
                "system_fingerprint": None,
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": usage,
            }
        )

    async def _respond_later(self) -> None:
        # Asleep, not blocking: concurrent requests overlap as at a provider, and the overlap is counted.
        with self._lock:
            self._waiting += 1
            self.most_concurrent = max(self.most_concurrent, self._waiting)
        try:
            await asyncio.sleep(self.latency)
        finally:
            with self._lock:
                self._waiting -= 1

    async def _sse(self, chunks: Iterator[dict[str, Any]], break_after: int | None = None) -> AsyncIterator[str]:
        finished = False
        try:
            for number, item in enumerate(chunks):
                if number == break_after:
                    raise BrokenStream(f"scripted break after {number} chunks")
                yield f"data: {json.dumps(item)}\n\n"
                await asyncio.sleep(self.chunk_delay)
            yield "data: [DONE]\n\n"
            finished = True
        finally:
            with self._lock:
                if finished:
                    self.streams_finished += 1
                else:
                    self.streams_abandoned += 1


def _raw_answer(answer: Any, stream: bool, cut_after: int | None) -> Response:
    if stream:
        items = answer if isinstance(answer, list) else [answer]
        payload = "".join(f"data: {json.dumps(item)}\n\n" for item in items) + "data: [DONE]\n\n"
        media_type = "text/event-stream"
    else:
        payload, media_type = json.dumps(answer), "application/json"
    if cut_after is None:
        return Response(payload, media_type=media_type)

    async def cut() -> AsyncIterator[bytes]:
        yield payload.encode()[:cut_after]
        # Raising inside a chunked body makes the server drop the connection without its last chunk:
        # the client sees a body that broke off, as when a provider's process dies mid-answer.
        raise ConnectionAbortedError("scripted provider: answer cut mid-body")

    return StreamingResponse(cut(), media_type=media_type)


def _overflow_body(window: int, used: int) -> dict[str, Any]:
    return {
        "error": {
            "message": f"This model's maximum context length is {window} tokens. However, your messages resulted in "
            f"{used} tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def _message(reply: Reply, number: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id or f"call_{number}_{index}",
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments, sort_keys=True)},
            }
            for index, call in enumerate(reply.tool_calls)
        ]
    return message


def _stream_chunks(
    completion_id: str, model: str, message: dict[str, Any], finish: str, usage: dict[str, Any] | None
) -> Iterator[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": FIXED_CREATED,
            "model": model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
        }

    yield chunk({"role": "assistant", "content": "" if message.get("tool_calls") else None})
    content = message.get("content") or ""
    for start in range(0, len(content), 16):
        yield chunk({"content": content[start : start + 16]})
    for index, call in enumerate(message.get("tool_calls", [])):
        # The name arrives whole in one delta (agent SDKs keep only one fragment); arguments are split.
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""},
                    }
                ]
            }
        )
        arguments = call["function"]["arguments"]
        for start in range(0, len(arguments), 12):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[start : start + 12]}}]})
    yield chunk({}, finish)
    if usage is not None:
        yield {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": FIXED_CREATED,
            "model": model,
            "system_fingerprint": None,
            "choices": [],
            "usage": usage,
        }


def free_port() -> int:
    """A TCP port on loopback that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve_in_thread(app: Any, port: int | None = None, *, lifespan: Literal["on", "off"] = "on") -> Iterator[str]:
    """Serve an ASGI app with uvicorn on 127.0.0.1 in a background thread; yields its base URL.

    ``lifespan="off"`` serves an app that never starts: how a test sees what a request meets before
    start-up has finished (uvicorn itself accepts connections only after it).
    """
    port = port or free_port()
    # The stdlib loop: a server in a helper thread is stopped and its loop closed from outside, which
    # uvloop reports as errors on transports it still holds.
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan=lifespan,
        loop="asyncio",
        # Like a real provider (and the proxy's own server), idle connections outlive client pools (5-15 s):
        # with uvicorn's 5 s, a loaded machine's late call met a connection the server had just closed.
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"server on port {port} failed to start")
        threading.Event().wait(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
