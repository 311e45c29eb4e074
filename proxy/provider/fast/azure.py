"""The ``azure/<deployment>`` route: the OpenAI route's body, built by litellm's ``AzureOpenAIConfig``,
sent where ``AsyncAzureOpenAI`` sends it, failures wrapped as litellm's Azure handler wraps them
(llms/azure/azure.py, ``AzureChatCompletion.acompletion``; a stream's as its ``async_streaming`` does)."""

from __future__ import annotations

import os
import re
import time
from typing import Any

import httpx
import openai

from proxy.provider.fast.base import ROUTE_KEYS, Prepared, chained
from proxy.provider.fast.openai import OpenAIAdapter

# A deployment name or API version that goes into the URL as it is (the SDK would quote anything else).
_URL_SAFE = re.compile(r"[A-Za-z0-9._-]+")
# API versions litellm sends to Azure's ``/openai/v1`` surface with the plain OpenAI client instead.
_V1_VERSIONS = frozenset({"preview", "latest", "v1"})
# Credentials litellm turns into an Entra ID token (a Bearer header instead of, or besides, ``api-key``).
_ENTRA_ENVIRONMENT = (
    "AZURE_AD_TOKEN",
    "AZURE_CLIENT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_TENANT_ID",
    "AZURE_USERNAME",
    "AZURE_PASSWORD",
)
# The order the openai SDK's ``chat.completions.create`` writes its body in (litellm's Azure handler
# calls it with the config's request as keyword arguments); ``extra_body`` follows.
SDK_BODY_ORDER = (
    "model", "stream", "service_tier", "messages", "audio", "frequency_penalty", "function_call", "functions",
    "logit_bias", "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities", "moderation", "n",
    "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key", "prompt_cache_options",
    "prompt_cache_retention", "reasoning_effort", "response_format", "safety_identifier", "seed", "stop", "store",
    "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity",
    "web_search_options",
)  # fmt: skip


def _sdk_ordered(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` in the order the SDK writes it; what is left came in ``extra_body``."""
    ordered = {key: body.pop(key) for key in SDK_BODY_ORDER if key in body}
    return {**ordered, **body}


class AzureAdapter(OpenAIAdapter):
    """An Azure OpenAI deployment with an API key and a dated API version."""

    provider = "azure"
    route_keys = ROUTE_KEYS | {"api_version"}
    converts_json_mode = True

    def _accepts(self, llm_input: dict[str, Any]) -> bool:
        p, litellm = self._parts, self._litellm
        deployment, api_base = llm_input["model"].removeprefix("azure/"), llm_input["api_base"]
        version = llm_input.get("api_version")
        if not (isinstance(version, str) and _URL_SAFE.fullmatch(version)) or version in _V1_VERSIONS:
            return False
        if not _URL_SAFE.fullmatch(deployment) or any(mark in api_base for mark in "?#"):
            return False
        # A deployment URL as api_base, and Cloudflare's gateway, give the SDK another base URL.
        if "/openai/deployments" in api_base or "gateway.ai.cloudflare.com" in api_base:
            return False
        if litellm.AzureOpenAIConfig.get_config() or litellm.headers:  # an operator's module-level defaults
            return False
        if litellm.secret_manager_client is not None or any(os.environ.get(name) for name in _ENTRA_ENVIRONMENT):
            return False
        # o-series and GPT-5 deployments have configs (and an o-series handler) of their own
        config = p["ProviderConfigManager"].get_provider_chat_config(
            model=deployment, provider=p["LlmProviders"]("azure")
        )
        return type(config) is p["AzureOpenAIConfig"]

    def _body(self, prepared: Prepared) -> tuple[dict[str, Any], bool]:
        # The Azure handler hands the SDK the mapped ``stream`` with the rest: a client's ``stream: false`` is sent.
        unstreamed = prepared.optional.get("stream") is False
        body, json_mode = super()._body(prepared)
        if unstreamed:
            body["stream"] = False
        return _sdk_ordered(body), json_mode

    def _stream_body(self, prepared: Prepared, stream_options: Any) -> dict[str, Any]:
        """The Azure handler streams the config's request as it is: ``stream`` and the ``stream_options`` the
        parameter mapping kept go through the SDK's ``create`` like every other parameter (no
        ``get_stream_options``: nothing is added that the caller did not ask for)."""
        mapped = prepared.optional.get("stream_options")  # ``_body`` takes the handler's options out
        body, _ = super()._body(prepared)
        body["stream"] = True
        if mapped is not None:
            body["stream_options"] = mapped
        return _sdk_ordered(body)

    def _stream_timeout(self, exc: httpx.TimeoutException, timeout: float, started: float) -> Exception:
        """The SDK's time-out error with the words litellm's Azure handler adds, which its stream's error
        keeps (``async_streaming`` wraps the ``message``)."""
        error = openai.APITimeoutError(request=exc.request)  # type: ignore[arg-type]  # the SDK's httpx fork
        error.message += f" - timeout value={timeout}, time taken={round(time.time() - started, 2)} seconds"
        return error

    def _stream_wrapped(self, exc: Exception) -> Exception:
        """What ``AzureChatCompletion.async_streaming`` raises for a stream it could not open: every failure
        (the SDK's status errors too) as an ``AzureOpenAIError`` with its status, words, headers and body."""
        headers = getattr(exc, "headers", None)
        response = getattr(exc, "response", None)
        if headers is None and response:
            headers = getattr(response, "headers", None)
        error: Exception = self._parts["AzureOpenAIError"](
            status_code=getattr(exc, "status_code", 500),
            message=getattr(exc, "message", str(exc)),
            response=self._parts["upstream_error_response"](exc),
            headers=headers,
            body=getattr(exc, "body", None),
        )
        return chained(error, exc)

    def _provider_params(self, llm_input: dict[str, Any]) -> dict[str, Any]:
        return {"api_version": llm_input["api_version"]}  # what Azure's parameter mapping depends on

    def _endpoint(self, prepared: Prepared, llm_input: dict[str, Any]) -> tuple[str, dict[str, str]]:
        """``AsyncAzureOpenAI(azure_endpoint=api_base, api_version=...)``'s URL for the deployment in
        the body's ``model``, and its key header."""
        base = prepared.api_base.rstrip("/")
        url = f"{base}/openai/deployments/{prepared.model}/chat/completions?api-version={llm_input['api_version']}"
        return url, {"api-key": prepared.api_key}

    def _invalid_answer(self, answer: Any) -> Exception:
        error: Exception = self._parts["AzureOpenAIError"](
            status_code=500, message=f"Unexpected response from Azure: {answer!r:.500}"
        )
        return error

    def _wrapped(self, exc: Exception) -> Exception:
        """The Azure handler passes on what has a status (the SDK's status errors, its own errors) and
        wraps the rest (time-outs, refused connections, a failed conversion) as a 500."""
        if hasattr(exc, "status_code"):
            return exc
        error: Exception = self._parts["AzureOpenAIError"](
            status_code=500, message=getattr(exc, "message", str(exc)), body=getattr(exc, "body", None)
        )
        error.__cause__ = exc
        return error
