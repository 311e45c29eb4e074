"""The ``openai/`` route: litellm's OpenAI config builds the request, the answer is read the way the
openai SDK reads it, and failures are wrapped as litellm's OpenAI handler wraps them (openai.py)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai

from proxy.provider.fast.base import Adapter, Prepared, chained, post_json
from proxy.provider.fast.messages import MessageScan, splices_messages
from proxy.provider.fast.streaming import StreamChunks
from proxy.provider.fast.tool_schemas import SanitizedTools
from proxy.provider.pool import PooledClient

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
_SDK_OPTION_KEYS = frozenset({"extra_headers", "extra_query", "extra_body"})


class OpenAIAdapter(Adapter):
    """An OpenAI-compatible server behind an ``api_base``, called as the openai SDK calls it."""

    provider = "openai"
    params = _OPENAI_PARAMS
    streams = True
    reports_provider_usage = True
    # litellm's Azure handler takes ``json_mode`` (a JSON answer asked for through a tool) out of the
    # params and converts the answer's tool call back; its OpenAI handler leaves both alone.
    converts_json_mode = False

    def __init__(self, litellm: Any, parts: dict[str, Any]) -> None:
        super().__init__(litellm, parts)
        self._handler = parts["OpenAIChatCompletion"]()
        self._chunks = StreamChunks(parts)
        self._sanitized_tools = SanitizedTools()

    def _accepts(self, llm_input: dict[str, Any]) -> bool:
        if self._litellm.OpenAIConfig.get_config():  # an operator's module-level OpenAI defaults
            return False
        # a model litellm answers with a non-streamed call made to look like a stream stays on acompletion
        return not (llm_input.get("stream") and self._fakes_stream(llm_input["model"].split("/", 1)[1]))

    def _fakes_stream(self, model: str) -> bool:
        p = self._parts
        config = p["ProviderConfigManager"].get_provider_chat_config(model=model, provider=p["LlmProviders"]("openai"))
        return config is None or bool(config.should_fake_stream(model=model, custom_llm_provider="openai", stream=True))

    async def stream(
        self,
        client: PooledClient,
        llm_input: dict[str, Any],
        timeout: float,
        scan: MessageScan,
        *,
        usage_to_caller: bool = True,
    ) -> Any:
        """The streamed call as litellm's OpenAI handler makes it (``async_streaming``): the config's request
        with ``stream`` and the handler's ``stream_options`` added, the SSE read by the openai SDK's own
        ``AsyncStream`` into its chunk objects, those turned into litellm's by litellm's ``CustomStreamWrapper``
        (``fast/streaming.py``). A 400 that says the output budget could not fit one token becomes the
        one-chunk stream litellm makes of it (``build_output_token_limit_response``), as for a whole answer.

        ``usage_to_caller=False``: the provider is asked for usage as ``llm_input`` says, and the wrapper is
        made as for a caller that did not ask (``include_usage`` left out of its options): it keeps the
        provider's usage chunk in its ``chunks`` and hands on no usage chunk of its own, which it would
        build by rebuilding the whole answer after the last chunk (``built_once``)."""
        try:
            prepared = self.prepare(llm_input, scan, **self._provider_params(llm_input))
            data = self._stream_body(prepared, llm_input.get("stream_options"))
            url, headers = self._endpoint(prepared, llm_input)
        except Exception as exc:  # completion() maps a request it cannot build too
            raise self.mapped(llm_input["model"].split("/", 1)[1], exc) from exc
        wrapping: dict[str, Any] = {
            "model": prepared.model,
            "provider": self.provider,
            "messages": prepared.messages,
            "litellm_params": prepared.litellm_params,
            "stream_options": data.get("stream_options"),
            "requested_options": llm_input.get("stream_options"),
        }
        if not usage_to_caller:
            wrapping["stream_options"] = _without_usage(wrapping["stream_options"])
            wrapping["requested_options"] = _without_usage(wrapping["requested_options"])
        started = time.time()
        try:
            try:
                response = await post_json(client, url, data, headers, timeout, stream=True)
            except httpx.TimeoutException as exc:
                raise self._stream_timeout(exc, timeout, started) from exc
            except httpx.TransportError as exc:
                raise openai.APIConnectionError(request=_sdk(exc.request)) from exc
            if response.status_code >= 400:
                await response.aread()
                await response.aclose()
                error = _sdk_status_error(response)
                if isinstance(error, openai.BadRequestError) and self._parts["is_output_token_limit_error"](error):
                    limit_headers, synthesized = self._parts["build_output_token_limit_response"](
                        e=error, data=data, is_async=True, base_model=None
                    )
                    return self._chunks.wrap(synthesized, limit_headers, **wrapping)
                raise error
        except Exception as exc:
            raise self.mapped(prepared.model, self._stream_wrapped(exc)) from exc
        return self._chunks.wrapper(response, **wrapping)

    def _stream_body(self, prepared: Prepared, stream_options: Any) -> dict[str, Any]:
        """The body of a streamed call: the config's request, ``stream`` and the handler's ``stream_options``
        added (``async_streaming``: ``get_stream_options``)."""
        data, _ = self._body(prepared)
        data["stream"] = True
        added: dict[str, Any] = self._parts["OpenAIChatCompletion"].get_stream_options(
            self._handler, stream_options=stream_options, api_base=prepared.api_base
        )
        data.update(added)
        return data

    def _stream_timeout(self, exc: httpx.TimeoutException, timeout: float, started: float) -> Exception:
        """The SDK's time-out error. The words litellm's OpenAI handler adds to its ``message`` never reach a
        stream's caller: ``async_streaming`` wraps ``str(error)``."""
        return openai.APITimeoutError(request=_sdk(exc.request))

    def _stream_wrapped(self, exc: Exception) -> Exception:
        """``exc`` as the handler's ``async_streaming`` wraps a failure to open the stream."""
        return self._wrapped(exc)

    async def complete(self, client: PooledClient, llm_input: dict[str, Any], timeout: float, scan: MessageScan) -> Any:
        try:
            prepared = self.prepare(llm_input, scan, **self._provider_params(llm_input))
            data, json_mode = self._body(prepared)
            url, headers = self._endpoint(prepared, llm_input)
        except Exception as exc:  # completion() maps a request it cannot build too (an unsupported param)
            raise self.mapped(llm_input["model"].split("/", 1)[1], exc) from exc
        started = time.time()
        try:
            try:
                response = await post_json(client, url, data, headers, timeout)
            except httpx.TimeoutException as exc:  # the SDK's error, with the words litellm adds to it
                error = openai.APITimeoutError(request=_sdk(exc.request))
                error.message += f" - timeout value={timeout}, time taken={round(time.time() - started, 2)} seconds"
                raise error from exc
            except httpx.TransportError as exc:
                raise openai.APIConnectionError(request=_sdk(exc.request)) from exc
            return self._answer(data, response, json_mode)
        except Exception as exc:  # mapped the way litellm maps its own call's failures
            raise self.mapped(prepared.model, self._wrapped(exc)) from exc

    def _splices(self, config: Any, sendable: list[dict[str, Any]]) -> bool:
        return splices_messages(config, self._pinned_request, sendable, self._litellm)

    def _provider_params(self, llm_input: dict[str, Any]) -> dict[str, Any]:
        """What ``completion()`` passes ``get_optional_params`` besides the OpenAI parameters."""
        return {}

    def _body(self, prepared: Prepared) -> tuple[dict[str, Any], bool]:
        """The JSON body the SDK sends: the config's request without the SDK's own options, its
        ``extra_body`` merged in; and whether litellm asked the model for JSON through a tool call."""
        optional = prepared.optional
        for key in ("stream_options", "stream", "max_retries"):  # the handler's own, not the body's
            optional.pop(key, None)
        json_mode = bool(optional.pop("json_mode", False)) if self.converts_json_mode else False
        # Plain text messages pass the config's message steps unchanged: built without them, put in after
        # (``splices_messages``), rather than walked several times over on every call.
        splice = prepared.spliced
        self._sanitized_tools.remember_on(prepared.config)  # an agent's tools are the same on every call
        data = prepared.config.transform_request(
            model=prepared.model,
            messages=[] if splice else prepared.messages,
            optional_params=optional,
            litellm_params=prepared.litellm_params,
            headers={},
        )
        if splice:
            data["messages"] = list(prepared.messages)
        body = {key: value for key, value in data.items() if key not in _SDK_OPTION_KEYS}
        if isinstance(data.get("extra_body"), dict):
            body.update(data["extra_body"])
        return body, json_mode

    def _endpoint(self, prepared: Prepared, llm_input: dict[str, Any]) -> tuple[str, dict[str, str]]:
        config = prepared.config
        url = config.get_complete_url(
            api_base=prepared.api_base,
            api_key=prepared.api_key,
            model=prepared.model,
            optional_params=prepared.optional,
            litellm_params={},
            stream=False,
        )
        headers = config.validate_environment(
            headers={},
            model=prepared.model,
            messages=prepared.messages,
            optional_params=prepared.optional,
            litellm_params={},
            api_key=prepared.api_key,
        )
        return url, headers

    def _answer(self, data: dict[str, Any], response: httpx.Response, json_mode: bool) -> Any:
        p = self._parts
        headers = dict(response.headers)
        conversion = {"convert_tool_call_to_json_mode": json_mode} if json_mode else {}
        if response.status_code >= 400:
            error = _sdk_status_error(response)
            if isinstance(error, openai.BadRequestError) and p["is_output_token_limit_error"](error):
                _, synthesized = p["build_output_token_limit_response"](
                    e=error, data=data, is_async=True, base_model=None
                )
                return self.model_response(synthesized.model_dump(), headers, **conversion)
            raise error
        answer: Any
        try:
            answer = response.json()
        except ValueError:
            answer = response.text  # the SDK hands a body that is not JSON on as its text
        if not isinstance(answer, dict):
            raise self._invalid_answer(answer)
        return self.model_response(answer, headers, **conversion)

    def _invalid_answer(self, answer: Any) -> Exception:
        """litellm's own words for an answer that is not a JSON object (openai.py)."""
        error: Exception = self._parts["OpenAIError"](
            status_code=500,
            message=f"Empty or invalid response from LLM endpoint. Received: {answer!r}. "
            "Check the reverse proxy or model server configuration.",
        )
        return error

    def _wrapped(self, exc: Exception) -> Exception:
        """``exc`` as litellm's OpenAI handler wraps whatever its call raised (an SDK error, a failed
        conversion) before ``exception_type`` sees it."""
        openai_error: Any = self._parts["OpenAIError"]
        already_wrapped = isinstance(exc, openai_error)
        if already_wrapped:
            return exc
        wrapped: Exception = openai_error(
            status_code=getattr(exc, "status_code", 500),
            message=getattr(exc, "message", str(exc)),
            response=getattr(exc, "response", None),
            headers=getattr(getattr(exc, "response", None), "headers", None),
            body=getattr(exc, "body", None),
        )
        return chained(wrapped, exc)


def _without_usage(options: dict[str, Any] | None) -> dict[str, Any] | None:
    """Stream options as a caller that asked for no usage would have sent them."""
    if not options:
        return options
    kept = {key: value for key, value in options.items() if key != "include_usage"}
    return kept or None


def _sdk(value: Any) -> Any:
    """An httpx request or response handed to the openai SDK's exceptions, which are typed for its own
    httpx fork (``httpx2``) but only read the attributes both share (status, headers, body)."""
    return value


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
