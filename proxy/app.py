"""The Starlette app: a short composition of the ingresses, the operators' routes, middleware and lifespan.

What the app runs on is built by ``proxy/builder.py`` when it starts; each wire format is an ingress
(``proxy/ingress/``: chat, Responses, Messages) that reaches the turn service through the one front door.
Every answer is JSON in its API's shape, an unexpected error included (``proxy/edge/answering.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.builder import Services
from proxy.edge.answering import HANDLERS, answering
from proxy.edge.recording import RecordingMiddleware
from proxy.edge.request_reader import RequestReader
from proxy.edge.trailing_slash import TrailingSlashMiddleware
from proxy.ingress.chat.adapter import ChatIngress
from proxy.ingress.front_door import FrontDoor
from proxy.ingress.key_admin import KeyAdmin
from proxy.ingress.messages.adapter import MessagesIngress
from proxy.ingress.responses.adapter import ResponsesIngress
from proxy.kernel.config import Settings
from proxy.kernel.jsonio import JSONAnswer
from proxy.observe.metrics import CONTENT_TYPE
from proxy.process.drain import Drain
from proxy.process.heap_trim import HeapTrimmer, glibc_keep_freed, glibc_trim
from proxy.process.startup_gc import frozen_start_up
from proxy.provider.base import ProviderBackend
from proxy.report.inspector import Inspector
from proxy.runtime.assembly import Assembler
from proxy.session.store import SessionStore

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider


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
    services = Services(settings, store=store, backend=backend, assembler=assembler, tracer_provider=tracer_provider)
    drain = Drain(settings.shutdown_grace_seconds)
    heap = HeapTrimmer(glibc_trim(), keep_freed=glibc_keep_freed)  # what large requests free (process/heap_trim.py)
    reader = RequestReader(settings.max_request_bytes, on_body=heap.note_body)
    front = FrontDoor(settings, services.ready, reader, drain, services.tenants)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        heap.start()
        await services.start()
        try:
            # litellm is imported and its model map read (the builder checks every route's limits): what
            # exists now lives as long as the app, so full collections need not walk it again.
            with frozen_start_up():
                yield
        finally:
            reader.close()
            heap.stop()
            await services.stop()

    inspector = Inspector(settings.resolved_trace_dir, settings.master_key, settings.trace_enabled, services.tenants)
    routes = [
        *ChatIngress(front).routes(),
        *ResponsesIngress(front).routes(),
        *MessagesIngress(front).routes(),
        *_operator_routes(settings, services, drain),
        *KeyAdmin(services.tenants, services.opened_store, reader).routes(),
        *inspector.routes(wrap=answering),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=HANDLERS)
    if services.recorder is not None:
        app.add_middleware(RecordingMiddleware, recorder=services.recorder)
    app.add_middleware(TrailingSlashMiddleware)  # outermost: a recording sees the path that was served
    app.state.drain = drain  # the server starts it on shutdown (proxy.process.drain.DrainingServer)
    app.state.heap_trimmer = heap
    return app


def _operator_routes(settings: Settings, services: Services, drain: Drain) -> list[Route]:
    """The model list (a team's key sees the models it may use), the metrics (the master key only) and the
    health checks (these need no key; readiness answers 503 while the process drains)."""

    async def list_models(request: Request) -> Response:
        allowed = (await services.tenants.principal(request.headers, _peer(request))).limits.models
        data = [
            {"id": route.model_name, "object": "model", "created": 0, "owned_by": "context-proxy"}
            for route in settings.models
            if not allowed or route.model_name in allowed
        ]
        return JSONAnswer({"object": "list", "data": data})

    async def metrics(request: Request) -> Response:
        await services.tenants.administrator(request.headers, _peer(request))
        return Response(services.telemetry.metrics.render(), media_type=CONTENT_TYPE)

    async def liveliness(request: Request) -> Response:
        return JSONAnswer({"status": "alive"})

    async def readiness(request: Request) -> Response:
        # Not ready while draining (SIGTERM): load balancers take the replica out before it stops.
        ready = services.service is not None and not drain.draining
        status = "draining" if drain.draining else "ready" if ready else "starting"
        body = {
            "status": status,
            "mode": settings.mode,
            "store": "postgresql" if settings.store_url else "sqlite",
        }
        return JSONAnswer(body, status_code=200 if ready else 503)

    return [
        Route("/v1/models", answering(list_models), methods=["GET"]),
        Route("/models", answering(list_models), methods=["GET"]),
        Route("/metrics", answering(metrics), methods=["GET"]),
        Route("/health/liveliness", liveliness, methods=["GET"]),
        Route("/health/readiness", answering(readiness), methods=["GET"]),
    ]


def _peer(request: Request) -> str | None:
    """The address a request came from (what a trusted gateway's network is checked against)."""
    return request.client.host if request.client else None
