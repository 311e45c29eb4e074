"""The Responses API routes' work: ``POST /v1/responses`` (and ``/compact``), ``GET /v1/responses/{id}``.

The request is translated to the canonical chat body (``responses.py``) and served by the same
``TurnRunner`` as ``/v1/chat/completions``; the answer is translated back (``responses_output.py``,
``responses_stream.py``). Errors keep OpenAI's shape (the app's one renderer), in a stream
``response.failed``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from starlette.responses import Response, StreamingResponse

from proxy.context.checkpoint import Checkpoint
from proxy.ingress.identify import SessionIdentity, identify
from proxy.ingress.responses.output import (
    assistant_message,
    completion_status,
    new_id,
    output_items,
    response_object,
    usage_of,
)
from proxy.ingress.responses.records import ResponseRecord, ResponseRecords, new_response_id, token_context
from proxy.ingress.responses.request import (
    COMPACTION_TRIGGER,
    ResponsesRequest,
    build_chat_body,
    input_items,
    parse_responses_request,
    translate_input,
    translate_tools,
)
from proxy.ingress.responses.stream import ResponseStream
from proxy.kernel.config import Mode, ModelRoute, Settings
from proxy.kernel.errors import InvalidRequest, ModelNotFound, ProxyError, SessionConflict
from proxy.kernel.jsonio import JSONAnswer, dumps
from proxy.runtime.answers import Completion
from proxy.runtime.compaction_trace import compaction_trace
from proxy.runtime.remote_compaction import write_checkpoint
from proxy.runtime.service import TurnRunner
from proxy.session.store import SessionBusy


class PreviousResponseNotFound(ProxyError):
    """``previous_response_id`` names no stored response (unknown, or created with ``store: false``)."""

    status = 404
    type = "invalid_request_error"
    code = "previous_response_not_found"


class ResponsesIngress:
    """Serves the Responses API over the app's runner.

    ``runner`` returns it once the app has started, and before that raises the app's 503 "starting"
    error (``Services.ready_runner``), asked only when a request has got as far as needing it.
    """

    def __init__(self, settings: Settings, runner: Callable[[], TurnRunner]) -> None:
        self._settings = settings
        self._ready = runner

    async def create(self, body: Any, headers: Mapping[str, str], mode: Mode, *, compact: bool = False) -> Response:
        """``POST /v1/responses``; ``compact`` for ``POST /v1/responses/compact``."""
        request = parse_responses_request(body)
        route = self._settings.route(request.model)
        if route is None:
            raise ModelNotFound(
                f"The model {request.model!r} does not exist or you do not have access to it.", param="model"
            )
        runner = self._ready()
        records = ResponseRecords(runner.store)
        items = input_items(request)
        triggers = [
            i for i, item in enumerate(items) if isinstance(item, dict) and item.get("type") == COMPACTION_TRIGGER
        ]
        if triggers and triggers != [len(items) - 1]:
            raise InvalidRequest("compaction_trigger must be the last input item.", param=f"input.{triggers[0]}")
        compact = compact or bool(triggers)
        items = items[: triggers[0]] if triggers else items
        tools = translate_tools(request.tools or [])
        checkpoints = await _issued_checkpoints(records, items)
        in_place = {token: cp.message(runner.framing_nonce(token_context(token))) for token, cp in checkpoints.items()}
        translated = translate_input(items, tools, in_place)
        previous = await self._previous(records, request)
        history = [] if previous is None else await self._chain(runner, previous)
        messages = ([{"role": "system", "content": request.instructions}] if request.instructions else []) + history
        messages += translated.messages
        if not messages:
            raise InvalidRequest("input is empty: send at least one message.", param="input")
        chat = build_chat_body(request, messages, translated, tools)
        identity = identify(headers, {**chat.body, "prompt_cache_key": request.prompt_cache_key})
        if previous is not None and identity.source == "fingerprint":
            identity = SessionIdentity(previous.context_id, "body:previous_response_id", identity.scope)
        context = {"x-context-id": identity.context_id, "x-context-mode": mode}
        try:
            if compact:
                last = list(checkpoints.values())[-1] if checkpoints else None
                return await self._compact(
                    runner, request, route, identity, messages, last, compact_endpoint=not triggers
                )
            result = await runner.run(chat.body, identity, route, headers, mode, ingress=chat.notes)
        except ProxyError as exc:
            exc.headers.update(context)
            raise
        response_id = new_response_id(identity.context_id)
        remember = self._remembering(runner, records, request, identity, chat.body["messages"], response_id)
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

    async def retrieve(self, response_id: str) -> Response:
        """``GET /v1/responses/{id}``: a stored response (never one created with ``store: false``)."""
        record = await ResponseRecords(self._ready().store).get(response_id)
        if record is None:
            raise ProxyError(
                f"No response with id {response_id!r} is stored (responses created with store: false are not).",
                status=404,
                type="invalid_request_error",
                code="response_not_found",
                param="response_id",
            )
        return JSONAnswer(record.response, headers={"x-context-id": record.context_id})

    async def _previous(self, records: ResponseRecords, request: ResponsesRequest) -> ResponseRecord | None:
        if request.previous_response_id is None:
            return None
        record = await records.get(request.previous_response_id)
        if record is None:
            raise PreviousResponseNotFound(
                f"Previous response with id {request.previous_response_id!r} not found "
                "(unknown, or created with store: false).",
                param="previous_response_id",
            )
        return record

    async def _chain(self, runner: TurnRunner, previous: ResponseRecord) -> list[dict[str, Any]]:
        """The stored chain a previous response ended, without its instructions (they are not inherited)."""
        stored = await runner.store.transcript(previous.context_id, previous.head_hash)
        messages = [dict(item.message) for item in stored]
        return messages[1:] if previous.has_instructions else messages

    def _remembering(
        self,
        runner: TurnRunner,
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
            try:
                async with runner.store.turn_lock(identity.context_id):
                    chain = [*messages, assistant_message(message)]
                    reconciled = await runner.store.reconcile(identity.context_id, identity.scope, chain)
                    record = ResponseRecord(
                        identity.context_id, reconciled.head_hash, bool(request.instructions), response
                    )
                    await records.put(response_id, record)
            except SessionBusy as exc:
                raise SessionConflict(str(exc)) from exc

        return remember

    async def _compact(
        self,
        runner: TurnRunner,
        request: ResponsesRequest,
        route: ModelRoute,
        identity: SessionIdentity,
        messages: list[dict[str, Any]],
        previous: Checkpoint | None,
        *,
        compact_endpoint: bool,
    ) -> Response:
        """Answer a compaction with exactly one ``compaction`` item naming the proxy's new checkpoint."""
        summary_route = (
            self._settings.route(self._settings.summary_model) if self._settings.summary_model else None
        ) or route
        limit = runner.limits_for(route).effective_input_tokens
        try:
            async with runner.store.turn_lock(identity.context_id):
                reconciled = await runner.store.reconcile(identity.context_id, identity.scope, messages)
                outcome = await write_checkpoint(
                    runner.backend,
                    summary_route,
                    messages,
                    previous,
                    reconciled.head_hash,
                    max(256, limit // 10),
                    runner.framing_nonce(identity.context_id),
                    runner.limits_for(summary_route).effective_input_tokens - max(256, limit // 10),
                )
                checkpoint = outcome.checkpoint
                token = await ResponseRecords(runner.store).put_checkpoint(identity.context_id, checkpoint)
                if runner.traces is not None:
                    turn = await runner.store.next_turn(identity.context_id)
                    record = compaction_trace(
                        runner, route, summary_route, identity, reconciled, turn, messages, outcome, compact_endpoint
                    )
                    runner.traces.write(identity.context_id, turn, record)
        except SessionBusy as exc:
            raise SessionConflict(str(exc)) from exc
        item = {"type": "compaction", "id": new_id("cmp"), "encrypted_content": token}
        output: list[dict[str, Any]] = [item]
        if compact_endpoint:  # v1 replaces the client's whole history with the output: keep its user messages
            output = [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": m["content"]}]}
                for m in messages
                if m["role"] == "user"
                and isinstance(m.get("content"), str)
                and not m["content"].startswith("<checkpoint")
            ] + [item]
        checkpoint_tokens = len(checkpoint.message(runner.framing_nonce(identity.context_id))["content"]) // 4
        usage = usage_of({"prompt_tokens": checkpoint_tokens, "completion_tokens": 0})
        response = response_object(
            new_response_id(identity.context_id), request, status="completed", output=output, usage=usage
        )
        headers = {"x-context-id": identity.context_id, "x-context-mode": "dynamic"}
        if compact_endpoint or not request.stream:
            if compact_endpoint:
                response["object"] = "response.compaction"
            return JSONAnswer(response, headers=headers)
        return StreamingResponse(_sse(_compaction_events(response)), media_type="text/event-stream", headers=headers)


async def _issued_checkpoints(records: ResponseRecords, items: list[dict[str, Any]]) -> dict[str, Checkpoint]:
    """The checkpoints named by the compaction items of ``items`` that this proxy issued, in order."""
    found: dict[str, Checkpoint] = {}
    for item in items:
        token = item.get("encrypted_content") if isinstance(item, dict) and item.get("type") == "compaction" else None
        if isinstance(token, str):
            checkpoint = await records.checkpoint(token)
            if checkpoint is not None:
                found[token] = checkpoint
    return found


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
