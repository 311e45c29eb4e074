"""Settings are validated once, with messages that name the variable and the bad value."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.builder import check_settings
from proxy.kernel.config import ConfigError, Settings
from proxy.runtime.limits import resolve_limits


def test_defaults_without_environment():
    settings = Settings.from_env({})
    assert settings.mode == "dynamic"
    assert settings.resolved_trace_dir == Path(".context-proxy/context-traces")
    assert (settings.pressure_percent, settings.target_percent) == (80, 50)
    route = settings.route("openai/gpt-4o")
    assert route is not None and route.litellm_model == "openai/gpt-4o"  # no model list: litellm gets it as is


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"SCIENCE_AGENT_CONTEXT_MODE": "turbo"}, "SCIENCE_AGENT_CONTEXT_MODE='turbo'"),
        ({"MODEL_MAX_TOKENS": "0"}, "MODEL_MAX_TOKENS='0'"),
        ({"OUTPUT_RESERVE_TOKENS": "-1"}, "OUTPUT_RESERVE_TOKENS='-1'"),
        ({"SCIENCE_AGENT_CONTEXT_WINDOW_TOKENS": "12k"}, "SCIENCE_AGENT_CONTEXT_WINDOW_TOKENS='12k'"),
        ({"SCIENCE_AGENT_CONTEXT_PRESSURE_PERCENT": "150"}, "SCIENCE_AGENT_CONTEXT_PRESSURE_PERCENT=150"),
        ({"SCIENCE_AGENT_CONTEXT_TRACE": "maybe"}, "SCIENCE_AGENT_CONTEXT_TRACE='maybe'"),
        ({"CONTEXT_PROXY_TEAM_HEADER": "x-team"}, "CONTEXT_PROXY_TEAM_HEADER='x-team' needs"),
        ({"CONTEXT_PROXY_TEAM_HEADER_FROM": "10.0.0.0/33"}, "CONTEXT_PROXY_TEAM_HEADER_FROM: '10.0.0.0/33'"),
        ({"CONTEXT_PROXY_KEY_CACHE_SECONDS": "301"}, "CONTEXT_PROXY_KEY_CACHE_SECONDS=301"),
        ({"CONTEXT_PROXY_METRICS_TEAMS": "0"}, "CONTEXT_PROXY_METRICS_TEAMS='0'"),
    ],
)
def test_bad_values_stop_start_up_naming_the_variable(env, named):
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        Settings.from_env(env)


def test_a_store_url_that_is_not_postgresql_stops_start_up_naming_the_variable(tmp_path):
    settings = Settings.from_env({"CONTEXT_PROXY_STORE_URL": "mysql://x", "SCIENCE_AGENT_DATA_DIR": str(tmp_path)})
    with pytest.raises(ConfigError, match="CONTEXT_PROXY_STORE_URL='mysql://x' is not a postgresql:// URL"):
        check_settings(settings)


def test_model_list_with_env_secrets_and_limits(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: lab-gpt\n"
        "    litellm_params: {model: openai/gpt-4o, api_key: os.environ/LAB_KEY, api_base: 'http://x/v1'}\n"
        "    model_info: {max_input_tokens: 32000, max_output_tokens: 1000}\n"
    )
    settings = Settings.from_env({"LAB_KEY": "sk-lab"}, config_path=config)
    route = settings.route("lab-gpt")
    assert route is not None
    assert route.litellm_params == {"model": "openai/gpt-4o", "api_key": "sk-lab", "api_base": "http://x/v1"}
    assert settings.route("gpt-4o") is None  # with a list, only its names are served
    limits = resolve_limits(settings, route, lambda model: (None, None))
    assert (limits.model_max_tokens, limits.output_reserve_tokens, limits.effective_input_tokens) == (
        32000,
        1000,
        31000,
    )


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("model_list:\n  - model_name: a\n    litellm_params: {model: x, api_key: os.environ/NOPE}\n", "NOPE"),
        ("model_list:\n  - model_name: a\n    litellm_params: {model: x}\n    colour: red\n", "colour"),
        ("model_list:\n  - model_name: a\n", "litellm_params"),
        ("model_list: [\n", "not valid YAML"),
        (
            "model_list:\n  - {model_name: a, litellm_params: {model: x}}\n"
            "  - {model_name: a, litellm_params: {model: y}}\n",
            "appears twice",
        ),
    ],
)
def test_bad_config_files_are_refused_with_the_key(tmp_path, text, named):
    config = tmp_path / "config.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=named):
        Settings.from_env({}, config_path=config)


def test_limit_overrides_and_window_cap():
    settings = Settings.from_env({"MODEL_MAX_TOKENS": "20000", "SCIENCE_AGENT_CONTEXT_WINDOW_TOKENS": "9000"})
    route = settings.route("openai/gpt-4o")
    assert route is not None
    limits = resolve_limits(settings, route, lambda model: (128000, 16384))
    assert (limits.model_max_tokens, limits.output_reserve_tokens, limits.effective_input_tokens) == (20000, 4096, 9000)
    assert limits.source == "env"
    smaller = limits.with_model_max(8192, source="provider_error")
    assert smaller.effective_input_tokens == 8192 - 4096


def test_request_message_cap_and_shutdown_grace_are_read_and_checked():
    settings = Settings.from_env({})
    assert (settings.max_request_messages, settings.shutdown_grace_seconds) == (100_000, 30)
    settings = Settings.from_env(
        {"CONTEXT_PROXY_MAX_REQUEST_MESSAGES": "500", "CONTEXT_PROXY_SHUTDOWN_GRACE_SECONDS": "5"}
    )
    assert (settings.max_request_messages, settings.shutdown_grace_seconds) == (500, 5)
    for name in ("CONTEXT_PROXY_MAX_REQUEST_MESSAGES", "CONTEXT_PROXY_SHUTDOWN_GRACE_SECONDS"):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env({name: "-1"})


@pytest.mark.parametrize(("window", "reserve"), [(8000, 8000), (8000, 9500)])
def test_an_output_reserve_that_fills_the_env_window_stops_start_up_naming_both(window, reserve):
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"MODEL_MAX_TOKENS": str(window), "OUTPUT_RESERVE_TOKENS": str(reserve)})
    assert f"OUTPUT_RESERVE_TOKENS={reserve}" in str(refused.value)
    assert f"MODEL_MAX_TOKENS={window}" in str(refused.value)
    # One token below the window is a (tiny) input limit, not nonsense: accepted.
    Settings.from_env({"MODEL_MAX_TOKENS": str(window), "OUTPUT_RESERVE_TOKENS": str(window - 1)})


SUMMARY_SETTINGS = [
    ("SCIENCE_AGENT_SUMMARY_MAX_ATTEMPTS", "summary_max_attempts", 2, 5),
    ("SCIENCE_AGENT_SUMMARY_MAX_ROUNDS", "summary_max_rounds", 3, 10),
    ("SCIENCE_AGENT_SUMMARY_RETRY_AFTER_MESSAGES", "summary_retry_after_messages", 20, 10_000),
]


@pytest.mark.parametrize(("name", "field", "default", "maximum"), SUMMARY_SETTINGS)
def test_summary_retry_bounds_are_settings_with_the_old_defaults(name, field, default, maximum):
    assert getattr(Settings.from_env({}), field) == default
    assert getattr(Settings(), field) == default
    assert getattr(Settings.from_env({name: "1"}), field) == 1
    assert getattr(Settings.from_env({name: str(maximum)}), field) == maximum


@pytest.mark.parametrize(("name", "field", "default", "maximum"), SUMMARY_SETTINGS)
@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5"])
def test_a_bad_summary_retry_bound_stops_start_up_naming_it(name, field, default, maximum, bad):
    with pytest.raises(ConfigError, match=f"{name}='{bad}' is not a positive integer"):
        Settings.from_env({name: bad})


@pytest.mark.parametrize(("name", "field", "default", "maximum"), SUMMARY_SETTINGS)
def test_a_summary_retry_bound_over_its_maximum_stops_start_up_naming_it(name, field, default, maximum):
    with pytest.raises(ConfigError, match=f"{name}={maximum + 1} must be at most {maximum}"):
        Settings.from_env({name: str(maximum + 1)})


def test_a_team_header_with_its_secret_and_networks() -> None:
    env = {
        "CONTEXT_PROXY_TEAM_HEADER": "X-Team",
        "CONTEXT_PROXY_TEAM_HEADER_SECRET": "s",
        "CONTEXT_PROXY_TEAM_HEADER_FROM": "10.0.0.0/8, ::1",
    }
    settings = Settings.from_env(env)
    assert (settings.team_header, settings.team_header_secret) == ("x-team", "s")
    assert settings.team_header_from == ("10.0.0.0/8", "::1")
