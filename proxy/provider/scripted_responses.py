"""A strict, scripted stand-in for OpenAI's Responses API, served over real HTTP on loopback.

Tests of native passage point the proxy at it: it refuses what the real API refuses (see
``scripted_responses_rules``). ``POST /v1/responses`` answers from a ``Script``, a function of the
request body returning a ``ResponseReply`` of output items. Every request, refused or not, is kept in
``requests`` (path, headers, body) and every body in ``history``; ``body.get("store") is False`` tells
a test the client asked not to store.

A response is stored unless the request says ``store: false``; ``previous_response_id`` then brings the
stored input and output in before the request's input (``conversation`` gives a script that whole
list), and names a response that was not stored with a 400. Reasoning items carry ``encrypted_content``
sealed by the stand-in (``scripted_responses_sealing``) when ``include`` asks for it, and their summary
only when ``reasoning.summary`` asks for one. Usage reports an automatic prompt cache
(``scripted_responses_cache``). Ids are numbered per request and nothing depends on the clock.
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
from proxy.provider.scripted_responses_cache import AutomaticCache, prompt_bytes
from proxy.provider.scripted_responses_rules import ResponsesRefusal, check_input, check_parameters
from proxy.provider.scripted_responses_sealing import Following, ReasoningSealer
from proxy.provider.scripted_responses_stream import response_events, sse

DEFAULT_API_KEY = "sk-scripted-responses"
DEFAULT_SECRET = b"scripted-responses-reasoning-secret"
FIXED_CREATED = 1_700_000_000
ENCRYPTED_REASONING = "reasoning.encrypted_content"


@dataclass(frozen=True)
class Reasoning:
    """A reasoning item; its summary is sent only when the request asks for one."""

    summary: tuple[str, ...] = ()
    id: str = ""


@dataclass(frozen=True)
class Message:
    """An assistant message of one ``output_text`` part, with ``annotations`` as the API gives them."""

    text: str
    annotations: tuple[dict[str, Any], ...] = ()
    id: str = ""


@dataclass(frozen=True)
class FunctionCall:
    """A call of one of the client's function tools; ``arguments`` a dict (sent as JSON) or a string."""

    name: str
    arguments: dict[str, Any] | str
    call_id: str = ""
    id: str = ""


@dataclass(frozen=True)
class CustomToolCall:
    """A call of one of the client's custom (free-form input) tools."""

    name: str
    input: str
    call_id: str = ""
    id: str = ""


@dataclass(frozen=True)
class WebSearchCall:
    """A hosted web search the model ran."""

    query: str
    id: str = ""


Item = Reasoning | Message | FunctionCall | CustomToolCall | WebSearchCall


@dataclass(frozen=True)
class ResponseReply:
    """One scripted answer: output items and status, or a provider error (status + body).

    ``incomplete_reason`` is reported when ``status`` is ``incomplete``; token counts default to ones
    derived from the items' JSON.
    """

    output: tuple[Item, ...] = ()
    status: str = "completed"
    incomplete_reason: str = "max_output_tokens"
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    error_status: int | None = None
    error_body: Any = None


Script = Callable[[dict[str, Any]], ResponseReply]


@dataclass(frozen=True)
class Stored:
    """A stored response: the input it was given (its predecessors' first) and its output."""

    items: list[dict[str, Any]]
    output: list[dict[str, Any]]


class ScriptedResponses:
    """The stand-in's behaviour: a script, the key it expects, its sealing secret, its store, cache and record."""

    def __init__(self, script: Script, *, api_key: str = DEFAULT_API_KEY, secret: bytes = DEFAULT_SECRET) -> None:
        self.script = script
        self.api_key = api_key
        self.sealer = ReasoningSealer(secret)
        self.cache = AutomaticCache()
        self.requests: list[Received] = []  # every request, refused or not
        self.history: list[dict[str, Any]] = []  # every request's body, in order
        self.stored: dict[str, Stored] = {}  # response id -> what was stored (store not false)
        self._items: dict[str, tuple[dict[str, Any], Following]] = {}  # stored output items by id
        self._lock = threading.Lock()

    def app(self) -> Starlette:
        """The ASGI app serving the Responses route."""
        return Starlette(routes=[Route("/v1/responses", self._responses, methods=["POST"])])

    def conversation(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The input items a request amounts to: its previous responses' input and output, then its own."""
        earlier, given = self._input(body)
        return earlier + given

    def _input(self, body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any]]:
        """What ``previous_response_id`` brings in, and the request's own input items."""
        previous = body.get("previous_response_id")
        earlier: list[dict[str, Any]] = []
        if previous is not None:
            stored = self.stored.get(previous)
            if stored is None:
                raise ResponsesRefusal(
                    f"Previous response with id '{previous}' not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            earlier = stored.items + stored.output
        given = body.get("input", [])
        return earlier, [{"role": "user", "content": given}] if isinstance(given, str) else list(given)

    def _check(self, received: Received, not_json: str | None) -> list[dict[str, Any]]:
        """Raise ``ResponsesRefusal`` as the API would; the request's whole input when it passes."""
        authorization = received.header("authorization")
        if not authorization:
            raise ResponsesRefusal(
                "You didn't provide an API key. You need to provide your API key in an Authorization header using "
                "Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the password field (with blank username) "
                "if you're accessing the API from your browser and are prompted for a username and password. You "
                "can obtain an API key from https://platform.openai.com/account/api-keys.",
                status=401,
            )
        if authorization != f"Bearer {self.api_key}":
            key = authorization.removeprefix("Bearer ")
            masked = f"{key[:3]}{'*' * max(0, len(key) - 7)}{key[-4:]}" if len(key) > 7 else "***"
            raise ResponsesRefusal(
                f"Incorrect API key provided: {masked}. You can find your API key at "
                "https://platform.openai.com/account/api-keys.",
                status=401,
                code="invalid_api_key",
            )
        if not_json is not None:
            raise ResponsesRefusal(
                "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your "
                "HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON. "
                "If you have trouble figuring out how to fix this, please contact us through our help center at "
                "help.openai.com.)"
            )
        check_parameters(received.body)
        earlier, given = self._input(received.body)
        check_input(given, earlier, self.sealer, self._items)
        return earlier + given

    async def _responses(self, request: Request) -> Response:
        received, not_json = await receive(request)
        with self._lock:
            self.requests.append(received)
            self.history.append(received.body)
            number = len(self.requests)
        try:
            items = self._check(received, not_json)
        except ResponsesRefusal as refusal:
            return JSONResponse(refusal.body(), status_code=refusal.status)
        body = received.body
        reply = self.script(body)
        if reply.error_status is not None:
            return JSONResponse(reply.error_body, status_code=reply.error_status)
        response = self.response(body, items, reply, number)
        if body.get("store", True) is not False:
            with self._lock:
                self.stored[response["id"]] = Stored(items, response["output"])
                self._items.update(_by_id(items))
                self._items.update(_by_id(response["output"]))
        if body.get("stream"):
            return StreamingResponse(_stream(response), media_type="text/event-stream")
        return JSONResponse(response)

    def response(
        self, body: dict[str, Any], items: list[dict[str, Any]], reply: ResponseReply, number: int
    ) -> dict[str, Any]:
        """The API's answer to ``body`` (whose whole input is ``items``): ``reply``'s output, with usage."""
        output = self._output(body, reply.output, number)
        prompt = prompt_bytes(body, items)
        input_tokens = max(1, len(prompt) // 4)
        cached = self.cache.cached_tokens(str(body.get("model")), body.get("prompt_cache_key"), prompt)
        reasoning = reply.reasoning_tokens
        if reasoning is None:
            reasoning = sum(
                16 + len(" ".join(item.summary)) // 4 for item in reply.output if isinstance(item, Reasoning)
            )
        visible = max(1, len(json.dumps([item for item in output if item["type"] != "reasoning"])) // 4)
        output_tokens = reply.output_tokens or reasoning + visible
        settings = body.get("reasoning") or {}
        return {
            "id": f"resp_scripted_{number}",
            "object": "response",
            "created_at": FIXED_CREATED,
            "completed_at": FIXED_CREATED if reply.status == "completed" else None,
            "status": reply.status,
            "background": False,
            "error": None,
            "incomplete_details": {"reason": reply.incomplete_reason} if reply.status == "incomplete" else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": body.get("max_tool_calls"),
            "metadata": body.get("metadata") or {},
            "model": body.get("model"),
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "prompt_cache_key": body.get("prompt_cache_key"),
            "reasoning": {"effort": settings.get("effort", "medium"), "summary": settings.get("summary")},
            "safety_identifier": body.get("safety_identifier"),
            "service_tier": body.get("service_tier") or "default",
            "store": body.get("store", True) is not False,
            "temperature": body.get("temperature", 1.0),
            "text": body.get("text") or {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_logprobs": body.get("top_logprobs", 0),
            "top_p": body.get("top_p", 1.0),
            "truncation": body.get("truncation", "disabled"),
            "usage": {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": reasoning},
                "total_tokens": input_tokens + output_tokens,
            },
            "user": body.get("user"),
        }

    def _output(self, body: dict[str, Any], items: tuple[Item, ...], number: int) -> list[dict[str, Any]]:
        output: list[dict[str, Any]] = []
        for position, item in enumerate(items):
            name = f"{number}_{position}"
            if isinstance(item, Reasoning):
                output.append(
                    {"id": item.id or f"rs_scripted_{name}", "type": "reasoning", "summary": list(item.summary)}
                )
            elif isinstance(item, Message):
                text = {"type": "output_text", "text": item.text, "annotations": list(item.annotations), "logprobs": []}
                output.append(
                    {
                        "id": item.id or f"msg_scripted_{name}",
                        "type": "message",
                        "status": "completed",
                        "role": "assistant",
                        "content": [text],
                    }
                )
            elif isinstance(item, FunctionCall):
                arguments = item.arguments if isinstance(item.arguments, str) else json.dumps(item.arguments)
                output.append(
                    {
                        "id": item.id or f"fc_scripted_{name}",
                        "type": "function_call",
                        "status": "completed",
                        "call_id": item.call_id or f"call_scripted_{name}",
                        "name": item.name,
                        "arguments": arguments,
                    }
                )
            elif isinstance(item, CustomToolCall):
                output.append(
                    {
                        "id": item.id or f"ctc_scripted_{name}",
                        "type": "custom_tool_call",
                        "call_id": item.call_id or f"call_scripted_{name}",
                        "name": item.name,
                        "input": item.input,
                    }
                )
            else:
                action = {"type": "search", "query": item.query}
                output.append(
                    {
                        "id": item.id or f"ws_scripted_{name}",
                        "type": "web_search_call",
                        "status": "completed",
                        "action": action,
                    }
                )
        settings = body.get("reasoning") or {}
        include = body.get("include") or []
        for index, entry in enumerate(output):
            if entry["type"] != "reasoning":
                continue
            texts = entry["summary"] if settings.get("summary") else []
            entry["summary"] = [{"type": "summary_text", "text": text} for text in texts]
            if ENCRYPTED_REASONING in include:
                after = output[index + 1] if index + 1 < len(output) else None
                following: Following = (after.get("id"), after.get("call_id")) if after else None
                entry["encrypted_content"] = self.sealer.seal(entry["id"], texts, following)
        return output


def _by_id(items: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], Following]]:
    """The items that have an id, by id; a reasoning item with the item that followed it."""
    found: dict[str, tuple[dict[str, Any], Following]] = {}
    for index, item in enumerate(items):
        if "id" not in item:
            continue
        after = items[index + 1] if index + 1 < len(items) else None
        reasoning = item.get("type") == "reasoning" and after is not None
        following: Following = (after.get("id"), after.get("call_id")) if reasoning and after else None
        found[item["id"]] = (item, following)
    return found


def _stream(response: dict[str, Any]) -> Iterator[str]:
    for event in response_events(response):
        yield sse(event)
