"""Which API a route speaks: the operator's ``api:``, else the default litellm's provider implies."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli import main
from proxy.kernel.config import ConfigError, ModelRoute, Settings
from proxy.kernel.route_api import default_api, provider_of


@pytest.mark.parametrize(
    ("params", "api"),
    [
        ({"model": "anthropic/claude-sonnet-4-5"}, "messages"),
        ({"model": "claude-sonnet-4-5"}, "messages"),  # litellm's own guess for a bare name
        ({"model": "openai/gpt-5-codex"}, "responses"),
        ({"model": "openai/gpt-5-codex", "api_base": "https://api.openai.com/v1"}, "responses"),
        ({"model": "gpt-4o"}, "responses"),
        ({"model": "openai/qwen", "api_base": "http://127.0.0.1:8080/v1"}, "chat"),  # llama.cpp, vLLM
        ({"model": "hosted_vllm/Qwen/Qwen3-8B", "api_base": "http://vllm:8000/v1"}, "chat"),
        ({"model": "azure/gpt-4o", "api_base": "https://x.openai.azure.com"}, "chat"),
        ({"model": "bedrock/anthropic.claude-3"}, "chat"),
        ({"model": "my-model", "custom_llm_provider": "anthropic"}, "messages"),
    ],
)
def test_the_default_follows_litellms_provider(params: dict[str, str], api: str) -> None:
    assert default_api(params)[0] == api
    assert ModelRoute("m", params).api == api


def test_provider_of_names_litellms_provider() -> None:
    assert provider_of({"model": "openai/x", "custom_llm_provider": "azure"}) == "azure"
    assert provider_of({"model": "mystery"}) == ""


def _config(tmp_path: Path, entry: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"model_list:\n  - model_name: m\n    litellm_params: {{model: anthropic/claude-x}}\n{entry}")
    return path


def test_the_operator_sets_the_api_and_the_server_side_tools_and_betas(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        "    api: chat\n    allowed_server_tools: [web_search]\n    allowed_betas: [interleaved-thinking-2025-05-14]\n",
    )
    (route,) = Settings.from_env({}, config_path=config).models
    assert route.api == "chat" and route.api_reason == "set by the route's api:"
    assert route.allowed_server_tools == frozenset({"web_search"})
    assert route.allowed_betas == frozenset({"interleaved-thinking-2025-05-14"})
    (default,) = Settings.from_env({}, config_path=_config(tmp_path, "")).models
    assert default.api == "messages" and "Messages" in default.api_reason
    assert default.allowed_server_tools is None and default.allowed_betas is None


def test_an_unknown_api_stops_start_up_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="api"):
        Settings.from_env({}, config_path=_config(tmp_path, "    api: grpc\n"))


def test_the_routes_command_shows_each_routes_api_and_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["routes", "--config", str(_config(tmp_path, ""))]) == 0
    line = capsys.readouterr().out.strip()
    assert line.split("\t")[:3] == ["m", "anthropic/claude-x", "messages"]


@pytest.mark.parametrize(("model", "api"), [("hosted_vllm/q", "messages"), ("anthropic/claude-x", "responses")])
def test_a_native_api_on_a_provider_that_does_not_speak_it_stops_start_up(tmp_path: Path, model: str, api: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"model_list:\n  - model_name: m\n    litellm_params: {{model: {model}}}\n    api: {api}\n")
    with pytest.raises(ConfigError, match=rf"model_list\[0\]\.api: {api} is spoken to"):
        Settings.from_env({}, config_path=path)
