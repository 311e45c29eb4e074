"""The provider fast path: litellm's OpenAI transformation layer over one pooled ``httpx.AsyncClient``.

``litellm.acompletion`` spends most of a small call's CPU on bookkeeping the proxy never reads (cost
calculation, its logging object, a hop into its executor, building an SDK client per call). For a route
whose adaptation is a pure request/response transformation this module calls litellm's own pieces
directly: the same message/tool validation and parameter mapping ``completion()`` runs, the provider
config's ``transform_request`` and ``get_complete_url``, ``convert_to_model_response_object`` for the
answer, and litellm's ``exception_type`` for failures, so ``provider_errors`` sees the same exception
classes. Everything litellm-internal this path relies on is named in ``LITELLM_SURFACE`` (a unit test
imports each one, so an upgrade that moves one fails loudly) and is used only here.

The rule (``FastPath.accepts``): an ``openai/`` route with an ``api_base``, only the keys in
``_ROUTE_KEYS``/``_OPENAI_PARAMS``, no litellm class-level OpenAI config, plain text or tool messages
and plain function tools, a model litellm does not bridge to the Responses API. Anything else (another
provider, an image part, a route option such as ``extra_headers``) goes through ``acompletion``.
Streams are served by ``acompletion`` too: its stream wrapper's chunk normalization is not reproduced here.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai

# What this module takes from litellm, by module and attribute: the guard test imports each one.
LITELLM_SURFACE: dict[str, tuple[str, ...]] = {
    "litellm.utils": (
        "ProviderConfigManager",
        "get_optional_params",
        "validate_and_fix_openai_messages",
        "validate_and_fix_openai_tools",
        "validate_chat_completion_tool_choice",
        "validate_openai_optional_params",
    ),
    "litellm.types.utils": ("LlmProviders", "ModelResponse"),
    "litellm.litellm_core_utils.get_llm_provider_logic": ("get_llm_provider",),
    "litellm.litellm_core_utils.prompt_templates.common_utils": ("get_completion_messages",),
    "litellm.litellm_core_utils.llm_response_utils.convert_dict_to_response": ("convert_to_model_response_object",),
    "litellm.litellm_core_utils.exception_mapping_utils": ("exception_type",),
    "litellm.llms.openai.common_utils": (
        "OpenAIError",
        "build_output_token_limit_response",
        "is_output_token_limit_error",
    ),
}

# Keys of a provider call the fast path understands; any other key sends the call to acompletion.
_ROUTE_KEYS = frozenset({"model", "messages", "api_base", "api_key", "timeout", "max_retries", "num_retries"})
_OPENAI_PARAMS = (
    "temperature",
    "top_p",
    "n",
    "stop",
    "max_tokens",
    "max_completion_tokens",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
    "response_format",
    "seed",
    "tools",
    "tool_choice",
    "logprobs",
    "top_logprobs",
    "parallel_tool_calls",
)
_ACCEPTED_KEYS = _ROUTE_KEYS | frozenset(_OPENAI_PARAMS)
_ROLES = frozenset({"system", "user", "assistant", "tool"})
_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "refusal"})
_TOOL_KEYS = frozenset({"type", "function"})
_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
_SDK_OPTION_KEYS = frozenset({"extra_headers", "extra_query", "extra_body"})
_MAX_CONNECTIONS = 200


class FastPath:
    """Serves plain OpenAI-compatible completions with litellm's transformation layer over one pool."""

    def __init__(self, litellm: Any) -> None:
        self._litellm = litellm
        self._parts = {name: _load(module, name) for module, names in LITELLM_SURFACE.items() for name in names}
        self._client: httpx.AsyncClient | None = None  # made on first use: a backend built only to read
        # the model map (start-up checks) opens no pool

    async def aclose(self) -> None:
        """Close the pooled connections."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def accepts(self, llm_input: dict[str, Any]) -> bool:
        """Whether the fast path sends exactly what acompletion would (the documented rule)."""
        model, api_base = llm_input.get("model"), llm_input.get("api_base")
        if not (isinstance(model, str) and model.startswith("openai/") and isinstance(api_base, str) and api_base):
            return False
        if not set(llm_input) <= _ACCEPTED_KEYS or llm_input.get("stream"):
            return False
        if not isinstance(llm_input.get("api_key"), str) or not isinstance(llm_input.get("messages"), list):
            return False
        timeout = llm_input.get("timeout")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):  # a string or httpx.Timeout
            return False
        if self._litellm.OpenAIConfig.get_config():  # an operator's module-level OpenAI defaults
            return False
        info = self._litellm.model_cost.get(model.removeprefix("openai/")) or {}
        if info.get("mode") == "responses":  # litellm bridges such models to the Responses API
            return False
        tools = llm_input.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(map(_plain_tool, tools))):
            return False
        return all(map(_plain_message, llm_input["messages"]))

    async def complete(self, llm_input: dict[str, Any], timeout: float) -> Any:
        """One provider call; returns litellm's ``ModelResponse`` or raises a litellm exception."""
        timeout = float(timeout)  # litellm resolves a route's timeout to a float (and says so in its errors)
        model, data, url, headers = self._build(llm_input)
        if self._client is None:
            limits = httpx.Limits(max_connections=_MAX_CONNECTIONS, max_keepalive_connections=_MAX_CONNECTIONS)
            self._client = httpx.AsyncClient(limits=limits, follow_redirects=False)
        started = time.time()
        try:
            try:
                response = await self._client.post(url, json=data, headers=headers, timeout=httpx.Timeout(timeout))
            except httpx.TimeoutException as exc:  # the SDK's error, with the words litellm adds to it
                error = openai.APITimeoutError(request=_sdk(exc.request))
                error.message += f" - timeout value={timeout}, time taken={round(time.time() - started, 2)} seconds"
                raise error from exc
            except httpx.TransportError as exc:
                raise openai.APIConnectionError(request=_sdk(exc.request)) from exc
            return self._answer(data, response)
        except Exception as exc:  # mapped the way litellm maps its own call's failures
            raise self._mapped(model, exc) from exc

    def _build(self, llm_input: dict[str, Any]) -> tuple[str, dict[str, Any], str, dict[str, str]]:
        """The request ``litellm.completion`` builds for this call, step for step (main.py, openai.py)."""
        p = self._parts
        params = {key: llm_input.get(key) for key in _OPENAI_PARAMS}
        messages = p["validate_and_fix_openai_messages"](messages=list(llm_input["messages"]))
        params["tools"] = p["validate_and_fix_openai_tools"](tools=params["tools"])
        params["tool_choice"] = p["validate_chat_completion_tool_choice"](
            tool_choice=params["tool_choice"], model=llm_input["model"]
        )
        params["stop"] = p["validate_openai_optional_params"](stop=params["stop"])
        messages = p["get_completion_messages"](
            messages=messages,
            ensure_alternating_roles=False,
            user_continue_message=None,
            assistant_continue_message=None,
        )
        model, provider, dynamic_key, api_base = p["get_llm_provider"](
            model=llm_input["model"], api_base=llm_input["api_base"], api_key=llm_input["api_key"]
        )
        config = p["ProviderConfigManager"].get_provider_chat_config(model=model, provider=p["LlmProviders"](provider))
        messages = list(
            config.translate_developer_role_to_system_role(
                messages=messages, model=model, custom_llm_provider=provider, api_base=api_base, model_info={}
            )
        )
        api_key = dynamic_key or llm_input["api_key"]
        optional = p["get_optional_params"](
            model=model,
            custom_llm_provider=provider,
            messages=messages,
            stream=False,
            max_retries=llm_input.get("num_retries", 0),
            **params,
        )
        optional.pop("stream_options", None)
        optional.pop("stream", None)
        optional.pop("max_retries", None)
        data = config.transform_request(
            model=model, messages=messages, optional_params=optional, litellm_params={}, headers={}
        )
        body = {key: value for key, value in data.items() if key not in _SDK_OPTION_KEYS}
        if isinstance(data.get("extra_body"), dict):
            body.update(data["extra_body"])
        url = config.get_complete_url(
            api_base=api_base, api_key=api_key, model=model, optional_params=optional, litellm_params={}, stream=False
        )
        headers = config.validate_environment(
            headers={}, model=model, messages=messages, optional_params=optional, litellm_params={}, api_key=api_key
        )
        return model, body, url, headers

    def _answer(self, data: dict[str, Any], response: httpx.Response) -> Any:
        p = self._parts
        if response.status_code >= 400:
            error = _sdk_status_error(response)
            if isinstance(error, openai.BadRequestError) and p["is_output_token_limit_error"](error):
                _, synthesized = p["build_output_token_limit_response"](
                    e=error, data=data, is_async=True, base_model=None
                )
                return self._model_response(synthesized.model_dump(), response)
            raise error
        answer: Any
        try:
            answer = response.json()
        except ValueError:
            answer = response.text  # the SDK hands a body that is not JSON on as its text
        if not isinstance(answer, dict):  # litellm's own words for this (openai.py)
            raise p["OpenAIError"](
                status_code=500,
                message=f"Empty or invalid response from LLM endpoint. Received: {answer!r}. "
                "Check the reverse proxy or model server configuration.",
            )
        return self._model_response(answer, response)

    def _model_response(self, answer: dict[str, Any], response: httpx.Response) -> Any:
        p = self._parts
        model_response = p["ModelResponse"]()
        model_response.usage = self._litellm.Usage()
        headers = dict(response.headers)
        return p["convert_to_model_response_object"](
            response_object=answer,
            model_response_object=model_response,
            hidden_params={"headers": headers},
            _response_headers=headers,
        )

    def _mapped(self, model: str, exc: Exception) -> Exception:
        """``exc`` as litellm's handler and ``exception_type`` would have raised it."""
        # litellm's handler wraps whatever its call raised (an SDK error, a failed conversion) this way
        if not isinstance(exc, self._parts["OpenAIError"]):
            wrapped = self._parts["OpenAIError"](
                status_code=getattr(exc, "status_code", 500),
                message=getattr(exc, "message", str(exc)),
                response=getattr(exc, "response", None),
                headers=getattr(getattr(exc, "response", None), "headers", None),
                body=getattr(exc, "body", None),
            )
            exc = _chained(wrapped, exc)
        try:
            mapped: Exception = self._parts["exception_type"](
                model=model, original_exception=exc, custom_llm_provider="openai", completion_kwargs={}, extra_kwargs={}
            )
        except Exception as raised:  # exception_type raises its answer rather than returning it
            mapped = raised
        return mapped


def _sdk(value: Any) -> Any:
    """An httpx request or response handed to the openai SDK's exceptions, which are typed for its own
    httpx fork (``httpx2``) but only read the attributes both share (status, headers, body)."""
    return value


def _chained(new: Exception, cause: BaseException) -> Exception:
    new.__cause__ = cause
    return new


def _sdk_status_error(response: httpx.Response) -> Exception:
    """The exception the openai SDK raises for this answer (its ``_make_status_error_from_response``)."""
    message = f"Error code: {response.status_code}"
    text = response.text.strip()
    body: Any = text
    try:
        body = json.loads(text)
    except ValueError:
        pass
    else:
        error = body.get("error", body) if isinstance(body, dict) else None
        words = error.get("message") if isinstance(error, dict) else None
        if isinstance(words, str) and words:
            message += f" - {words}"
    data = body.get("error", body) if isinstance(body, dict) else body
    classes = {
        400: openai.BadRequestError,
        401: openai.AuthenticationError,
        403: openai.PermissionDeniedError,
        404: openai.NotFoundError,
        409: openai.ConflictError,
        422: openai.UnprocessableEntityError,
        429: openai.RateLimitError,
    }
    cls = classes.get(response.status_code) or (
        openai.InternalServerError if response.status_code >= 500 else openai.APIStatusError
    )
    error_instance: Exception = cls(message, response=_sdk(response), body=data)
    return error_instance


def _plain_message(message: Any) -> bool:
    if not isinstance(message, dict) or message.get("role") not in _ROLES or not set(message) <= _MESSAGE_KEYS:
        return False
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(part, dict) and part.get("type") == "text" for part in content):
            return False
    elif content is not None and not isinstance(content, str):
        return False
    calls = message.get("tool_calls")
    return calls is None or (
        isinstance(calls, list) and all(isinstance(c, dict) and c.get("type") == "function" for c in calls)
    )


def _plain_tool(tool: Any) -> bool:
    return (
        isinstance(tool, dict)
        and tool.get("type") == "function"
        and set(tool) <= _TOOL_KEYS
        and isinstance(tool.get("function"), dict)
        and set(tool["function"]) <= _FUNCTION_KEYS
    )


def _load(module: str, name: str) -> Any:
    import importlib

    return getattr(importlib.import_module(module), name)
