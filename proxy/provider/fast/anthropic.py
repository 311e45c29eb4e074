"""The ``anthropic/`` route: litellm's ``AnthropicConfig`` builds the Messages API request and converts
the answer, step for step as its handler does (main.py ``_complete_anthropic``, llms/anthropic/chat/
handler.py ``AnthropicChatCompletion``; a stream as ``acompletion_stream_function`` and ``make_call``
make and read it); failures are raised as that handler and litellm's HTTP client raise them."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import httpx

from proxy.provider.fast.base import Adapter, Prepared, post_json
from proxy.provider.fast.messages import MessageScan
from proxy.provider.fast.streaming import StreamChunks
from proxy.provider.pool import PooledClient

# What Anthropic's parameter mapping takes without dropping or refusing; the rest goes to acompletion.
_ANTHROPIC_PARAMS = (
    "temperature",
    "top_p",
    "stop",
    "max_tokens",
    "max_completion_tokens",
    "user",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
)
# How litellm's HTTP client names a time-out, and which of the request's limits it quotes.
_TIMEOUT_PHASES: dict[type[httpx.TimeoutException], tuple[str, str]] = {
    httpx.ConnectTimeout: ("Connection", "connect"),
    httpx.ReadTimeout: ("Read", "read"),
    httpx.WriteTimeout: ("Write", "write"),
    httpx.PoolTimeout: ("Connection pool", "pool"),
}
# How long litellm's HTTP client waits for the body of a stream's error answer before it gives up on it.
_ERROR_BODY_SECONDS = 5.0


class AnthropicAdapter(Adapter):
    """Anthropic's Messages API behind an ``api_base``, with an API key."""

    provider = "anthropic"
    params = _ANTHROPIC_PARAMS
    streams = True

    def __init__(self, litellm: Any, parts: dict[str, Any]) -> None:
        super().__init__(litellm, parts)
        self._chunks = StreamChunks(parts)

    def _accepts(self, llm_input: dict[str, Any]) -> bool:
        p = self._parts
        if os.environ.get("LITELLM_ANTHROPIC_DISABLE_URL_SUFFIX"):  # the URL would be api_base as it is
            return False
        model = llm_input["model"].removeprefix("anthropic/")
        config = p["ProviderConfigManager"].get_provider_chat_config(
            model=model, provider=p["LlmProviders"]("anthropic")
        )
        return type(config) is p["AnthropicConfig"]

    async def complete(self, client: PooledClient, llm_input: dict[str, Any], timeout: float, scan: MessageScan) -> Any:
        try:
            call = await self._request(llm_input, scan)
        except Exception as exc:  # completion() maps a request it cannot build too
            raise self.mapped(llm_input["model"].split("/", 1)[1], exc) from exc
        try:
            response = await self._post(client, call.url, call.data, call.headers, timeout)
            return call.prepared.config.transform_response(
                model=call.prepared.model,
                raw_response=response,
                model_response=self.fresh_response(),
                logging_obj=_NoLogging(),
                api_key=call.prepared.api_key,
                request_data=call.data,
                messages=call.messages,
                optional_params=call.optional,
                litellm_params=call.litellm_params,
                encoding=None,  # read by no step of a non-streamed answer
                json_mode=call.json_mode,
            )
        except Exception as exc:  # mapped the way litellm maps its own call's failures
            raise self.mapped(call.prepared.model, exc) from exc

    async def stream(
        self,
        client: PooledClient,
        llm_input: dict[str, Any],
        timeout: float,
        scan: MessageScan,
        *,
        usage_to_caller: bool = True,
    ) -> Any:
        """The streamed call as the handler makes it (``acompletion_stream_function``, ``make_call``): the
        request of a whole answer with ``stream`` added, sent as the standard library's ``json.dumps``
        writes it; the SSE read by litellm's own ``ModelResponseIterator`` and wrapped in its
        ``CustomStreamWrapper``, which is handed no ``stream_options`` (it reads the caller's). The usage is
        always litellm's own (``usage_to_caller`` is not read): Anthropic reports it in two events, the
        prompt's in ``message_start`` and the answer's in ``message_delta``, which its rebuild adds up."""
        p = self._parts
        try:
            call = await self._request(llm_input, scan)
        except Exception as exc:  # completion() maps a request it cannot build too
            raise self.mapped(llm_input["model"].split("/", 1)[1], exc) from exc
        data = dict(call.data)
        data["stream"] = True
        try:
            response = await self._open(client, call.url, json.dumps(data), call.headers, timeout)
        except Exception as exc:
            raise self.mapped(call.prepared.model, exc) from exc
        # A call the route takes asks for no JSON answer (no ``response_format``): no answer schema to follow.
        chunks = p["ModelResponseIterator"](
            streaming_response=p["aiter_sse_lines"](response.aiter_text()),
            sync_stream=False,
            json_mode=call.json_mode,
            speed=call.optional.get("speed"),
            tool_name_reverse_map=call.litellm_params.get(p["ANTHROPIC_TOOL_NAME_REVERSE_MAP_KEY"]),
            response_format_schema=None,
            response=response,
        )
        return self._chunks.wrap(
            chunks,
            p["process_anthropic_headers"](response.headers),
            model=call.prepared.model,
            provider=self.provider,
            messages=call.prepared.messages,
            litellm_params=call.prepared.litellm_params,
            stream_options=None,
            requested_options=llm_input.get("stream_options"),
        )

    async def _open(
        self, client: PooledClient, url: str, body: str, headers: dict[str, str], timeout: float
    ) -> httpx.Response:
        """The stream's POST as ``make_call`` makes it through litellm's ``AsyncHTTPHandler.post``: the body
        as it is (no ``Content-Type`` added), the answer's head read; failing as ``make_call`` reports it."""
        p = self._parts
        started = time.time()
        try:
            try:
                response = await client.post_bytes(url, body, headers, timeout, stream=True)
                if not response.is_success:
                    await _error_body(response)
                    response.raise_for_status()
            except httpx.HTTPStatusError as exc:
                masked = p["MaskedHTTPStatusError"](exc)  # the client's error, whose answer make_call reads
                error: Exception = p["AnthropicError"](
                    status_code=masked.response.status_code,
                    message=await masked.response.aread(),
                    headers=masked.response.headers,
                )
                raise error from None
            except httpx.TimeoutException as exc:
                raise self._timeout(exc, started) from exc
        except p["AnthropicError"]:
            raise
        except self._litellm.Timeout:
            raise
        except Exception as exc:  # make_call's words for the rest (a refused connection, say)
            raise p["AnthropicError"](status_code=500, message=str(exc)) from exc
        return response

    async def _request(self, llm_input: dict[str, Any], scan: MessageScan) -> _Call:
        """The request ``_complete_anthropic`` and the handler build (main.py, handler.py ``completion``)."""
        p = self._parts
        prepared = self.prepare(llm_input, scan)
        model = prepared.model
        url = p["ensure_api_route"](prepared.api_base, "v1/messages")
        # the handler's own options leave the params; the rest is its copy of params and messages
        optional = copy.deepcopy(prepared.optional)
        optional.pop("stream", None)
        json_mode = bool(optional.pop("json_mode", False))
        vertex = {"is_vertex_request": optional.pop("is_vertex_request", False)}
        optional.pop("vertex_count_tokens_location", None)
        messages = copy.deepcopy(prepared.messages)
        litellm_params: dict[str, Any] = {}  # transform_request records its tool-name map here for the answer
        headers = p["AnthropicConfig"]().validate_environment(
            api_key=prepared.api_key,
            headers={},
            model=model,
            messages=messages,
            optional_params={**optional, **vertex},
            litellm_params=litellm_params,
            api_base=url,
        )
        request = await prepared.config.async_transform_request(
            model=model,
            messages=messages,
            optional_params={**optional, **vertex},
            litellm_params=litellm_params,
            headers=headers,
        )
        headers, request = p["update_request_with_filtered_beta"](
            headers=headers, request_data=request, provider="anthropic", api_base=url
        )
        data = p["strip_beta_gated_request_body"](request, headers, drop_params=None, model=model, provider="anthropic")
        return _Call(prepared, url, dict(data), headers, messages, optional, litellm_params, json_mode)

    async def _post(
        self, client: PooledClient, url: str, data: dict[str, Any], headers: dict[str, str], timeout: float
    ) -> httpx.Response:
        """The POST as litellm's ``AsyncHTTPHandler.post`` makes it, failing as the handler then reports it."""
        started = time.time()
        try:
            try:
                response = await post_json(client, url, data, headers, timeout)
                response.raise_for_status()
            except httpx.HTTPStatusError as exc:  # the client masks the URL; the handler reads the body
                text = exc.response.text
                raise self._parts["MaskedHTTPStatusError"](exc, message=text, text=text) from None  # as litellm
            except httpx.TimeoutException as exc:
                raise self._timeout(exc, started) from exc
        except Exception as exc:
            raise self._handler_error(exc) from exc
        return response

    def _timeout(self, exc: httpx.TimeoutException, started: float) -> Exception:
        """The time-out litellm's HTTP client raises in place of httpx's."""
        label, phase = _TIMEOUT_PHASES.get(type(exc), ("Request", "read"))
        seconds = (exc.request.extensions.get("timeout") or {}).get(phase)
        taken = round(time.time() - started, 3)
        error: Exception = self._litellm.Timeout(
            message=f"{label} timed out. Timeout passed={seconds}, time taken={taken} seconds",
            model="default-model-name",
            llm_provider="litellm-httpx-handler",
        )
        return error

    def _handler_error(self, exc: Exception) -> Exception:
        """What ``AnthropicChatCompletion.acompletion_function`` raises for a failed POST."""
        headers = getattr(exc, "headers", None)
        text = getattr(exc, "text", str(exc))
        response = getattr(exc, "response", None)
        if headers is None and response:
            headers = getattr(response, "headers", None)
        if response and hasattr(response, "text"):
            text = getattr(response, "text", text)
        error: Exception = self._parts["AnthropicError"](
            message=text, status_code=getattr(exc, "status_code", 500), headers=headers
        )
        return error


async def _error_body(response: httpx.Response) -> None:
    """Read a streamed error answer as litellm's client does (``_safe_aread_response``): for a few seconds at
    most, nothing on failure; then close it."""
    try:
        await asyncio.wait_for(response.aread(), timeout=_ERROR_BODY_SECONDS)
    except Exception:  # litellm's client reads such an answer as empty (its body stays unread)
        pass
    finally:
        await response.aclose()


@dataclass
class _Call:
    """A built request, and what converting its answer needs."""

    prepared: Prepared
    url: str
    data: dict[str, Any]
    headers: dict[str, str]
    messages: list[Any]
    optional: dict[str, Any]
    litellm_params: dict[str, Any]
    json_mode: bool


class _NoLogging:
    """Stands in for litellm's logging object: ``transform_response`` only reports the raw answer to it."""

    def post_call(self, *args: Any, **kwargs: Any) -> None:
        pass
