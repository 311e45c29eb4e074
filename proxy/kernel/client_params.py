"""Which top-level request fields a client may send, and the provider call's arguments built from them.

``litellm.acompletion`` takes OpenAI's request fields and litellm's own arguments in one keyword
namespace: where to connect (``base_url``, ``api_base``), with which credentials (``api_key``), extra
headers, timeouts, retries, mocks, fallbacks, callbacks. A request body copied into it lets a client
point the call at its own server and receive the route's provider key. So the call is built from an
allow-list: the properties of OpenAI's ``CreateChatCompletionRequest``, plus what the operator lists in
a route's ``allowed_client_params`` (``top_k``, ``chat_template_kwargs``: extensions of vLLM or
OpenRouter). Anything else is refused with 400 ``unsupported_parameter`` before anything is stored,
and the route's ``litellm_params`` go on last so nothing a client sends overrides them.

Two OpenAI fields are also litellm arguments with another meaning:

- ``metadata``: litellm takes it as its own logging and routing metadata (callbacks, ``model_group``
  routing, budget reservations) and does not send it to the provider. For OpenAI it only tags a stored
  completion (``store: true``). The proxy reads its session keys and ``run_contract`` from it, so it is
  never passed as litellm's ``metadata``; with ``store: true`` the rest goes to the provider inside
  ``extra_body``, where litellm hands it on untouched, otherwise it is dropped.
- ``user``: litellm's ``user`` argument is OpenAI's end-user id, which litellm maps for each provider
  (OpenAI ``user``, Anthropic ``metadata.user_id``) and otherwise only logs; it passes as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from proxy.kernel.errors import InvalidRequest

# The properties of CreateChatCompletionRequest in OpenAI's schema (tests/data/openai-chat-schemas.json);
# a unit test compares this list with the schema, so a schema update shows up as a failing test.
OPENAI_REQUEST_FIELDS = frozenset(
    {
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "messages",
        "metadata",
        "modalities",
        "model",
        "moderation",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
# Session fields the proxy reads (proxy/ingress/front_door.py: identify) and never forwards.
SESSION_FIELDS = frozenset({"litellm_session_id"})
SESSION_METADATA_KEYS = frozenset({"session_id", "litellm_session_id"})
# Keys of ``metadata`` that are the proxy's channel, not the provider's.
_PROXY_METADATA_KEYS = SESSION_METADATA_KEYS | {"run_contract"}
# Set by the route or by the proxy itself, never taken from the body.
_NOT_FORWARDED = frozenset({"model", "metadata"}) | SESSION_FIELDS

# Names an operator may not allow a client to send: they choose where litellm connects, with which
# credentials, headers, time limits, retries, callbacks or canned answers. The exact names cover
# litellm's main steering arguments; the pattern catches the families (``aws_*``, ``vertex_*``,
# ``*_api_key``, ``*_timeout``, ...) that litellm keeps adding to.
_STEERING_NAMES = frozenset(
    {
        "api_base",
        "base_url",
        "api_key",
        "api_version",
        "azure",
        "azure_ad_token",
        "azure_ad_token_provider",
        "callbacks",
        "client",
        "custom_llm_provider",
        "deployment_id",
        "extra_headers",
        "fallbacks",
        "headers",
        "input_cost_per_token",
        "litellm_logging_obj",
        "logger_fn",
        "metadata",
        "mock_response",
        "model",
        "messages",
        "model_list",
        "organization",
        "proxy_server_request",
        "shared_session",
        "ssl_verify",
    }
    | SESSION_FIELDS
)
_STEERING_PATTERN = re.compile(
    r"api_?base|base_url|api_?key|(?:^|_)token$|_token_|secret|password|credential|header|timeout|retr(y|ies)|callback"
    r"|fallback|mock|endpoint|url$|^aws_|^azure_|^vertex_|^watsonx_|^litellm|cost_per|organization",
    re.IGNORECASE,
)


def steering_reason(name: str) -> str | None:
    """Why ``name`` may not be listed in ``allowed_client_params``, or None when it may."""
    if name in _STEERING_NAMES or _STEERING_PATTERN.search(name):
        return "it steers where or how litellm calls the provider (connection, credentials, headers, time, retries)"
    if name in OPENAI_REQUEST_FIELDS:
        return "it is an OpenAI request field, which every client may already send"
    return None


def check_client_params(body: Mapping[str, Any], allowed: Iterable[str] = ()) -> None:
    """Refuse a body with a top-level field that is neither OpenAI's, a session field, nor ``allowed``.

    Raises ``InvalidRequest`` (400, ``unsupported_parameter``) naming the first such field in body order.
    """
    extra = frozenset(allowed)
    for name in body:
        if name in OPENAI_REQUEST_FIELDS or name in SESSION_FIELDS or name in extra:
            continue
        raise InvalidRequest(
            f"Unsupported parameter: {name!r} is not an OpenAI chat-completions parameter and this model's "
            "route does not allow it (an operator can list it in the route's allowed_client_params).",
            code="unsupported_parameter",
            param=name,
        )


def client_arguments(body: Mapping[str, Any], allowed: Iterable[str] = ()) -> dict[str, Any]:
    """The client's part of the provider call: its OpenAI fields and allowed extensions, nothing else.

    ``model`` and the session fields are left out (the route names the model), and ``metadata`` goes
    to the provider only inside ``extra_body`` when the client asked OpenAI to store the completion.
    """
    extra = frozenset(allowed)
    arguments = {
        name: value
        for name, value in body.items()
        if name not in _NOT_FORWARDED and (name in OPENAI_REQUEST_FIELDS or name in extra)
    }
    metadata = provider_metadata(body)
    if metadata:
        given = arguments.get("extra_body")
        arguments["extra_body"] = {**(given if isinstance(given, Mapping) else {}), "metadata": metadata}
    return arguments


def provider_metadata(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """OpenAI's ``metadata`` for the provider: only with ``store: true``, without the proxy's own keys."""
    metadata = body.get("metadata")
    if body.get("store") is not True or not isinstance(metadata, Mapping):
        return None
    kept = {key: value for key, value in metadata.items() if key not in _PROXY_METADATA_KEYS}
    return kept or None


def with_route(arguments: dict[str, Any], route_params: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` with the route's ``litellm_params`` applied last; an ``extra_body`` of both is merged,
    the route's keys winning."""
    merged = {**arguments, **route_params}
    client_body, route_body = arguments.get("extra_body"), route_params.get("extra_body")
    if isinstance(client_body, Mapping) and isinstance(route_body, Mapping):
        merged["extra_body"] = {**client_body, **route_body}
    return merged
