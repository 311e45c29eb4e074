"""The Chat Completions ingress: ``POST /v1/chat/completions`` (and ``/chat/completions``).

Chat is the canonical wire format, so there is nothing to translate: the body is read and validated
(``wire.py``; a resent history is decoded and validated once, by its bytes: ``proxy/edge``), the client's
fields checked against what it may steer, and the turn run as it is. The answer goes out as JSON or as
server-sent events (``stream.py``).
"""

from __future__ import annotations

import functools
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.edge.after_answer import FreedAfter, after_stream
from proxy.edge.answering import answering
from proxy.edge.known_messages import KnownMessages
from proxy.edge.resent_requests import ResentRequests
from proxy.ingress.chat.stream import EventStream
from proxy.ingress.chat.wire import ChatCompletionRequest, check_chat_request, check_message_count
from proxy.ingress.front_door import FrontDoor
from proxy.kernel.client_params import check_client_params
from proxy.kernel.jsonio import JSONAnswer
from proxy.runtime.answers import Completion


class ChatIngress:
    """Serves Chat Completions through the front door."""

    def __init__(self, front: FrontDoor) -> None:
        self._front = front
        self._known = KnownMessages()  # a resent history's messages are validated once
        self._resent = ResentRequests()  # ... and decoded and digested once

    def routes(self) -> list[Route]:
        """The ingress's routes, each answering its errors in OpenAI's shape."""
        endpoint = answering(self.create)
        return [
            Route("/v1/chat/completions", endpoint, methods=["POST"]),
            Route("/chat/completions", endpoint, methods=["POST"]),
        ]

    async def create(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        front = self._front
        principal = await front.authorize(request)
        # Validated on the reader's worker thread with the decode, for a large body: seconds of CPU at 20,000 messages.
        parse = functools.partial(
            _parse, max_messages=front.settings.max_request_messages, known=self._known, resent=self._resent
        )
        body, chat, digests = await front.reader.decoded(request, parse)
        route = front.route(chat.model, principal)
        check_client_params(body, route.allowed_client_params)
        identity = front.identify(request.headers, body, principal)
        mode = front.mode(request)
        front.admit(principal)
        result = await front.run(body, identity, route, request.headers, mode, digests=digests)
        if isinstance(result.answer, Completion):
            # The decoded history and the turn's memos are freed after the answer is sent, not before.
            after = FreedAfter((body, result), self._resent)
            return JSONAnswer(result.answer.response, headers=result.headers, background=after)
        return EventStream(result.answer, front.drain, result.headers, functools.partial(after_stream, self._resent))


def _parse(
    raw: bytes, max_messages: int, known: KnownMessages, resent: ResentRequests
) -> tuple[dict[str, Any], ChatCompletionRequest, list[bytes] | None]:
    """Decode and validate a chat body (pure CPU: runs on the reader's worker thread for large bodies);
    with it, the exact digest of each message (the chain memo takes them instead of digesting again).
    The messages it resends of a recent request (``proxy/edge/resent_requests.py``) come decoded and digested."""
    decoded = resent.decode(raw)
    body = decoded.body
    check_message_count(body, max_messages)
    chat, digests = check_chat_request(body, known, decoded.resent, decoded.resent_digests)
    if digests is not None:
        resent.remember(decoded, digests)
    return body, chat, digests
