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

from functools import partial

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from proxy.edge.answering import answering
from proxy.ingress.chat.wire import parse_chat_request
from proxy.ingress.front_door import FrontDoor, context_headers
from proxy.ingress.messages.errors import error_body, error_response, prompt_too_long
from proxy.ingress.messages.native import native_request
from proxy.ingress.messages.request import Translation, to_chat, translate_request
from proxy.ingress.messages.response import to_message
from proxy.ingress.messages.stream import message_events, native_events
from proxy.ingress.messages.translations import MessageTranslations
from proxy.ingress.messages.wire import parse_count_tokens_request
from proxy.kernel.config import ModelRoute
from proxy.kernel.errors import AssemblyFailed, ContextOverflow
from proxy.kernel.jsonio import JSONAnswer
from proxy.runtime.answers import Completion
from proxy.runtime.service import TurnService


class MessagesIngress:
    """Serves the Messages API through the front door."""

    def __init__(self, front: FrontDoor) -> None:
        self._front = front
        self._translations = MessageTranslations()  # a resent history is validated and translated once

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
        body = await front.reader.json(http)
        mode = front.mode(http)
        service = front.service
        request, route, translation = translate_request(
            body, partial(front.route, principal=principal), http.headers, self._translations
        )
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
            if result.answer.native is not None:  # the provider's own answer, as it came
                return JSONAnswer(result.answer.native, headers=result.headers)
            return JSONAnswer(to_message(result.answer.response, request.model), headers=result.headers)
        if passage is not None:
            relayed = native_events(result.answer, error_body)
            return StreamingResponse(relayed, media_type="text/event-stream", headers=result.headers)
        estimate = await _estimate(service, route, translation)
        events = message_events(result.answer, request.model, error_body, estimate)
        return StreamingResponse(events, media_type="text/event-stream", headers=result.headers)

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


async def _estimate(service: TurnService, route: ModelRoute, translation: Translation) -> int:
    """The route's estimate of the translated messages and tools (what the assembly budgets with)."""
    body = translation.body
    return await service.count_tokens(route, body["messages"], body.get("tools") or [])
