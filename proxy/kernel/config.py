"""Settings from the environment and the YAML config file, validated once at start-up.

Every problem stops start-up with a ``ConfigError`` whose message names the variable (or config key)
and the bad value; nothing downstream re-validates.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from proxy.kernel.client_params import steering_reason
from proxy.kernel.route_api import Api, default_api, provider_of

Mode = Literal["dynamic", "shadow", "legacy"]
MODES: tuple[Mode, ...] = ("dynamic", "shadow", "legacy")
EstimatorName = Literal["calibrated", "tiktoken", "conservative"]
ESTIMATORS: tuple[EstimatorName, ...] = ("calibrated", "tiktoken", "conservative")
# The server's log levels, as uvicorn names them; below ``info`` its access log (a line per request) is off.
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
_ENV_SECRET_PREFIX = "os.environ/"
# Upper bounds of the summary retry settings: each attempt is a model call made while the client waits
# (up to attempts x rounds of them in one turn), and a back-off longer than a long run never retries.
MAX_SUMMARY_ATTEMPTS = 5
MAX_SUMMARY_ROUNDS = 10
MAX_SUMMARY_RETRY_AFTER_MESSAGES = 10_000
_MODEL_CALLS = "every summary attempt is a model call the client's turn waits for"


class ConfigError(Exception):
    """A setting is missing or invalid; the message names it."""


class ModelInfo(BaseModel):
    """Operator-declared limits of a model (litellm-proxy ``model_info``)."""

    model_config = ConfigDict(extra="allow")
    max_input_tokens: int | None = Field(default=None, gt=0)
    max_output_tokens: int | None = Field(default=None, gt=0)


class LitellmParams(BaseModel):
    """How litellm reaches the provider; every extra key is passed to ``litellm.acompletion``."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)


class ModelEntry(BaseModel):
    """One ``model_list`` entry: what clients call it and how litellm reaches it."""

    model_config = ConfigDict(extra="forbid")
    model_name: str = Field(min_length=1)
    litellm_params: LitellmParams
    model_info: ModelInfo = Field(default_factory=ModelInfo)
    # Top-level request fields beyond OpenAI's that clients may send on this route (vLLM's ``top_k``,
    # ``chat_template_kwargs``); a sibling of litellm_params, because it is the route's policy towards
    # clients, not a litellm argument nor a fact about the model.
    allowed_client_params: list[str] = Field(default_factory=list)
    # Which API the provider is spoken to in (proxy/kernel/route_api.py); unset: litellm's provider decides.
    api: Api | None = None
    # On a native route, the server-side tools (Anthropic's server tools, OpenAI's hosted tools) and the
    # Anthropic betas a client may use: they run on the operator's key. Unset: all of them.
    allowed_server_tools: list[str] | None = None
    allowed_betas: list[str] | None = None
    # Send an assistant message without content (a tool call) with ``content: ""`` instead of null: for
    # servers whose chat template concatenates the content (llama.cpp serving SmolLM2 fails on null).
    null_content_as_empty: bool = False
    # The server's tokenizer endpoint (llama-cpp-python: <root>/extras/tokenize, llama.cpp: <root>/tokenize):
    # calibration counts with it when an answer carries no usage (a llama-cpp-python stream).
    tokenizer_url: str | None = Field(default=None, pattern=r"^https?://\S+$")

    @field_validator("allowed_client_params")
    @classmethod
    def _no_steering(cls, names: list[str]) -> list[str]:
        for name in names:
            if not name or not name.isidentifier():
                raise ValueError(f"{name!r} is not a parameter name")
            if (reason := steering_reason(name)) is not None:
                raise ValueError(f"{name!r} cannot be allowed: {reason}")
        return names


class ConfigFile(BaseModel):
    """The YAML config file: a litellm-proxy style ``model_list``, plus operator options for contributors."""

    model_config = ConfigDict(extra="forbid")
    model_list: list[ModelEntry] = Field(default_factory=list)
    # Keyed by contributor id (e.g. ``governance: {policy: ...}``, ``skills: {folder: ...}``); each
    # contributor validates its own options.
    contributors: dict[str, dict[str, Any]] = Field(default_factory=dict)


@dataclass(frozen=True)
class ModelRoute:
    """A client model name resolved to litellm call parameters and the operator's declared limits."""

    model_name: str
    litellm_params: dict[str, Any]  # includes "model"; secrets already resolved
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    allowed_client_params: frozenset[str] = frozenset()  # request fields beyond OpenAI's, see client_params
    configured_api: Api | None = None  # the operator's ``api:``; None: the provider's default (``api``)
    allowed_server_tools: frozenset[str] | None = None  # None: every server-side tool may be used
    allowed_betas: frozenset[str] | None = None  # None: every Anthropic beta may be sent
    null_content_as_empty: bool = False  # assistant content null sent as "" (chat templates that need a string)
    tokenizer_url: str | None = None  # the server's tokenizer endpoint: calibration when an answer has no usage

    @property
    def litellm_model(self) -> str:
        """The model string litellm receives."""
        return str(self.litellm_params["model"])

    @property
    def api(self) -> Api:
        """The API this route's provider is spoken to in (``proxy/kernel/route_api.py``)."""
        return self.configured_api or default_api(self.litellm_params)[0]

    @property
    def api_reason(self) -> str:
        """Why the route speaks ``api``: the operator set it, or the provider's default and its reason."""
        if self.configured_api is not None:
            return "set by the route's api:"
        return default_api(self.litellm_params)[1]


@dataclass(frozen=True)
class Settings:
    """Everything the proxy reads from its environment and config file."""

    mode: Mode = "dynamic"
    data_dir: Path = Path(".context-proxy")
    store_url: str | None = None
    master_key: str | None = None
    models: tuple[ModelRoute, ...] = ()
    context_window_tokens: int | None = None
    model_max_tokens: int | None = None
    output_reserve_tokens: int | None = None
    pressure_percent: int = 80
    target_percent: int = 50
    forced_percent: int = 35  # where the forced pass after a provider overflow aims
    summary_model: str | None = None
    trace_enabled: bool = False
    trace_dir: Path | None = None
    example_dir: Path | None = None
    contributor_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    contributor_allow: frozenset[str] | None = None  # entry-point or distribution names; None loads all
    max_request_bytes: int = 32 * 1024 * 1024
    max_request_messages: int = 100_000  # refused with 400 beyond this; not the trimming cap below
    shutdown_grace_seconds: int = 30  # in-flight requests get this long to finish on shutdown
    session_lock_seconds: int = 60
    provider_timeout_seconds: int = 600
    max_tool_rounds: int = 4  # proxy-owned tool rounds per client request
    allow_mode_header: bool = False  # let a request choose shadow or legacy with x-context-mode
    allow_unauthenticated: bool = False  # serve a non-loopback address without a master key
    max_history_messages: int | None = None  # the message-count cap (unset: none)
    # Pins the secret the framing nonces derive from (tests, cassettes, examples: byte-identical provider
    # input); unset, the store's own secret is used, made once and shared by every replica.
    framing_secret: bytes | None = None
    # How tokens are counted: tiktoken corrected by the providers' reported usage, tiktoken alone, or the
    # tokenizer-free upper estimate; before a route has samples, calibrated counts are tiktoken times
    # ``estimator_start_percent`` / 100.
    estimator: EstimatorName = "calibrated"
    estimator_start_percent: int = 125
    record_dir: Path | None = None  # record and replay: where client requests and provider exchanges go
    log_level: str = "info"  # one of LOG_LEVELS: the proxy's own logging and uvicorn's
    prompt_percent: int = 25  # the system prompt's share of the effective limit
    message_percent: int = 10  # contributor messages' and attachments' share
    # The bound on summary retries (SPEC: a rejected checkpoint is "retried within the configured bound"):
    # attempts per summarization round (remote compaction's too), rounds per compaction pass, and how
    # many messages the history must grow by before a failed summarization is tried again.
    summary_max_attempts: int = 2
    summary_max_rounds: int = 3
    summary_retry_after_messages: int = 20
    # Teams: how long a virtual key is served from memory before the store is asked again (the bound on
    # a revocation reaching every replica), and how many of the busiest teams get their own metrics label.
    key_cache_seconds: int = 5
    metrics_teams: int = 10
    # Behind an authenticating gateway: the header naming a request's team, trusted only with the gateway's
    # shared secret (sent as GATEWAY_SECRET_HEADER) or from the networks named (never from a bare client).
    team_header: str | None = None
    team_header_secret: str | None = None
    team_header_from: tuple[str, ...] = ()

    @property
    def resolved_trace_dir(self) -> Path:
        """Where traces go: the explicit folder, else ``<data-dir>/context-traces``."""
        return self.trace_dir if self.trace_dir is not None else self.data_dir / "context-traces"

    def route(self, model_name: str) -> ModelRoute | None:
        """The route for a client model name; without a model list every name goes to litellm as is."""
        if not self.models:
            return ModelRoute(model_name=model_name, litellm_params={"model": model_name})
        for route in self.models:
            if route.model_name == model_name:
                return route
        return None

    def summary_route(self, request_route: ModelRoute) -> ModelRoute:
        """The route that writes checkpoints: ``SCIENCE_AGENT_SUMMARY_MODEL``'s, else the request's own."""
        chosen = self.route(self.summary_model) if self.summary_model else None
        return chosen or request_route

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, config_path: Path | None = None) -> Settings:
        """Read and validate the settings; raises ``ConfigError`` naming the first bad one."""
        env = os.environ if environ is None else environ
        mode = env.get("SCIENCE_AGENT_CONTEXT_MODE", "").strip() or "dynamic"
        if mode not in MODES:
            raise ConfigError(f"SCIENCE_AGENT_CONTEXT_MODE={mode!r} is not one of {', '.join(MODES)}")
        store_url = env.get("CONTEXT_PROXY_STORE_URL", "").strip() or None
        log_level = env.get("CONTEXT_PROXY_LOG_LEVEL", "").strip().lower() or "info"
        if log_level not in LOG_LEVELS:
            raise ConfigError(f"CONTEXT_PROXY_LOG_LEVEL={log_level!r} is not one of {', '.join(LOG_LEVELS)}")
        pressure = _percent(env, "SCIENCE_AGENT_CONTEXT_PRESSURE_PERCENT", 80)
        target = _percent(env, "SCIENCE_AGENT_CONTEXT_TARGET_PERCENT", 50)
        forced = _percent(env, "SCIENCE_AGENT_CONTEXT_FORCED_PERCENT", 35)
        if not forced < target < pressure:
            raise ConfigError(
                "need SCIENCE_AGENT_CONTEXT_FORCED_PERCENT < SCIENCE_AGENT_CONTEXT_TARGET_PERCENT < "
                f"SCIENCE_AGENT_CONTEXT_PRESSURE_PERCENT, got {forced} / {target} / {pressure}"
            )
        estimator = env.get("SCIENCE_AGENT_CONTEXT_ESTIMATOR", "").strip() or "calibrated"
        if estimator not in ESTIMATORS:
            raise ConfigError(f"SCIENCE_AGENT_CONTEXT_ESTIMATOR={estimator!r} is not one of {', '.join(ESTIMATORS)}")
        start_percent = _positive(env, "SCIENCE_AGENT_CONTEXT_ESTIMATOR_START_PERCENT") or cls.estimator_start_percent
        if not 100 <= start_percent <= 400:
            raise ConfigError(
                f"SCIENCE_AGENT_CONTEXT_ESTIMATOR_START_PERCENT={start_percent} must be between 100 and 400"
            )
        config = _load_config(config_path) if config_path is not None else ConfigFile()
        model_max, reserve = _positive(env, "MODEL_MAX_TOKENS"), _positive(env, "OUTPUT_RESERVE_TOKENS")
        if model_max is not None and reserve is not None and reserve >= model_max:
            raise ConfigError(
                f"OUTPUT_RESERVE_TOKENS={reserve} is not below MODEL_MAX_TOKENS={model_max}: "
                "nothing would be left for the input"
            )
        models = _routes(config, config_path or Path("-"), env)
        allow = env.get("CONTEXT_PROXY_CONTRIBUTORS", "").strip()
        summary_model = env.get("SCIENCE_AGENT_SUMMARY_MODEL", "").strip() or None
        if summary_model is not None and models and summary_model not in {r.model_name for r in models}:
            raise ConfigError(f"SCIENCE_AGENT_SUMMARY_MODEL={summary_model!r} is not a model_name of the config file")
        return cls(
            mode=mode,  # checked against MODES above
            estimator=estimator,  # checked against ESTIMATORS above
            estimator_start_percent=start_percent,
            data_dir=Path(env.get("SCIENCE_AGENT_DATA_DIR", "") or ".context-proxy"),
            store_url=store_url,
            master_key=env.get("CONTEXT_PROXY_MASTER_KEY") or None,
            models=models,
            contributor_options=config.contributors,
            contributor_allow=frozenset(n.strip() for n in allow.split(",") if n.strip()) if allow else None,
            context_window_tokens=_positive(env, "SCIENCE_AGENT_CONTEXT_WINDOW_TOKENS"),
            model_max_tokens=_positive(env, "MODEL_MAX_TOKENS"),
            output_reserve_tokens=_positive(env, "OUTPUT_RESERVE_TOKENS"),
            pressure_percent=pressure,
            target_percent=target,
            forced_percent=forced,
            summary_model=summary_model,
            trace_enabled=_flag(env, "SCIENCE_AGENT_CONTEXT_TRACE"),
            trace_dir=Path(env["SCIENCE_AGENT_CONTEXT_TRACE_DIR"])
            if env.get("SCIENCE_AGENT_CONTEXT_TRACE_DIR")
            else None,
            record_dir=Path(env["CONTEXT_PROXY_RECORD_DIR"]) if env.get("CONTEXT_PROXY_RECORD_DIR") else None,
            log_level=log_level,
            example_dir=(
                Path(env["SCIENCE_AGENT_CONTEXT_EXAMPLE_DIR"]) if env.get("SCIENCE_AGENT_CONTEXT_EXAMPLE_DIR") else None
            ),
            max_request_bytes=_positive(env, "CONTEXT_PROXY_MAX_REQUEST_BYTES") or cls.max_request_bytes,
            max_request_messages=(_positive(env, "CONTEXT_PROXY_MAX_REQUEST_MESSAGES") or cls.max_request_messages),
            shutdown_grace_seconds=(
                _positive(env, "CONTEXT_PROXY_SHUTDOWN_GRACE_SECONDS") or cls.shutdown_grace_seconds
            ),
            session_lock_seconds=_positive(env, "CONTEXT_PROXY_SESSION_LOCK_SECONDS") or cls.session_lock_seconds,
            max_tool_rounds=_positive(env, "SCIENCE_AGENT_CONTEXT_MAX_TOOL_ROUNDS") or cls.max_tool_rounds,
            allow_mode_header=_flag(env, "CONTEXT_PROXY_ALLOW_MODE_HEADER"),
            allow_unauthenticated=_flag(env, "CONTEXT_PROXY_ALLOW_UNAUTHENTICATED"),
            **_team_header(env),
            max_history_messages=_positive(env, "SCIENCE_AGENT_CONTEXT_MAX_MESSAGES"),
            prompt_percent=_percent(env, "SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT", cls.prompt_percent),
            message_percent=_percent(env, "SCIENCE_AGENT_CONTEXT_MESSAGE_PERCENT", cls.message_percent),
            provider_timeout_seconds=(
                _positive(env, "CONTEXT_PROXY_PROVIDER_TIMEOUT_SECONDS") or cls.provider_timeout_seconds
            ),
            summary_max_attempts=_bounded(
                env, "SCIENCE_AGENT_SUMMARY_MAX_ATTEMPTS", cls.summary_max_attempts, MAX_SUMMARY_ATTEMPTS, _MODEL_CALLS
            ),
            summary_max_rounds=_bounded(
                env, "SCIENCE_AGENT_SUMMARY_MAX_ROUNDS", cls.summary_max_rounds, MAX_SUMMARY_ROUNDS, _MODEL_CALLS
            ),
            key_cache_seconds=_bounded(
                env, "CONTEXT_PROXY_KEY_CACHE_SECONDS", cls.key_cache_seconds, 300, "a revoked key would work too long"
            ),
            metrics_teams=_bounded(
                env, "CONTEXT_PROXY_METRICS_TEAMS", cls.metrics_teams, 1000, "too many series for Prometheus"
            ),
            summary_retry_after_messages=_bounded(
                env,
                "SCIENCE_AGENT_SUMMARY_RETRY_AFTER_MESSAGES",
                cls.summary_retry_after_messages,
                MAX_SUMMARY_RETRY_AFTER_MESSAGES,
                "a failed summarization would practically never be tried again",
            ),
        )


def _team_header(env: Mapping[str, str]) -> dict[str, Any]:
    """``CONTEXT_PROXY_TEAM_HEADER`` and what makes it trusted: a secret, or the gateway's networks."""
    header = env.get("CONTEXT_PROXY_TEAM_HEADER", "").strip().lower() or None
    secret = env.get("CONTEXT_PROXY_TEAM_HEADER_SECRET", "").strip() or None
    networks = tuple(n.strip() for n in env.get("CONTEXT_PROXY_TEAM_HEADER_FROM", "").split(",") if n.strip())
    for network in networks:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            raise ConfigError(f"CONTEXT_PROXY_TEAM_HEADER_FROM: {network!r} is not an address or a network") from None
    if header is not None and secret is None and not networks:
        raise ConfigError(
            f"CONTEXT_PROXY_TEAM_HEADER={header!r} needs CONTEXT_PROXY_TEAM_HEADER_SECRET or "
            "CONTEXT_PROXY_TEAM_HEADER_FROM: a team header from a bare client would name any team"
        )
    if header is not None and not re.fullmatch(r"[a-z0-9-]{1,64}", header):
        raise ConfigError(f"CONTEXT_PROXY_TEAM_HEADER={header!r} is not a header name")
    return {"team_header": header, "team_header_secret": secret, "team_header_from": networks}


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw not in ("", "0", "1", "true", "false", "yes", "no", "on", "off"):
        raise ConfigError(f"{name}={raw!r} is not a boolean (use 1 or 0)")
    return raw in ("1", "true", "yes", "on")


def _positive(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a positive integer") from None
    if value <= 0:
        raise ConfigError(f"{name}={raw!r} is not a positive integer")
    return value


def _bounded(env: Mapping[str, str], name: str, default: int, maximum: int, why: str) -> int:
    value = _positive(env, name)
    if value is None:
        return default
    if value > maximum:
        raise ConfigError(f"{name}={value} must be at most {maximum}: {why}")
    return value


def _percent(env: Mapping[str, str], name: str, default: int) -> int:
    value = _positive(env, name)
    if value is None:
        return default
    if value > 100:
        raise ConfigError(f"{name}={value} is a percentage and must be at most 100")
    return value


def _load_config(path: Path) -> ConfigFile:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot be read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML ({exc})") from None
    try:
        config = ConfigFile.model_validate(raw or {})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors(include_url=False)
        )
        raise ConfigError(f"config file {path}: {problems}") from None
    return config


def _routes(config: ConfigFile, path: Path, env: Mapping[str, str]) -> tuple[ModelRoute, ...]:
    seen: set[str] = set()
    routes = []
    for index, entry in enumerate(config.model_list):
        if entry.model_name in seen:
            raise ConfigError(f"config file {path}: model_list[{index}].model_name {entry.model_name!r} appears twice")
        seen.add(entry.model_name)
        params = {
            key: _resolve_secret(value, env, f"model_list[{index}].litellm_params.{key}", path)
            for key, value in entry.litellm_params.model_dump().items()
        }
        _check_api(entry, params, f"config file {path}: model_list[{index}].api")
        routes.append(
            ModelRoute(
                model_name=entry.model_name,
                litellm_params=params,
                max_input_tokens=entry.model_info.max_input_tokens,
                max_output_tokens=entry.model_info.max_output_tokens,
                allowed_client_params=frozenset(entry.allowed_client_params),
                configured_api=entry.api,
                allowed_server_tools=_names(entry.allowed_server_tools),
                allowed_betas=_names(entry.allowed_betas),
                null_content_as_empty=entry.null_content_as_empty,
                tokenizer_url=entry.tokenizer_url,
            )
        )
    return tuple(routes)


# The APIs the proxy sends natively, and the litellm provider each needs (native_transport.py speaks them).
_NATIVE_PROVIDERS = {"messages": "anthropic", "responses": "openai"}


def _check_api(entry: ModelEntry, params: Mapping[str, Any], where: str) -> None:
    """A route set to a native API must be one whose provider speaks it."""
    needed = _NATIVE_PROVIDERS.get(entry.api or "")
    provider = provider_of(params)
    if needed is not None and provider != needed:
        raise ConfigError(
            f"{where}: {entry.api} is spoken to {needed}/ routes only; this route's litellm provider is "
            f"{provider or 'unknown'} (use api: chat)"
        )


def _names(names: list[str] | None) -> frozenset[str] | None:
    return None if names is None else frozenset(names)


def _resolve_secret(value: Any, env: Mapping[str, str], where: str, path: Path) -> Any:
    """``os.environ/NAME`` becomes the variable's value, as in litellm-proxy configs."""
    if isinstance(value, str) and value.startswith(_ENV_SECRET_PREFIX):
        name = value[len(_ENV_SECRET_PREFIX) :]
        if name not in env:
            raise ConfigError(f"config file {path}: {where} names the environment variable {name}, which is not set")
        return env[name]
    return value
