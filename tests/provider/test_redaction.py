"""Trace redaction: no credential litellm accepts reaches a trace, at any depth or inside a URL."""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import pytest

from proxy.provider.redaction import is_credential_name, redact_llm_input, redact_url

SECRET = "s3cr3t-VALUE-4242"
BASE = {"model": "openai/gpt-4o", "messages": [{"role": "user", "content": "hi"}]}

# Credential parameters of litellm.completion and its provider configs (main.py, llms/bedrock,
# llms/azure, llms/vertex_ai, llms/watsonx), plus the generic ones.
CREDENTIAL_PARAMS = [
    "api_key",
    "token",
    "client_secret",
    "headers",
    "extra_headers",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
    "aws_role_name",
    "aws_session_name",
    "aws_profile_name",
    "aws_web_identity_token",
    "aws_bearer_token",
    "aws_external_id",
    "azure_ad_token",
    "azure_ad_token_provider",
    "azure_username",
    "azure_password",
    "azure_key",
    "vertex_credentials",
    "vertex_ai_credentials",
    "watsonx_token",
    "watsonx_credentials",
    "s3_secret_access_key",
    "anthropic_identity_token",
    "anthropic_keycloak_client_secret_ref",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "authorization",
    "proxy-authorization",
    "cookie",
    "access_token",
    "refresh_token",
    "id_token",
    "apiKey",
    "accessToken",
    "password",
    "credentials",
]


@pytest.mark.parametrize("name", CREDENTIAL_PARAMS)
def test_each_credential_parameter_is_dropped_at_the_top_level(name: str) -> None:
    redacted = redact_llm_input({**BASE, name: SECRET})

    assert name not in redacted
    assert SECRET not in json.dumps(redacted)
    assert redacted["messages"] == BASE["messages"]


@pytest.mark.parametrize("name", CREDENTIAL_PARAMS)
def test_each_credential_parameter_is_dropped_inside_extra_body_and_nested_objects(name: str) -> None:
    llm_input = {
        **BASE,
        "extra_body": {name: SECRET, "options": {name: SECRET, "keep": 1}, "list": [{name: SECRET}]},
        "metadata": {"auth": {name: SECRET}},
    }

    redacted = redact_llm_input(llm_input)

    assert SECRET not in json.dumps(redacted)
    assert redacted["extra_body"]["options"] == {"keep": 1}
    assert redacted["extra_body"]["list"] == [{}]


def test_litellm_credential_params_are_all_dropped_or_known_to_be_harmless(litellm: ModuleType) -> None:
    # litellm's own list of the "sensitive credential params" of a deployment. A new field fails this
    # test until it is judged: a credential (dropped) or an identifier/location (kept, URLs masked).
    from litellm.types.router import CredentialLiteLLMParams

    harmless = {
        "api_base",  # kept, with its user info and credential query values masked
        "api_version",
        "tenant_id",
        "client_id",
        "region_name",
        "gcs_bucket_name",
        "bucket_name",
        "allow_legacy_cloud_file_ids",
        "s3_bucket_name",
        "s3_endpoint_url",
        "s3_region_name",
        "s3_bucket_owner",
        "s3_output_bucket_name",
        "bedrock_tags",
        "anthropic_federation_rule_id",
        "anthropic_organization_id",
        "anthropic_service_account_id",
        "anthropic_federation_workspace_id",
        "anthropic_identity_source",
        "anthropic_issuer_url",
        "anthropic_issuer_subject",
        "anthropic_issuer_audience",
        "anthropic_issuer_ttl_seconds",
        "anthropic_keycloak_client_id",
        "anthropic_keycloak_scope",
        "anthropic_disable_workload_identity_federation",
        "openai_identity_provider_id",
        "openai_service_account_id",
    }
    unjudged = [name for name in CredentialLiteLLMParams.model_fields if not is_credential_name(name)]
    assert set(unjudged) <= harmless, set(unjudged) - harmless
    for secret in ("api_key", "client_secret", "azure_ad_token", "aws_secret_access_key", "vertex_credentials"):
        assert secret in CredentialLiteLLMParams.model_fields and is_credential_name(secret)


@pytest.mark.parametrize(
    "name",
    [
        "model",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_logprobs",
        "stream_options",
        "prompt_cache_key",
        "api_base",
        "api_version",
        "client_id",
        "tenant_id",
        "timeout",
    ],
)
def test_ordinary_parameters_stay(name: str) -> None:
    assert not is_credential_name(name)
    assert redact_llm_input({**BASE, name: 7})[name] == 7


def test_the_conversation_and_tool_schemas_are_recorded_as_sent() -> None:
    tool = {
        "type": "function",
        "function": {"name": "login", "parameters": {"properties": {"api_key": {"type": "string"}}}},
    }
    messages = [{"role": "user", "content": "my token is abc", "name": "x"}]
    llm_input = {"model": "m", "messages": messages, "tools": [tool], "response_format": {"type": "json_object"}}

    assert redact_llm_input(llm_input) == llm_input


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://user:pass@example.com/v1", "https://***@example.com/v1"),
        ("https://token@example.com:8443/v1", "https://***@example.com:8443/v1"),
        (
            "https://res.openai.azure.com/openai?api-version=2024-06-01&api-key=s3cr3t",
            "https://res.openai.azure.com/openai?api-version=2024-06-01&api-key=***",
        ),
        (
            "https://generativelanguage.googleapis.com/v1beta?key=s3cr3t",
            "https://generativelanguage.googleapis.com/v1beta?key=***",
        ),
        ("https://blob.example.net/c?sv=2022&sig=s3cr3t", "https://blob.example.net/c?sv=2022&sig=***"),
        ("https://host/cb#access_token=s3cr3t&state=1", "https://host/cb#access_token=***&state=1"),
        ("http://127.0.0.1:4000/v1", "http://127.0.0.1:4000/v1"),
        ("https://host/v1?api-version=2024", "https://host/v1?api-version=2024"),
        ("not a url", "not a url"),
    ],
)
def test_credentials_inside_urls_are_masked(url: str, expected: str) -> None:
    assert redact_url(url) == expected
    for key in ("api_base", "base_url"):
        assert redact_llm_input({**BASE, key: url})[key] == expected


def test_a_url_deep_in_extra_body_is_masked_too() -> None:
    llm_input: dict[str, Any] = {**BASE, "extra_body": {"callback": {"url": "https://u:s3cr3t@hooks.example/x"}}}

    assert "s3cr3t" not in json.dumps(redact_llm_input(llm_input))


def test_redaction_does_not_change_the_input_it_was_given() -> None:
    llm_input = {**BASE, "api_key": SECRET, "extra_body": {"client_secret": SECRET}}
    before = json.dumps(llm_input)

    redact_llm_input(llm_input)

    assert json.dumps(llm_input) == before
