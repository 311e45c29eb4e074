"""The Starlette app: routes, authentication, request reading and the one error renderer per API shape.

Every answer is JSON in OpenAI's shape (a Messages route's errors in Anthropic's), an unexpected error
included (a 500 that leaves the keep-alive connection usable), and every stream ends with ``[DONE]``,
after an ``error`` event when it could not be completed.
"""

from __future__ import annotations

import functools
import hmac
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from proxy.builder import build_runner
from proxy.context.nonce import SECRET_NAME
from proxy.edge.known_messages import KnownMessages
from proxy.edge.request_reader import RequestReader
from proxy.edge.resent_requests import ResentRequests
from proxy.ingress.chat.wire import ChatCompletionRequest, check_chat_request
from proxy.ingress.identify import identify
from proxy.ingress.messages import adapter as anthropic
from proxy.ingress.messages.errors import error_response as anthropic_error
from proxy.ingress.responses.adapter import ResponsesIngress
from proxy.kernel.client_params import check_client_params
from proxy.kernel.config import Mode, Settings
from proxy.kernel.errors import AuthenticationFailed, InvalidRequest, ModelNotFound, ProxyError
from proxy.kernel.jsonio import JSONAnswer, dumps
from proxy.observe.metrics import CONTENT_TYPE
from proxy.observe.telemetry import Telemetry
from proxy.process.drain import Drain
from proxy.process.heap_trim import HeapTrimmer, glibc_keep_freed, glibc_trim
from proxy.process.startup_gc import collect_after_turn, frozen_start_up
from proxy.provider.litellm_backend import ProviderBackend
from proxy.provider.recording import Recorder, RecordingMiddleware
from proxy.report.inspector import Inspector
from proxy.runtime.answers import Completion
from proxy.runtime.assembly import Assembler
from proxy.runtime.service import TurnRunner
from proxy.session import open_store
from proxy.session.store import SessionStore

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

log = logging.getLogger("context_proxy")


@dataclass
class Services:
    """What the app runs on; each part may be handed in (tests) or is built from the settings at start-up."""

    store: SessionStore | None = None
    backend: ProviderBackend | None = None
    assembler: Assembler | None = None
    runner: TurnRunner | None = None

    def ready_runner(self) -> TurnRunner:
        """The runner, or the 503 every ingress answers until the lifespan has built it.

        Each route asks at the point it needs the runner (after its own authentication and validation),
        so a bad request during start-up still gets its 4xx.
        """
        if self.runner is None:
            raise ProxyError("The proxy is still starting.", status=503, code="starting")
        return self.runner


def create_app(
    settings: Settings,
    *,
    store: SessionStore | None = None,
    backend: ProviderBackend | None = None,
    assembler: Assembler | None = None,
    tracer_provider: TracerProvider | None = None,
) -> Starlette:
    """Build the proxy app. Parts not handed in are created when the app starts (its lifespan).

    ``tracer_provider`` receives a span per model call; without one, spans go to
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` when it is set (``proxy/observe/telemetry.py``).
    """
    services = Services(store=store, backend=backend, assembler=assembler)
    telemetry = Telemetry.build(tracer_provider, os.environ)
    drain = Drain(settings.shutdown_grace_seconds)
    heap = HeapTrimmer(
        glibc_trim(), keep_freed=glibc_keep_freed
    )  # what large requests free (proxy/process/heap_trim.py)
    reader = RequestReader(settings.max_request_bytes, on_body=heap.note_body)
    known_messages = KnownMessages()  # the chat edge validates a resent history's messages once
    resent_requests = ResentRequests()  # ... and decodes and digests them once
    # Record and replay (proxy/replay/): off unless a record folder is set, then nothing is wrapped.
    recorder = Recorder(settings.record_dir) if settings.record_dir is not None else None

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        heap.start()
        owned_store = services.store is None
        owned_backend = services.backend is None
        if services.store is None:
            services.store = open_store(settings.store_url, settings.data_dir, settings.session_lock_seconds)
        await services.store.open()
        if services.backend is None:
            from proxy.provider.litellm_backend import LiteLLMBackend

            services.backend = LiteLLMBackend(timeout_seconds=settings.provider_timeout_seconds)
        if recorder is not None:
            services.backend = recorder.wrap(services.backend)
        model_map = getattr(services.backend, "model_map_limits", _unknown_model)
        framing_secret = settings.framing_secret or await services.store.secret(SECRET_NAME)
        services.runner = build_runner(
            settings,
            services.store,
            services.backend,
            model_map,
            framing_secret,
            services.assembler,
            telemetry.observer,
        )
        if recorder is not None:
            recorder.framing_nonce = services.runner.framing_nonce
        try:
            # litellm is imported and its model map read (build_runner checks every route's limits):
            # what exists now lives as long as the app, so full collections need not walk it again.
            with frozen_start_up():
                yield
        finally:
            reader.close()
            heap.stop()
            await services.runner.calibrator.flush()  # the last answers' samples, no turn left to write them
            aclose = getattr(services.backend, "aclose", None)
            if owned_backend and aclose is not None:
                await aclose()  # the provider connections, before the loop they belong to stops
            if owned_store:
                await services.store.close()
            await anyio.to_thread.run_sync(telemetry.shutdown)  # flushes pending spans: network I/O

    async def chat_completions(request: Request) -> Response:
        _authorize(request, settings)
        # Validated on the reader's worker thread with the decode, for a large body: seconds of CPU at 20,000 messages.
        parse = functools.partial(
            _parse, max_messages=settings.max_request_messages, known=known_messages, resent=resent_requests
        )
        body, chat, digests = await reader.decoded(request, parse)
        route = settings.route(chat.model)
        if route is None:
            raise ModelNotFound(
                f"The model {chat.model!r} does not exist or you do not have access to it.", param="model"
            )
        check_client_params(body, route.allowed_client_params)
        identity = identify(request.headers, body)
        runner = services.ready_runner()
        mode = _mode(request, settings)
        try:
            async with drain.bounded():
                result = await runner.run(body, identity, route, request.headers, mode, digests=digests)
        except ProxyError as exc:
            # The session is known by now: an error answer names it too, so a client can find its trace.
            exc.headers.update({"x-context-id": identity.context_id, "x-context-mode": mode})
            raise
        if isinstance(result.answer, Completion):
            # The decoded history and the turn's memos are freed after the answer is sent, not before.
            after = _freed_after(body, result, resent=resent_requests)
            return JSONAnswer(result.answer.response, headers=result.headers, background=after)
        return _EventStream(result.answer, drain, result.headers, resent_requests)

    responses_api = ResponsesIngress(settings, services.ready_runner)

    async def responses(request: Request) -> Response:
        _authorize(request, settings)
        body = await reader.json(request)
        compact = request.url.path.endswith("/compact")
        return await responses_api.create(body, request.headers, _mode(request, settings), compact=compact)

    async def retrieve_response(request: Request) -> Response:
        _authorize(request, settings)
        return await responses_api.retrieve(request.path_params["response_id"])

    async def messages(request: Request) -> Response:
        _authorize(request, settings)
        body = await reader.json(request)
        runner = services.ready_runner()
        return await anthropic.create_message(body, request.headers, settings, runner, _mode(request, settings))

    async def count_tokens(request: Request) -> Response:
        _authorize(request, settings)
        body = await reader.json(request)
        return await anthropic.count_tokens(body, request.headers, settings, services.ready_runner())

    async def list_models(request: Request) -> Response:
        _authorize(request, settings)
        data = [
            {"id": route.model_name, "object": "model", "created": 0, "owned_by": "context-proxy"}
            for route in settings.models
        ]
        return JSONAnswer({"object": "list", "data": data})

    async def metrics(request: Request) -> Response:
        _authorize(request, settings)
        return Response(telemetry.metrics.render(), media_type=CONTENT_TYPE)

    async def liveliness(request: Request) -> Response:
        return JSONAnswer({"status": "alive"})

    async def readiness(request: Request) -> Response:
        ready = services.runner is not None
        return JSONAnswer(
            {
                "status": "ready" if ready else "starting",
                "mode": settings.mode,
                "store": "postgresql" if settings.store_url else "sqlite",
            },
            status_code=200 if ready else 503,
        )

    routes = [
        Route("/v1/chat/completions", _answering(chat_completions), methods=["POST"]),
        Route("/chat/completions", _answering(chat_completions), methods=["POST"]),
        Route("/v1/responses", _answering(responses), methods=["POST"]),
        Route("/responses", _answering(responses), methods=["POST"]),
        Route("/v1/responses/compact", _answering(responses), methods=["POST"]),
        Route("/responses/compact", _answering(responses), methods=["POST"]),
        Route("/v1/responses/{response_id}", _answering(retrieve_response), methods=["GET"]),
        Route("/responses/{response_id}", _answering(retrieve_response), methods=["GET"]),
        # Anthropic clients read only Anthropic's error shape.
        Route("/v1/messages", _answering(messages, anthropic_error), methods=["POST"]),
        Route("/messages", _answering(messages, anthropic_error), methods=["POST"]),
        Route("/v1/messages/count_tokens", _answering(count_tokens, anthropic_error), methods=["POST"]),
        Route("/messages/count_tokens", _answering(count_tokens, anthropic_error), methods=["POST"]),
        Route("/v1/models", _answering(list_models), methods=["GET"]),
        Route("/models", _answering(list_models), methods=["GET"]),
        Route("/metrics", _answering(metrics), methods=["GET"]),
        Route("/health/liveliness", liveliness, methods=["GET"]),
        Route("/health/readiness", _answering(readiness), methods=["GET"]),
    ]
    inspector = Inspector(settings.resolved_trace_dir, settings.master_key, settings.trace_enabled)
    routes += inspector.routes(wrap=_answering)
    handlers = {ProxyError: _proxy_error, HTTPException: _http_error, Exception: _unexpected_error}
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    if recorder is not None:
        app.add_middleware(RecordingMiddleware, recorder=recorder)
    app.state.drain = drain  # the server starts it on shutdown (proxy.process.drain.DrainingServer)
    app.state.heap_trimmer = heap
    return app


Endpoint = Callable[[Request], Awaitable[Response]]


def _openai_error(exc: ProxyError) -> Response:
    """The OpenAI-shaped answer for ``exc``: the default shape of every route."""
    return JSONAnswer(exc.body(), status_code=exc.status, headers=exc.headers)


def _answering(endpoint: Endpoint, render: Callable[[ProxyError], Response] = _openai_error) -> Endpoint:
    """``endpoint`` answering its errors itself: a ``ProxyError`` in the route's API shape (``render``),
    an unexpected error with a JSON 500.

    Starlette hands an ``Exception`` handler's error to ``ServerErrorMiddleware``, which sends the
    answer and then re-raises; uvicorn, seeing the error after a complete response, drops the
    connection without ``connection: close``, and the client's next request on it fails. An error
    answered here is an ordinary response: the connection stays usable.
    """

    async def answering(request: Request) -> Response:
        try:
            return await endpoint(request)
        except ProxyError as exc:
            return render(exc)
        except HTTPException:
            raise  # rendered by its handler, which returns normally
        except Exception:
            return _internal_error(request)

    return answering


def _mode(request: Request, settings: Settings) -> Mode:
    """The operator's mode, or shadow/legacy chosen per request when the operator allows it (debugging)."""
    asked = request.headers.get("x-context-mode", "").strip().lower()
    if not asked or not settings.allow_mode_header:
        return settings.mode
    if asked not in ("shadow", "legacy", "dynamic"):
        raise InvalidRequest(f"x-context-mode {asked!r} is not one of dynamic, shadow, legacy.", param="x-context-mode")
    return asked  # type: ignore[return-value]  # one of the three, checked above


def _unknown_model(model: str) -> tuple[int | None, int | None]:
    return None, None


def _authorize(request: Request, settings: Settings) -> None:
    if settings.master_key is None:
        return
    key = settings.master_key.encode()
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key):
        return
    # Anthropic clients send their key as x-api-key (DESIGN.md's interface accepts both).
    if hmac.compare_digest(request.headers.get("x-api-key", "").strip().encode(), key):
        return
    raise AuthenticationFailed("Missing or invalid API key: send Authorization: Bearer <key> or x-api-key: <key>.")


def _freed_after(*held: object, resent: ResentRequests) -> BackgroundTask:
    """A task that runs once the response is sent, holding ``held`` until then: a 1,000-message turn's
    objects (the decoded body, the turn's memos) take a millisecond or two to free, after the client has
    its answer rather than before; then what outlived the turn may be collected (``startup_gc``), and
    the copies of its messages that the session's next turn will take are made (``make_spares``)."""
    return _FreedAfter(held, resent)


class _FreedAfter(BackgroundTask):
    def __init__(self, held: tuple[object, ...], resent: ResentRequests) -> None:
        super().__init__(collect_after_turn)
        self._held: tuple[object, ...] = held
        self._resent = resent

    async def __call__(self) -> None:
        self._held = ()  # the turn's objects go now, before the collection walks what is left
        collect_after_turn()
        await _make_spares(self._resent)


async def _make_spares(resent: ResentRequests) -> None:
    """The copies of the messages the session's next turn will take (``make_spares``), once an answer is
    sent: on a worker thread, so other requests' turns go on meanwhile."""
    if resent.wants_spares:
        await anyio.to_thread.run_sync(resent.make_spares)


def _parse(
    raw: bytes, max_messages: int, known: KnownMessages, resent: ResentRequests
) -> tuple[dict[str, Any], ChatCompletionRequest, list[bytes] | None]:
    """Decode and validate a chat body (pure CPU: runs on the reader's worker thread for large bodies);
    with it, the exact digest of each message (the chain memo takes them instead of digesting again).
    The messages it resends of a recent request (``proxy/edge/resent_requests.py``) come decoded and digested."""
    decoded = resent.decode(raw)
    body = decoded.body
    messages = body.get("messages")
    if isinstance(messages, list) and len(messages) > max_messages:
        raise InvalidRequest(
            f"The request has {len(messages)} messages; this proxy accepts at most {max_messages} per request "
            "(CONTEXT_PROXY_MAX_REQUEST_MESSAGES).",
            param="messages",
            code="too_many_messages",
        )
    chat, digests = check_chat_request(body, known, decoded.resent, decoded.resent_digests)
    if digests is not None:
        resent.remember(decoded, digests)
    return body, chat, digests


class _EventStream(StreamingResponse):
    """A server-sent-events answer that owns its chunk stream: closed on every way out.

    Closing it ends the provider call and releases the session lock even when the response never
    started or its task was cancelled (the client went away, the server stopped).
    """

    def __init__(
        self, chunks: AsyncIterator[dict[str, Any]], drain: Drain, headers: dict[str, str], resent: ResentRequests
    ) -> None:
        self._chunks = chunks
        self._resent = resent
        super().__init__(_sse(chunks, drain), media_type="text/event-stream", headers=headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):  # even inside a cancelled task: the lock must go
                await _close(self.body_iterator)
                await _close(self._chunks)
        await _make_spares(self._resent)  # after the lock is released: the next turn may already wait


async def _close(iterator: Any) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()


async def _sse(chunks: AsyncIterator[dict[str, Any]], drain: Drain) -> AsyncIterator[bytes]:
    """Server-sent events ending in ``[DONE]``; a failure mid-stream, whatever it is, sends an ``error``
    event first (OpenAI's error shape, which the SDKs raise as an error) instead of cutting the stream."""
    try:
        while True:
            try:
                async with drain.bounded():
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                break
            yield _event(chunk)
    except ProxyError as exc:
        yield b"event: error\n" + _event(exc.body())
    except Exception:
        log.exception("unexpected error while streaming an answer")
        yield b"event: error\n" + _event(_internal_error_body())
    yield b"data: [DONE]\n\n"


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + dumps(data) + b"\n\n"  # a lone surrogate from upstream is escaped: the JSON stays valid


async def _proxy_error(request: Request, exc: Exception) -> Response:
    # Reached only for errors outside an endpoint (``_answering`` renders the others).
    assert isinstance(exc, ProxyError)
    return _openai_error(exc)


_HTTP_ERROR_TYPES = {404: ("not_found_error", "not_found"), 405: ("invalid_request_error", "method_not_allowed")}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind, code = _HTTP_ERROR_TYPES.get(exc.status_code, ("invalid_request_error", None))
    error = ProxyError(
        f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code, type=kind, code=code
    )
    return JSONAnswer(error.body(), status_code=exc.status_code, headers=dict(exc.headers or {}))


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    # Reached only for errors outside an endpoint (``_answering`` answers the others): the server
    # closes the connection after this answer, so say so rather than leave the client to find out.
    response = _internal_error(request)
    response.headers["connection"] = "close"
    return response


def _internal_error(request: Request) -> JSONAnswer:
    log.exception("unexpected error serving %s %s", request.method, request.url.path)
    return JSONAnswer(_internal_error_body(), status_code=500)


def _internal_error_body() -> dict[str, Any]:
    error = ProxyError("The proxy failed unexpectedly; the error is in its log.", status=500, code="internal_error")
    return error.body()
