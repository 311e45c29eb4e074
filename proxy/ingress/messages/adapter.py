"""The Anthropic Messages ingress: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

A request is validated, translated into the canonical chat body (``request.py``), checked by the chat
path's own rules (tool pairing), and run by the turn service through the front door like
``/v1/chat/completions``; the answer is translated back (``response.py``, ``stream.py``). Every error,
the proxy's and the provider's, is rendered in Anthropic's shape (``errors.py``).

``count_tokens`` answers with the turn service's estimate of the translated request (its chat messages
and tools), the estimator the assembly budgets with. It does not run the assembly: that reconciles the
session in the store and may call the model to write a checkpoint, neither of which a count may do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from proxy.edge.after_answer import FreedAfter, after_stream
from proxy.edge.answering import answering
from proxy.edge.resent_requests import ResentRequests
from proxy.ingress.chat.wire import check_message_count, parse_chat_request
from proxy.ingress.front_door import FrontDoor, context_headers
from proxy.ingress.messages.errors import error_body, error_response, prompt_too_long
from proxy.ingress.messages.native import native_request
from proxy.ingress.messages.request import Translation, to_chat, translate_request
from proxy.ingress.messages.response import to_message
from proxy.ingress.messages.stream import message_events, native_events
from proxy.ingress.messages.translations import MessageTranslations
from proxy.ingress.messages.wire import MessagesRequest, parse_count_tokens_request
from proxy.kernel.config import ModelRoute
from proxy.kernel.errors import AssemblyFailed, ContextOverflow
from proxy.kernel.jsonio import JSONAnswer
from proxy.runtime.answers import Completion
from proxy.runtime.service import TurnService


class MessagesIngress:
    """Serves the Messages API through the front door."""

    def __init__(self, front: FrontDoor) -> None:
        self._front = front
        self._resent = ResentRequests()  # a resent history is decoded and digested once
        self._translations = MessageTranslations()  # ... and validated and translated once

    def routes(self) -> list[Route]:
        """The ingress's routes, each answering its errors in Anthropic's shape (its clients read no other)."""
        create, count = answering(self.create, error_response), answering(self.count_tokens, error_response)
        return [
            Route("/v1/messages", create, methods=["POST"]),
            Route("/messages", create, methods=["POST"]),
            Route("/v1/messages/count_tokens", count, methods=["POST"]),
            Route("/messages/count_tokens", count, methods=["POST"]),
        ]

    async def create(self, http: Request) -> Response:
        """``POST /v1/messages``."""
        front = self._front
        principal = await front.authorize(http)
        mode = front.mode(http)
        service = front.service
        # Decoded, validated and translated on the reader's worker thread for a large body: a long history
        # is milliseconds of CPU the event loop, and every other client, should not wait for.
        parse = partial(
            _parse,
            max_messages=front.settings.max_request_messages,
            route_of=partial(front.route, principal=principal),
            headers=http.headers,
            resent=self._resent,
            translations=self._translations,
        )
        body, request, route, translation = await front.reader.decoded(http, parse)
        native = route.api == "messages"  # the client speaks its route's own API: native passage
        passage = None
        if native:
            passage = native_request(body, route, http.headers, translation.body.get("max_tokens"), translation.notes)
        identity = front.identify(http.headers, translation.body, principal)
        front.admit(principal)
        try:
            result = await front.run(
                translation.body,
                identity,
                route,
                http.headers,
                mode,
                ingress=translation.notes,
                digests=translation.digests,
                native=passage,
                provider_fields=translation.provider_fields,
            )
        except (ContextOverflow, AssemblyFailed) as exc:
            limits = service.limits_for(route)
            # The proxy's own assembly failing is measured against the window it assembles for (the operator's
            # cap included), not the model's: Claude Code shows both numbers to the user.
            limit = limits.effective_input_tokens if isinstance(exc, AssemblyFailed) else limits.model_max_tokens
            error = prompt_too_long(exc, limit, await _estimate(service, route, translation))
            error.headers.update(context_headers(identity, mode))
            raise error from exc
        if isinstance(result.answer, Completion):
            # The decoded history and the turn's memos are freed after the answer is sent, not before.
            after = FreedAfter((body, translation, result), self._resent)
            if result.answer.native is not None:  # the provider's own answer, as it came
                return JSONAnswer(result.answer.native, headers=result.headers, background=after)
            message = to_message(result.answer.response, request.model)
            return JSONAnswer(message, headers=result.headers, background=after)
        if passage is not None:
            events = native_events(result.answer, error_body)
        else:
            estimate = await _estimate(service, route, translation)
            events = message_events(result.answer, request.model, error_body, estimate)
        streamed = BackgroundTask(after_stream, self._resent)
        return StreamingResponse(events, media_type="text/event-stream", headers=result.headers, background=streamed)

    async def count_tokens(self, http: Request) -> Response:
        """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, the route's estimate of the request."""
        front = self._front
        principal = await front.authorize(http)
        body = await front.reader.json(http)
        service = front.service
        request = parse_count_tokens_request(body)
        route = front.route(request.model, principal)
        translation = to_chat(request, body, route, http.headers)
        parse_chat_request({**translation.body, "max_tokens": 1})
        return JSONAnswer({"input_tokens": await _estimate(service, route, translation)})


def _parse(
    raw: bytes,
    max_messages: int,
    route_of: Callable[[str], ModelRoute],
    headers: Mapping[str, str],
    resent: ResentRequests,
    translations: MessageTranslations,
) -> tuple[dict[str, Any], MessagesRequest, ModelRoute, Translation]:
    """Decode, validate and translate a ``/v1/messages`` body (pure CPU: runs on the reader's worker thread for
    a large body). The messages it resends of a recent request (``proxy/edge/resent_requests.py``: Claude
    Code's body starts with its model and messages) come decoded and digested; the request is remembered
    for the next one once it passed every check."""
    decoded = resent.decode(raw)
    check_message_count(decoded.body, max_messages)
    request, route, translation = translate_request(
        decoded.body, route_of, headers, translations, decoded.resent_digests
    )
    if translation.sent_digests is not None:
        resent.remember(decoded, translation.sent_digests)
    return decoded.body, request, route, translation


async def _estimate(service: TurnService, route: ModelRoute, translation: Translation) -> int:
    """The route's estimate of the translated messages and tools (what the assembly budgets with)."""
    body = translation.body
    return await service.count_tokens(route, body["messages"], body.get("tools") or [])
