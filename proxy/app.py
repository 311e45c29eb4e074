"""The Starlette app: routes, authentication, request reading and the one error renderer."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from proxy.config import Mode, Settings
from proxy.errors import AuthenticationFailed, InvalidRequest, ModelNotFound, ProxyError, RequestTooLarge
from proxy.identity import identify
from proxy.ingress.responses_api import ResponsesIngress
from proxy.runtime.assembly import Assembler
from proxy.runtime.provider import ProviderBackend
from proxy.runtime.services import build_runner
from proxy.runtime.turn import TurnResult, TurnRunner
from proxy.session import open_store
from proxy.session.store import SessionStore
from proxy.wire import parse_chat_request

log = logging.getLogger("context_proxy")


@dataclass
class Services:
    """What the app runs on; each part may be handed in (tests) or is built from the settings at start-up."""

    store: SessionStore | None = None
    backend: ProviderBackend | None = None
    assembler: Assembler | None = None
    runner: TurnRunner | None = None


def create_app(
    settings: Settings,
    *,
    store: SessionStore | None = None,
    backend: ProviderBackend | None = None,
    assembler: Assembler | None = None,
) -> Starlette:
    """Build the proxy app. Parts not handed in are created when the app starts (its lifespan)."""
    services = Services(store=store, backend=backend, assembler=assembler)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        owned_store = services.store is None
        if services.store is None:
            services.store = open_store(settings.store_url, settings.data_dir, settings.session_lock_seconds)
        await services.store.open()
        if services.backend is None:
            from proxy.runtime.provider import LiteLLMBackend

            services.backend = LiteLLMBackend(timeout_seconds=settings.provider_timeout_seconds)
        model_map = getattr(services.backend, "model_map_limits", _unknown_model)
        services.runner = build_runner(settings, services.store, services.backend, model_map, services.assembler)
        try:
            yield
        finally:
            if owned_store:
                await services.store.close()

    async def chat_completions(request: Request) -> Response:
        _authorize(request, settings)
        body = await _read_json(request, settings.max_request_bytes)
        chat = parse_chat_request(body)
        route = settings.route(chat.model)
        if route is None:
            raise ModelNotFound(
                f"The model {chat.model!r} does not exist or you do not have access to it.", param="model"
            )
        identity = identify(request.headers, body)
        if services.runner is None:
            raise ProxyError("The proxy is still starting.", status=503, code="starting")
        mode = _mode(request, settings)
        try:
            result = await services.runner.run(body, identity, route, request.headers, mode)
        except ProxyError as exc:
            # The session is known by now: an error answer names it too, so a client can find its trace.
            exc.headers.update({"x-context-id": identity.context_id, "x-context-mode": mode})
            raise
        return _respond(result)

    responses_api = ResponsesIngress(settings, lambda: services.runner)

    async def responses(request: Request) -> Response:
        _authorize(request, settings)
        body = await _read_json(request, settings.max_request_bytes)
        compact = request.url.path.endswith("/compact")
        return await responses_api.create(body, request.headers, _mode(request, settings), compact=compact)

    async def retrieve_response(request: Request) -> Response:
        _authorize(request, settings)
        return await responses_api.retrieve(request.path_params["response_id"])

    async def list_models(request: Request) -> Response:
        _authorize(request, settings)
        data = [
            {"id": route.model_name, "object": "model", "created": 0, "owned_by": "context-proxy"}
            for route in settings.models
        ]
        return JSONResponse({"object": "list", "data": data})

    async def liveliness(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def readiness(request: Request) -> Response:
        ready = services.runner is not None
        return JSONResponse(
            {
                "status": "ready" if ready else "starting",
                "mode": settings.mode,
                "store": "postgresql" if settings.store_url else "sqlite",
            },
            status_code=200 if ready else 503,
        )

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/responses", responses, methods=["POST"]),
        Route("/v1/responses/compact", responses, methods=["POST"]),
        Route("/responses/compact", responses, methods=["POST"]),
        Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
        Route("/responses/{response_id}", retrieve_response, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/models", list_models, methods=["GET"]),
        Route("/health/liveliness", liveliness, methods=["GET"]),
        Route("/health/readiness", readiness, methods=["GET"]),
    ]
    handlers = {ProxyError: _proxy_error, HTTPException: _http_error, Exception: _unexpected_error}
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)


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
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), settings.master_key.encode()):
        raise AuthenticationFailed("Missing or invalid API key: send Authorization: Bearer <key>.")


async def _read_json(request: Request, limit: int) -> Any:
    """The body as JSON, refusing oversized bodies before reading them whole."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(f"The request body ({declared} bytes) exceeds the limit of {limit} bytes.")
    raw = bytearray()
    async for piece in request.stream():
        raw.extend(piece)
        if len(raw) > limit:
            raise RequestTooLarge(f"The request body exceeds the limit of {limit} bytes.")
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid UTF-8 (byte {exc.start}).") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(
            f"The request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}."
        ) from None


def _respond(result: TurnResult) -> Response:
    if result.chunks is None:
        return JSONResponse(result.response, headers=result.headers)
    return StreamingResponse(_sse(result.chunks), media_type="text/event-stream", headers=result.headers)


async def _sse(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    """Server-sent events ending in ``[DONE]``; an error mid-stream becomes an error event instead."""
    try:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    except ProxyError as exc:
        yield f"data: {json.dumps(exc.body(), ensure_ascii=False)}\n\n"
        return
    yield "data: [DONE]\n\n"


async def _proxy_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProxyError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


_HTTP_ERROR_TYPES = {404: ("not_found_error", "not_found"), 405: ("invalid_request_error", "method_not_allowed")}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind, code = _HTTP_ERROR_TYPES.get(exc.status_code, ("invalid_request_error", None))
    error = ProxyError(
        f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code, type=kind, code=code
    )
    return JSONResponse(error.body(), status_code=exc.status_code, headers=dict(exc.headers or {}))


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error serving %s %s", request.method, request.url.path)
    error = ProxyError("The proxy failed unexpectedly; the error is in its log.", status=500, code="internal_error")
    return JSONResponse(error.body(), status_code=500)
