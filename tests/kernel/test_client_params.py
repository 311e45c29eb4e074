"""The allow-list of client request fields: OpenAI's schema, session fields, and what a route allows."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.kernel.client_params import (
    OPENAI_REQUEST_FIELDS,
    check_client_params,
    client_arguments,
    steering_reason,
    with_route,
)
from proxy.kernel.config import ConfigError, Settings
from proxy.kernel.errors import InvalidRequest
from proxy.process.offline import prepare_offline_environment

SCHEMAS = json.loads((Path(__file__).parents[1] / "data" / "openai-chat-schemas.json").read_text())


def _properties(node: dict[str, Any], defs: dict[str, Any]) -> set[str]:
    """The properties of a schema, following ``allOf`` and ``$ref`` into its ``$defs``."""
    found = set(node.get("properties", {}))
    if "$ref" in node:
        found |= _properties(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    for part in node.get("allOf", []):
        found |= _properties(part, defs)
    return found


def test_the_allow_list_is_the_schemas_request_properties():
    request = SCHEMAS["schemas"]["CreateChatCompletionRequest"]
    assert _properties(request, request["$defs"]) == OPENAI_REQUEST_FIELDS


def _litellm_arguments() -> set[str]:
    prepare_offline_environment()
    import litellm
    from litellm.types.utils import all_litellm_params

    signature = set(inspect.signature(litellm.acompletion).parameters) - {"kwargs", "args"}
    return (set(all_litellm_params) | signature) - OPENAI_REQUEST_FIELDS


def test_every_litellm_argument_is_refused_naming_it():
    names = _litellm_arguments() | {"extra_body"}
    assert {"base_url", "api_base", "api_key", "extra_headers", "mock_response", "fallbacks"} <= names
    for name in sorted(names - {"litellm_session_id"}):
        with pytest.raises(InvalidRequest) as caught:
            check_client_params({"model": "m", "messages": [], name: "x"})
        assert (caught.value.status, caught.value.code, caught.value.param) == (400, "unsupported_parameter", name)


def test_openai_fields_session_field_and_route_extensions_pass():
    body = {name: None for name in OPENAI_REQUEST_FIELDS} | {"litellm_session_id": "s1"}
    check_client_params(body)
    check_client_params({"model": "m", "top_k": 5}, allowed={"top_k"})
    with pytest.raises(InvalidRequest, match="top_k"):
        check_client_params({"model": "m", "top_k": 5})


def test_client_arguments_keep_openai_fields_and_drop_session_and_metadata():
    body = {
        "model": "client-name",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.3,
        "user": "u-7",
        "litellm_session_id": "s1",
        "metadata": {"session_id": "s1", "tag": "a"},
        "top_k": 4,
    }
    assert client_arguments(body, {"top_k"}) == {
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.3,
        "user": "u-7",
        "top_k": 4,
    }


def test_metadata_reaches_the_provider_only_for_a_stored_completion_without_the_proxys_keys():
    metadata = {"session_id": "s1", "litellm_session_id": "s2", "run_contract": "x", "tag": "a"}
    stored = client_arguments({"model": "m", "store": True, "metadata": metadata})
    assert stored == {"store": True, "extra_body": {"metadata": {"tag": "a"}}}
    assert "metadata" not in stored  # never litellm's own logging metadata
    assert client_arguments({"model": "m", "store": True, "metadata": {"session_id": "s1"}}) == {"store": True}


def test_the_route_goes_on_last_and_wins_inside_extra_body():
    client = {"temperature": 1.0, "extra_body": {"top_k": 3, "metadata": {"tag": "a"}}}
    route = {"model": "openai/x", "api_base": "http://route", "extra_body": {"top_k": 1}}
    assert with_route(client, route) == {
        "temperature": 1.0,
        "model": "openai/x",
        "api_base": "http://route",
        "extra_body": {"top_k": 1, "metadata": {"tag": "a"}},
    }


@pytest.mark.parametrize(
    "name", ["api_base", "base_url", "api_key", "extra_headers", "timeout", "num_retries", "mock_response",
             "aws_secret_access_key", "vertex_credentials", "litellm_metadata", "stream_timeout", "metadata",
             "litellm_session_id", "temperature"]
)  # fmt: skip
def test_steering_and_openai_names_cannot_be_allowed(name):
    assert steering_reason(name) is not None


@pytest.mark.parametrize("name", ["top_k", "chat_template_kwargs", "min_p", "min_tokens", "repetition_penalty"])
def test_extensions_of_self_hosted_servers_can_be_allowed(name):
    assert steering_reason(name) is None


def _config(tmp_path: Path, allowed: str) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: local\n"
        "    litellm_params: {model: hosted_vllm/qwen, api_base: 'http://vllm:8000/v1'}\n"
        f"    allowed_client_params: {allowed}\n"
    )
    return config


def test_allowed_client_params_are_read_from_the_route(tmp_path):
    settings = Settings.from_env({}, config_path=_config(tmp_path, "[top_k, chat_template_kwargs]"))
    route = settings.route("local")
    assert route is not None and route.allowed_client_params == {"top_k", "chat_template_kwargs"}
    assert Settings.from_env({}).route("gpt-4o").allowed_client_params == frozenset()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("allowed", "named"), [("[api_base]", "api_base"), ("[top_k, extra_headers]", "extra_headers")]
)
def test_a_steering_name_in_allowed_client_params_stops_start_up(tmp_path, allowed, named):
    with pytest.raises(ConfigError, match=rf"allowed_client_params.*{named}.*cannot be allowed"):
        Settings.from_env({}, config_path=_config(tmp_path, allowed))
