"""Builds the turn runner from the settings: the contributor registries, the pipeline, the tools.

Everything is composed once at start-up; the registries are frozen, so no package can change them
while sessions run.
"""

from __future__ import annotations

from proxy.context.compactor import CompactionConfig, HistoryCompactor
from proxy.context.estimators import CachingEstimator, ConservativeTokenEstimator
from proxy.context.pipeline import ContextPipeline, PipelineConfig
from proxy.context.pressure import PressureConfig
from proxy.context.registry import (
    ContextContributorRegistry,
    FactorySource,
    OptionsInvalid,
    configure,
    discover_factories,
    proxy_tools,
    state_channels,
)
from proxy.context.state import StateConfig
from proxy.context.types import SCOPES
from proxy.kernel.config import ConfigError, ModelRoute, Settings
from proxy.observe.call_facts import CallObserver
from proxy.provider.litellm_backend import ProviderBackend
from proxy.runtime.assembly import Assembler
from proxy.runtime.calibration import TokenCalibrator
from proxy.runtime.limits import ModelMapLookup, check_route_limits
from proxy.runtime.proxy_tools import ProxyToolbox, ReadToolOutput
from proxy.runtime.service import TurnRunner
from proxy.runtime.session_assembler import SessionAssembler
from proxy.runtime.trace import TraceWriter
from proxy.session import SqliteSessionStore, open_store
from proxy.session.store import SessionStore


def build_runner(
    settings: Settings,
    store: SessionStore,
    backend: ProviderBackend,
    model_map: ModelMapLookup,
    framing_secret: bytes,
    assembler: Assembler | None = None,
    observer: CallObserver | None = None,
) -> TurnRunner:
    """The runner for these settings; ``framing_secret`` is what the sessions' framing nonces derive
    from, ``assembler`` replaces the dynamic pipeline (tests), ``observer`` gets every model call."""
    check_route_limits(settings, model_map)
    factories = checked_factories(settings)
    state_config = StateConfig(state_channels(factories))
    registries = {scope: ContextContributorRegistry(scope, factories) for scope in SCOPES}
    compactor = HistoryCompactor(
        CompactionConfig(
            pressure=PressureConfig(settings.pressure_percent, settings.target_percent, settings.forced_percent)
        )
    )
    pipeline = ContextPipeline(
        registries=lambda scope: registries[scope],
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

    def summary_route(request_route: ModelRoute) -> ModelRoute:
        chosen = settings.route(settings.summary_model) if settings.summary_model else None
        return chosen or request_route

    dynamic = SessionAssembler(settings, store, pipeline, toolbox, backend, summary_route, state_config, framing_secret)
    traces = TraceWriter(settings.resolved_trace_dir) if settings.trace_enabled else None
    return TurnRunner(
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
