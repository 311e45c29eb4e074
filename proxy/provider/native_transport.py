"""Native passage: a request in the client's own API (Anthropic Messages, OpenAI Responses) sent as it is.

litellm's own entry points for these APIs rewrite what passes through them (``anthropic_messages`` drops
``thinking`` for a model its map does not know; ``aresponses`` renames response ids and adds fields), and
a signed thinking block or an encrypted reasoning item must reach the provider, and come back, exactly
as it was. So the body the ingress's codec rendered is posted as it is over one pooled client (on
litellm's own transport, ``pool.py``), and an answer or a stream's events come back as the provider sent
them. litellm still decides what it decides for every other call: the API key and base the route names
(else the provider's environment variables and default address), and a failure is mapped by its
``exception_type`` and translated like every provider failure, so an overflow is an overflow here too.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from proxy.kernel.errors import ProviderError, ProxyError
from proxy.kernel.jsonio import dumps
from proxy.kernel.route_api import Api
from proxy.provider.error_translation import translate_provider_error
from proxy.provider.pool import PooledClient, litellm_client

_ANTHROPIC_BASE = "https://api.anthropic.com"
_OPENAI_BASE = "https://api.openai.com/v1"
_ANTHROPIC_VERSION = "2023-06-01"
_BODY_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})


class NativeTransport:
    """Posts native requests over one pooled client; made on first use, closed by ``aclose``."""

    def __init__(self, litellm: Any, parts: Mapping[str, Any], timeout_seconds: float) -> None:
        self._litellm = litellm
        self._parts = parts
        self._timeout = timeout_seconds
        self._client: PooledClient | None = None

    async def aclose(self) -> None:
        """Close the pooled connections."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def complete(
        self, api: Api, body: dict[str, Any], headers: Mapping[str, str], route: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The provider's answer to ``body``, as it sent it."""
        url, sent, timeout = self._call(api, headers, route)
        try:
            response = await self._pool().post_bytes(url, dumps(body), sent, timeout)
            if response.status_code >= 400:
                raise self._mapped(api, route, response.status_code, response.text, response.headers)
            answer = response.json()
        except ProxyError:
            raise
        except Exception as exc:  # the boundary: every provider failure is translated here
            raise translate_provider_error(exc, secrets=_secrets(route)) from exc
        if not isinstance(answer, dict):
            raise ProviderError("The provider's answer is not a JSON object.", status=502)
        return answer

    async def stream(
        self, api: Api, body: dict[str, Any], headers: Mapping[str, str], route: Mapping[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """The provider's stream of events for ``body`` (which asks for one), read up to its first event so
        that a refused request is still an HTTP error."""
        url, sent, timeout = self._call(api, headers, route)
        response: httpx.Response | None = None
        try:
            response = await self._pool().post_bytes(url, dumps(body), sent, timeout, stream=True)
            if response.status_code >= 400:
                text = (await response.aread()).decode("utf-8", errors="replace")
                raise self._mapped(api, route, response.status_code, text, response.headers)
            events = _events(response)
            first = await anext(events, None)
            if first is None:
                raise ProviderError("The provider's stream ended without any event.", status=502)
            _raise_if_error(first)
        except BaseException as exc:
            if response is not None:
                await response.aclose()
            if isinstance(exc, ProxyError) or not isinstance(exc, Exception):
                raise
            raise translate_provider_error(exc, secrets=_secrets(route)) from exc
        return _relay(first, events, response, route)

    def _pool(self) -> PooledClient:
        if self._client is None:
            self._client = litellm_client(self._parts)  # litellm's own transport (``provider/pool.py``)
        return self._client

    def _call(
        self, api: Api, headers: Mapping[str, str], route: Mapping[str, Any]
    ) -> tuple[str, dict[str, str], float]:
        """The URL, the headers (credentials first, then the API's own the client sent) and the timeout."""
        timeout = float(route.get("timeout") or self._timeout)
        key = route.get("api_key")
        base = route.get("api_base") or route.get("base_url")
        if api == "messages":
            key = key or os.environ.get("ANTHROPIC_API_KEY")
            base = base or os.environ.get("ANTHROPIC_API_BASE") or os.environ.get("ANTHROPIC_BASE_URL")
            url = self._parts["ensure_api_route"](str(base or _ANTHROPIC_BASE), "v1/messages")
            sent = {"content-type": "application/json", "anthropic-version": _ANTHROPIC_VERSION}
            if key:
                sent["x-api-key"] = str(key)
        else:
            key = key or os.environ.get("OPENAI_API_KEY")
            base = base or os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE") or _OPENAI_BASE
            url = str(base).rstrip("/") + "/responses"
            sent = {"content-type": "application/json"}
            if key:
                sent["authorization"] = f"Bearer {key}"
        sent.update({name.lower(): value for name, value in headers.items()})
        return url, sent, timeout

    def _mapped(
        self, api: Api, route: Mapping[str, Any], status: int, text: str, headers: Mapping[str, str]
    ) -> ProxyError:
        """A refused request, mapped as litellm maps the provider's failure, then translated."""
        provider = "anthropic" if api == "messages" else "openai"
        error_class = self._parts["AnthropicError"] if api == "messages" else self._parts["OpenAIError"]
        original = error_class(status_code=status, message=text, headers=dict(headers))
        model = str(route.get("model") or "").split("/", 1)[-1]
        try:
            mapped: Exception = self._parts["exception_type"](
                model=model,
                original_exception=original,
                custom_llm_provider=provider,
                completion_kwargs={},
                extra_kwargs={},
            )
        except Exception as raised:  # exception_type raises its answer rather than returning it
            mapped = raised
        # litellm's mapped error carries the body as its message only; the translation reads the provider's own
        # sentence, type, param and code from the answer itself, as it does for every other provider error.
        # The text is already decoded: the answer is rebuilt without the headers that described its bytes.
        kept = {k: v for k, v in headers.items() if k.lower() not in _BODY_HEADERS}
        answer = httpx.Response(status, content=text.encode(), headers=kept, request=httpx.Request("POST", "/"))
        mapped.__cause__ = _Refused(text, answer)
        return translate_provider_error(mapped, secrets=_secrets(route))


async def _relay(
    first: dict[str, Any],
    events: AsyncIterator[dict[str, Any]],
    response: httpx.Response,
    route: Mapping[str, Any],
) -> AsyncIterator[dict[str, Any]]:
    """The events, the first one already read; an error event mid-stream is raised translated."""
    try:
        yield first
        async for event in events:
            _raise_if_error(event)
            yield event
    except ProxyError:
        raise
    except Exception as exc:
        raise translate_provider_error(exc, secrets=_secrets(route)) from exc
    finally:
        await response.aclose()


async def _events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON ``data`` of each server-sent event (both APIs name the event's type inside it)."""
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            text, data = "\n".join(data), []
            if text == "[DONE]":
                continue
            event = json.loads(text)
            if isinstance(event, dict):
                yield event
    if data and (text := "\n".join(data)) != "[DONE]":
        event = json.loads(text)
        if isinstance(event, dict):
            yield event


def _raise_if_error(event: Mapping[str, Any]) -> None:
    """An ``error`` event (Anthropic's mid-stream error, the Responses API's ``error``) as the failure it is."""
    if event.get("type") != "error":
        return
    inner = event.get("error")
    error: Mapping[str, Any] = inner if isinstance(inner, Mapping) else event
    message = str(error.get("message") or "The provider's stream reported an error.")
    raise translate_provider_error(_StreamError(message, dict(event)))


class _Refused(Exception):
    """The provider's refusal as it answered it, for the translation to read beside litellm's mapping."""

    def __init__(self, text: str, response: httpx.Response) -> None:
        super().__init__(text)
        self.response = response


class _StreamError(Exception):
    """An error event inside a 200 stream, for the translation to read as it reads any provider error."""

    def __init__(self, message: str, body: dict[str, Any]) -> None:
        super().__init__(message)
        self.message = message
        self.body = body
        self.status_code = 500


def _secrets(route: Mapping[str, Any]) -> list[str]:
    return [str(route["api_key"])] if route.get("api_key") else []
