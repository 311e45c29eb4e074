"""The Responses ingress: ``POST /v1/responses`` (and ``/compact``), ``GET /v1/responses/{id}``.

The request is translated to the canonical chat body (``request.py``) and served by the turn service
through the front door, like ``/v1/chat/completions``; the answer is translated back (``output.py``,
``stream.py``). A compaction (Codex's ``compaction_trigger``, or ``POST /v1/responses/compact``) is the
turn service's ``compact``: the proxy's own checkpoint, answered as one ``compaction`` item. Errors keep
OpenAI's shape, in a stream ``response.failed``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from proxy.edge.answering import answering
from proxy.ingress.front_door import FrontDoor, context_headers, naming_session
from proxy.ingress.responses.native import native_request
from proxy.ingress.responses.output import (
    assistant_message,
    completion_status,
    new_id,
    output_items,
    response_object,
    usage_of,
)
from proxy.ingress.responses.records import ResponseRecord, ResponseRecords, new_response_id
from proxy.ingress.responses.request import (
    COMPACTION_TRIGGER,
    ResponsesRequest,
    build_chat_body,
    input_items,
    parse_responses_request,
    translate_input,
    translate_tools,
)
from proxy.ingress.responses.stream import ResponseStream, native_events
from proxy.kernel.config import ModelRoute
from proxy.kernel.errors import InvalidRequest, ProxyError
from proxy.kernel.jsonio import JSONAnswer, dumps
from proxy.kernel.tenancy import Principal
from proxy.runtime import issued_checkpoints
from proxy.runtime.answers import Completion, TurnResult
from proxy.runtime.issued_checkpoints import IssuedCheckpoint
from proxy.runtime.native import NativeRequest
from proxy.runtime.remote_compaction import CompactionRequest
from proxy.runtime.service import TurnService
from proxy.runtime.session_identity import SessionIdentity


class PreviousResponseNotFound(ProxyError):
    """``previous_response_id`` names no stored response (unknown, or created with ``store: false``)."""

    status = 404
    type = "invalid_request_error"
    code = "previous_response_not_found"


class ResponsesIngress:
    """Serves the Responses API through the front door."""

    def __init__(self, front: FrontDoor) -> None:
        self._front = front

    def routes(self) -> list[Route]:
        """The ingress's routes, each answering its errors in OpenAI's shape."""
        create, retrieve = answering(self.create), answering(self.retrieve)
        return [
            Route("/v1/responses", create, methods=["POST"]),
            Route("/responses", create, methods=["POST"]),
            Route("/v1/responses/compact", create, methods=["POST"]),
            Route("/responses/compact", create, methods=["POST"]),
            Route("/v1/responses/{response_id}", retrieve, methods=["GET"]),
            Route("/responses/{response_id}", retrieve, methods=["GET"]),
        ]

    async def create(self, http: Request) -> Response:
        """``POST /v1/responses``, and ``POST /v1/responses/compact``."""
        front = self._front
        principal = await front.authorize(http)
        body = await front.reader.json(http)
        mode = front.mode(http)
        request = parse_responses_request(body)
        route = front.route(request.model, principal)
        service = front.service
        records = ResponseRecords(service.store)
        items = input_items(request)
        triggers = [
            i for i, item in enumerate(items) if isinstance(item, dict) and item.get("type") == COMPACTION_TRIGGER
        ]
        if triggers and triggers != [len(items) - 1]:
            raise InvalidRequest("compaction_trigger must be the last input item.", param=f"input.{triggers[0]}")
        compact_endpoint = http.url.path.endswith("/compact") and not triggers
        items = items[: triggers[0]] if triggers else items
        tools = translate_tools(request.tools or [])
        # Another team's compaction token is one this proxy did not issue, as far as this key can tell.
        tokens = [t for t in _compaction_tokens(items) if _not_another_teams(t, principal)]
        checkpoints = await service.issued_checkpoints(tokens)
        native = route.api == "responses"  # the client speaks its route's own API: native passage
        in_place = {token: issued.message for token, issued in checkpoints.items()}
        translated = translate_input(items, tools, in_place, native=native)
        previous = await self._previous(records, request, principal)
        history = [] if previous is None else await _chain(service, previous)
        messages = ([{"role": "system", "content": request.instructions}] if request.instructions else []) + history
        messages += translated.messages
        if not messages:
            raise InvalidRequest("input is empty: send at least one message.", param="input")
        chat = build_chat_body(request, messages, translated, tools)
        identity = front.identify(http.headers, {**chat.body, "prompt_cache_key": request.prompt_cache_key}, principal)
        if previous is not None and identity.source == "fingerprint":
            identity = SessionIdentity(previous.context_id, "body:previous_response_id", identity.scope)
        front.admit(principal)
        if compact_endpoint or triggers:
            last = list(checkpoints.values())[-1] if checkpoints else None
            with naming_session(identity, mode):
                return await self._compact(
                    service, request, route, identity, messages, last, http, compact_endpoint=compact_endpoint
                )
        passage = native_request(body, route, chat.tools, chat.notes) if native else None
        result = await front.run(chat.body, identity, route, http.headers, mode, ingress=chat.notes, native=passage)
        response_id = new_response_id(identity.context_id)
        remember = _remembering(service, records, request, identity, chat.body["messages"], response_id)
        if passage is not None:
            return await _native_answer(result, response_id, passage, remember)
        if not isinstance(result.answer, Completion):
            stream = ResponseStream(response_id, request, chat.tools, remember)
            return StreamingResponse(
                _sse(stream.events(result.answer)), media_type="text/event-stream", headers=result.headers
            )
        completion = result.answer.response
        choice = (completion.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        status, reason = completion_status(choice.get("finish_reason"))
        response = response_object(
            response_id,
            request,
            status=status,
            output=output_items(message, chat.tools),
            usage=usage_of(completion.get("usage")),
            incomplete_reason=reason,
        )
        await remember(response, message)
        return JSONAnswer(response, headers=result.headers)

    async def retrieve(self, http: Request) -> Response:
        """``GET /v1/responses/{id}``: a stored response (never one created with ``store: false``)."""
        principal = await self._front.authorize(http)
        response_id = http.path_params["response_id"]
        record = await ResponseRecords(self._front.service.store).get(response_id)
        if record is None or not principal.owns(record.context_id):  # another team's: not found
            raise ProxyError(
                f"No response with id {response_id!r} is stored (responses created with store: false are not).",
                status=404,
                type="invalid_request_error",
                code="response_not_found",
                param="response_id",
            )
        return JSONAnswer(record.response, headers={"x-context-id": record.context_id})

    async def _previous(
        self, records: ResponseRecords, request: ResponsesRequest, principal: Principal
    ) -> ResponseRecord | None:
        if request.previous_response_id is None:
            return None
        record = await records.get(request.previous_response_id)
        if record is None or not principal.owns(record.context_id):  # another team's: not found
            raise PreviousResponseNotFound(
                f"Previous response with id {request.previous_response_id!r} not found "
                "(unknown, or created with store: false).",
                param="previous_response_id",
            )
        return record

    async def _compact(
        self,
        service: TurnService,
        request: ResponsesRequest,
        route: ModelRoute,
        identity: SessionIdentity,
        messages: list[dict[str, Any]],
        previous: IssuedCheckpoint | None,
        http: Request,
        *,
        compact_endpoint: bool,
    ) -> Response:
        """Answer a compaction with exactly one ``compaction`` item naming the proxy's new checkpoint."""
        kind = "responses/compact" if compact_endpoint else "compaction_trigger"
        compaction = CompactionRequest(
            identity, route, messages, previous.checkpoint if previous else None, kind, http.headers
        )
        result = await service.compact(compaction)
        item = {"type": "compaction", "id": new_id("cmp"), "encrypted_content": result.token}
        output: list[dict[str, Any]] = [item]
        if compact_endpoint:  # v1 replaces the client's whole history with the output: keep its user messages
            output = [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": m["content"]}]}
                for m in messages
                if m["role"] == "user"
                and isinstance(m.get("content"), str)
                and not m["content"].startswith("<checkpoint")
            ] + [item]
        usage = usage_of({"prompt_tokens": result.checkpoint_tokens, "completion_tokens": 0})
        response = response_object(
            new_response_id(identity.context_id), request, status="completed", output=output, usage=usage
        )
        headers = context_headers(identity, "dynamic")
        if compact_endpoint or not request.stream:
            if compact_endpoint:
                response["object"] = "response.compaction"
            return JSONAnswer(response, headers=headers)
        return StreamingResponse(_sse(_compaction_events(response)), media_type="text/event-stream", headers=headers)


async def _native_answer(
    result: TurnResult, response_id: str, passage: NativeRequest, remember: Callable[..., Any]
) -> Response:
    """The provider's own response (or events) with the proxy's response id, remembered like any other."""
    answer = result.answer
    if isinstance(answer, Completion) and answer.native is not None:
        response = {**answer.native, "id": response_id}
        await remember(response, answer.message)
        return JSONAnswer(response, headers=result.headers)
    assert not isinstance(answer, Completion)  # a native call's whole answer always carries the provider's own
    events = native_events(answer, response_id, passage.codec, remember)
    return StreamingResponse(_sse(events), media_type="text/event-stream", headers=result.headers)


async def _chain(service: TurnService, previous: ResponseRecord) -> list[dict[str, Any]]:
    """The stored chain a previous response ended, without its instructions (they are not inherited)."""
    stored = await service.store.transcript(previous.context_id, previous.head_hash)
    messages = [dict(item.message) for item in stored]
    return messages[1:] if previous.has_instructions else messages


def _remembering(
    service: TurnService,
    records: ResponseRecords,
    request: ResponsesRequest,
    identity: SessionIdentity,
    messages: list[dict[str, Any]],
    response_id: str,
) -> Callable[[dict[str, Any], dict[str, Any]], Any]:
    async def remember(response: dict[str, Any], message: dict[str, Any]) -> None:
        """Store the answer after the request's chain and the response under its id (unless store: false)."""
        if request.store is False:
            return
        head = await service.record_answer(identity, [*messages, assistant_message(message)])
        await records.put(response_id, ResponseRecord(identity.context_id, head, bool(request.instructions), response))

    return remember


def _not_another_teams(token: str, principal: Principal) -> bool:
    """Is ``token`` not another team's compaction token? One that is no token of ours passes (the service
    leaves out what it did not issue)."""
    try:
        return principal.owns(issued_checkpoints.token_context(token))
    except ValueError:
        return True


def _compaction_tokens(items: list[dict[str, Any]]) -> list[str]:
    """The tokens of the ``compaction`` items among ``items``, in order."""
    return [
        item["encrypted_content"]
        for item in items
        if isinstance(item, dict)
        and item.get("type") == "compaction"
        and isinstance(item.get("encrypted_content"), str)
    ]


async def _compaction_events(response: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    start = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
    ]
    for index, item in enumerate(response["output"]):
        events.append({"type": "response.output_item.added", "output_index": index, "item": item})
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": response})
    for number, event in enumerate(events):
        yield {**event, "sequence_number": number}


async def _sse(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """Each event as ``event: <type>`` + ``data: <json>`` (no ``[DONE]``: the Responses API has none)."""
    async for event in events:
        yield b"event: " + str(event["type"]).encode() + b"\ndata: " + dumps(event) + b"\n\n"
