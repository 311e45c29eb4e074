"""The one builder: what the app runs on, made from the settings when it starts.

``Services`` opens the store, makes the provider backend (recorded when a record folder is set), reads the
framing secret, builds the turn service (``build_service``: the contributor registries, the pipeline, the
proxy-owned tools) and the observers, and closes what it opened when the app stops. Everything is
composed once at start-up; the registries are frozen, so no package can change them while sessions run
(each run gets its own, composed from the same checked factories: ``proxy/context/registry.py``).
``check_settings`` is what ``serve`` checks before it starts. Parts handed in (tests, the replay command)
are used as they are and left open.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import anyio

from proxy.context.compactor import CompactionConfig, HistoryCompactor
from proxy.context.estimators import CachingEstimator, ConservativeTokenEstimator
from proxy.context.nonce import SECRET_NAME
from proxy.context.pipeline import ContextPipeline, PipelineConfig
from proxy.context.pressure import Level, PressureConfig, pressure_levels
from proxy.context.registry import (
    FactorySource,
    OptionsInvalid,
    RunRegistries,
    configure,
    discover_factories,
    proxy_tools,
    state_channels,
)
from proxy.context.state import StateConfig
from proxy.ingress.tenants import Gateway, Tenants
from proxy.kernel.config import ConfigError, ModelRoute, Settings
from proxy.kernel.errors import ProxyError
from proxy.kernel.usage import no_prices
from proxy.observe.telemetry import Telemetry
from proxy.provider.base import ProviderBackend
from proxy.provider.recording import Recorder
from proxy.runtime.assembly import Assembler
from proxy.runtime.calibration import TokenCalibrator
from proxy.runtime.limits import ModelMapLookup, check_route_limits, resolve_limits
from proxy.runtime.observers import CallObserver, Observers
from proxy.runtime.proxy_tools import ProxyToolbox, ReadToolOutput
from proxy.runtime.service import TurnService
from proxy.runtime.session_assembler import SessionAssembler
from proxy.runtime.trace import TraceWriter
from proxy.session import SqliteSessionStore, open_store
from proxy.session.store import SessionStore

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

logger = logging.getLogger(__name__)


class Services:
    """The store, the provider backend, the turn service and the observers of one app.

    ``start`` builds what was not handed in (in the app's lifespan, on its event loop), ``stop`` closes
    what it built; ``ready`` is the turn service, or the 503 every ingress answers until it exists.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        store: SessionStore | None = None,
        backend: ProviderBackend | None = None,
        assembler: Assembler | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.backend = backend
        self._owns_store = store is None
        self._owns_backend = backend is None
        self._assembler = assembler
        # Spans go to ``tracer_provider``, else to OTEL_EXPORTER_OTLP_ENDPOINT when set (observe/telemetry.py).
        self.telemetry = Telemetry.build(tracer_provider, os.environ, settings.metrics_teams)
        # Record and replay: off unless a record folder is set, then nothing is wrapped.
        self.recorder = Recorder(settings.record_dir) if settings.record_dir is not None else None
        self.service: TurnService | None = None
        # Who a request is, and its key's limits; it also counts what each key's model calls sent.
        gateway = (
            Gateway(settings.team_header, settings.team_header_secret, settings.team_header_from)
            if settings.team_header
            else None
        )
        self.tenants = Tenants(settings.master_key, self.opened_store, settings.key_cache_seconds, gateway=gateway)

    def opened_store(self) -> SessionStore:
        """The store, or the 503 ``starting`` while the app has not opened it yet."""
        if self.store is None or self.service is None:
            raise ProxyError("The proxy is still starting.", status=503, code="starting")
        return self.store

    def ready(self) -> TurnService:
        """The turn service, or the 503 ``starting`` while the app has not built it yet."""
        if self.service is None:
            raise ProxyError("The proxy is still starting.", status=503, code="starting")
        return self.service

    async def start(self) -> None:
        """Open the store, make the backend, read the framing secret and build the turn service."""
        settings = self.settings
        if self.store is None:
            self.store = open_store(settings.store_url, settings.data_dir, settings.session_lock_seconds)
        await self.store.open()
        if self.backend is None:
            from proxy.provider.litellm_backend import LiteLLMBackend  # deferred: importing litellm costs seconds

            self.backend = LiteLLMBackend(timeout_seconds=settings.provider_timeout_seconds)
        if self.recorder is not None:
            self.backend = self.recorder.wrap(self.backend)
        model_map = getattr(self.backend, "model_map_limits", _unknown_model)
        framing_secret = settings.framing_secret or await self.store.secret(SECRET_NAME)
        self.service = build_service(
            settings,
            self.store,
            self.backend,
            model_map,
            framing_secret,
            self._assembler,
            Observers([self.telemetry.observer, self.tenants]),
        )
        if self.recorder is not None:
            self.recorder.framing_nonce = self.service.framing_nonce

    async def stop(self) -> None:
        """Write what the last answers taught, then close what ``start`` opened and flush pending spans."""
        if self.service is not None:
            await self.service.calibrator.flush()  # the last answers' samples: no turn is left to write them
        aclose = getattr(self.backend, "aclose", None)
        if self._owns_backend and aclose is not None:
            await aclose()  # the provider connections, before the loop they belong to stops
        if self._owns_store and self.store is not None:
            await self.store.close()
        await anyio.to_thread.run_sync(self.telemetry.shutdown)  # flushes pending spans: network I/O


def _unknown_model(model: str) -> tuple[int | None, int | None]:
    return None, None


def build_service(
    settings: Settings,
    store: SessionStore,
    backend: ProviderBackend,
    model_map: ModelMapLookup,
    framing_secret: bytes,
    assembler: Assembler | None = None,
    observer: CallObserver | None = None,
) -> TurnService:
    """The turn service for these settings; ``framing_secret`` is what the sessions' framing nonces derive
    from, ``assembler`` replaces the dynamic pipeline (tests), ``observer`` gets every model call."""
    check_route_limits(settings, model_map)
    for warning in pressure_warnings(settings, model_map):
        logger.warning(warning)
    factories = checked_factories(settings)
    state_config = StateConfig(state_channels(factories))
    compactor = HistoryCompactor(compaction_config(settings))
    pipeline = ContextPipeline(
        registries=RunRegistries(factories),  # each run's own contributors, composed once now to check them
        estimator=CachingEstimator(ConservativeTokenEstimator()),
        compactor=compactor,
        config=PipelineConfig(
            prompt_percent=settings.prompt_percent,
            message_percent=settings.message_percent,
            max_history_messages=settings.max_history_messages,
            state=state_config,
            detailed_trace=settings.trace_enabled,
        ),
    )
    toolbox = ProxyToolbox(ReadToolOutput(store), proxy_tools(factories))

    dynamic = SessionAssembler(
        settings, store, pipeline, toolbox, backend, settings.summary_route, state_config, framing_secret
    )
    traces = TraceWriter(settings.resolved_trace_dir) if settings.trace_enabled else None
    return TurnService(
        settings,
        store,
        assembler or dynamic,
        backend,
        traces,
        model_map,
        dynamic,
        framing_secret=framing_secret,
        calibrator=TokenCalibrator(settings, store),
        observer=observer,
        prices=getattr(backend, "model_prices", no_prices),
    )


def compaction_config(settings: Settings) -> CompactionConfig:
    """The compactor's knobs from the settings: the pressure percentages and the summary retry bounds."""
    return CompactionConfig(
        pressure=PressureConfig(settings.pressure_percent, settings.target_percent, settings.forced_percent),
        max_summary_attempts=settings.summary_max_attempts,
        max_summary_rounds=settings.summary_max_rounds,
    )


def pressure_warnings(settings: Settings, model_map: ModelMapLookup) -> list[str]:
    """What start-up warns about: each compaction percentage that a route's window and output reserve
    clamp to its ceiling below the effective limit (``proxy/context/pressure.py``), naming the setting,
    the route and the value used. Routes are known at start-up only from the config's ``model_list``, or
    for every model when ``MODEL_MAX_TOKENS`` and ``OUTPUT_RESERVE_TOKENS`` are both set."""
    routes = settings.models
    if not routes and settings.model_max_tokens is not None and settings.output_reserve_tokens is not None:
        routes = (ModelRoute("every model", {"model": "every model"}),)
    config = PressureConfig(settings.pressure_percent, settings.target_percent, settings.forced_percent)
    warnings = []
    for route in routes:
        limits = resolve_limits(settings, route, model_map)
        limit, window = limits.effective_input_tokens, limits.window_tokens
        levels = pressure_levels(limit, window, config)
        for name, level, use in (
            ("SCIENCE_AGENT_CONTEXT_PRESSURE_PERCENT", levels.threshold, "compaction fires at"),
            ("SCIENCE_AGENT_CONTEXT_TARGET_PERCENT", levels.target, "compaction aims at"),
            ("SCIENCE_AGENT_CONTEXT_FORCED_PERCENT", levels.forced, "a forced pass aims at most at"),
        ):
            if level.clamped:
                warnings.append(_clamp_warning(name, level, use, route.model_name, window, limit))
    return warnings


def _clamp_warning(name: str, level: Level, use: str, model: str, window: int, limit: int) -> str:
    return (
        f"{name}={level.percent} is {level.asked} tokens of the {window}-token context window of {model!r}, over "
        f"{level.ceiling_percent}% of its {limit}-token effective input limit (the margin compaction keeps "
        f"below it): {use} {level.tokens} tokens instead"
    )


def check_settings(settings: Settings) -> None:
    """What only the installed packages can check, done before serving: contributor options, every
    route's window against the output reserve, the store URL's options, a SQLite store no other
    process has. Raises ``ConfigError`` naming the
    setting, or ``DataFolderInUse``."""
    checked_factories(settings)
    if settings.models:
        from proxy.provider.litellm_backend import LiteLLMBackend  # deferred: litellm's import costs seconds

        check_route_limits(settings, LiteLLMBackend(settings.provider_timeout_seconds).model_map_limits)
    if settings.store_url:
        try:
            open_store(settings.store_url, settings.data_dir, settings.session_lock_seconds)
        except ValueError as exc:
            raise ConfigError(f"CONTEXT_PROXY_STORE_URL={exc}") from None
    else:
        # The store takes the lock when it opens; checking here says why in one line instead of in
        # the traceback of a failed start-up.
        sqlite = open_store(None, settings.data_dir, settings.session_lock_seconds)
        if isinstance(sqlite, SqliteSessionStore):
            sqlite.check_free()


def checked_factories(settings: Settings) -> list[FactorySource]:
    """The allowed contributor factories, each with its options validated from the config file once."""
    allow = set(settings.contributor_allow) if settings.contributor_allow is not None else None
    try:
        return configure(discover_factories(allow), settings.contributor_options)
    except OptionsInvalid as exc:
        raise ConfigError(f"config file: {exc}") from None
