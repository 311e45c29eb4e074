"""The one door to the provider: ``litellm.acompletion``, with errors translated at this boundary.

The rest of the proxy sees only ``ProviderBackend`` (``proxy/provider/base.py``): OpenAI-shaped dicts in
and out, and ``ProxyError`` subclasses (``ContextOverflow`` among them) on failure. Tests can hand the
runtime another backend; this one imports litellm lazily so that building the app stays cheap and offline-safe.
"""

from __future__ import annotations

import functools
import inspect
import ipaddress
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from proxy.kernel.errors import EmptyStream, ProviderError, ProxyError
from proxy.kernel.route_api import Api
from proxy.kernel.usage import ModelPrices
from proxy.process.offline import prepare_offline_environment
from proxy.provider.error_translation import translate_provider_error
from proxy.provider.fast.messages import copied_messages
from proxy.provider.native_transport import NativeTransport
from proxy.provider.overflow import OverflowHints
from proxy.provider.pool import PerLoopSdkClient, install_sdk_session
from proxy.provider.serialize import StreamSerializer, response_to_openai

if TYPE_CHECKING:
    from proxy.provider.fast import FastPath


class LiteLLMBackend:
    """The default backend: litellm adapts every call. A plain OpenAI-compatible, Azure OpenAI or Anthropic
    completion (streamed or not) goes through litellm's transformation layer over one pooled client
    (``proxy.provider.fast``); the rest through
    ``litellm.acompletion``. ``fast_path=False`` sends everything through ``acompletion`` (benchmarks,
    the tests that compare both paths)."""

    def __init__(self, timeout_seconds: float, *, fast_path: bool = True) -> None:
        prepare_offline_environment()
        import litellm  # deferred: importing litellm costs seconds and must follow the offline set-up

        litellm.suppress_debug_info = True  # no "Give Feedback" banner on every provider error
        logging.getLogger("LiteLLM").setLevel(logging.WARNING)  # not one INFO line per call
        from proxy.provider.fast.surface import load

        self._parts = load()  # the litellm pieces the fast path, native passage and the SDK routes' client use
        install_sdk_session(litellm, self._parts)  # acompletion's OpenAI and Azure calls keep no cookies either
        self._litellm = litellm
        self._timeout = timeout_seconds
        self._fast: FastPath | None = None
        if fast_path:
            from proxy.provider.fast import FastPath

            self._fast = FastPath(litellm, self._parts)
        self._native: NativeTransport | None = None  # made on the first native call

    async def aclose(self) -> None:
        """Close the provider connections litellm opened on this event loop, and the fast path's pool;
        call on shutdown, on that loop."""
        await close_loop_clients(self._litellm)
        if self._fast is not None:
            await self._fast.aclose()
        if self._native is not None:
            await self._native.aclose()

    def model_map_limits(self, model: str) -> tuple[int | None, int | None]:
        """(max input tokens, max output tokens) from litellm's bundled model map; ``None`` where unknown."""
        try:
            info = self._litellm.get_model_info(model)
        except Exception:  # litellm raises a bare Exception for models its map does not know
            return None, None
        return info.get("max_input_tokens"), info.get("max_output_tokens")

    @functools.lru_cache(maxsize=256)  # noqa: B019 - one backend per app, a handful of route models
    def model_prices(self, model: str) -> ModelPrices | None:
        """The model's prices per token from litellm's bundled cost map; ``None`` where it has none."""
        try:
            info = self._litellm.get_model_info(model)
        except Exception:  # litellm raises a bare Exception for models its map does not know
            return None
        given = info.get("input_cost_per_token")
        if not isinstance(given, int | float):
            return None
        read, write = info.get("cache_read_input_token_cost"), info.get("cache_creation_input_token_cost")
        return ModelPrices(
            input=float(given),
            output=float(info.get("output_cost_per_token") or 0.0),
            cache_read=float(read) if isinstance(read, int | float) else None,
            cache_write=float(write) if isinstance(write, int | float) else None,
        )

    def provider_arguments(self, llm_input: dict[str, Any]) -> dict[str, Any]:
        """``llm_input`` with the timeout and the retry switches this backend always sets."""
        # Applied last, whatever the input says. Retries belong to the client (the SDKs retry on their
        # own); a proxy that also retries multiplies every provider outage by both retry budgets. A
        # route's own ``timeout`` (operator config) is kept; clients cannot send one (client_params).
        return {
            **llm_input,
            "timeout": llm_input.get("timeout", self._timeout),
            "max_retries": 0,
            "num_retries": 0,
        }

    async def complete(self, llm_input: dict[str, Any]) -> dict[str, Any]:
        """Call the provider once and return its answer as an OpenAI response dict."""
        arguments = self.provider_arguments(llm_input)
        try:
            fast = self._fast.accepted(arguments) if self._fast is not None else None
            if self._fast is not None and fast is not None:
                response = await self._fast.complete(fast, arguments["timeout"])
            else:
                response = await self._litellm.acompletion(**_own_messages(arguments))
        except ProxyError:
            raise
        except Exception as exc:  # the boundary: every provider failure is translated here
            raise translate_provider_error(exc, secrets=_secrets(llm_input), hints=overflow_hints(llm_input)) from exc
        answer = response_to_openai(response)
        if not answer["choices"]:
            # litellm passes ``choices: []`` on as a response; an agent would crash on choices[0].
            raise ProviderError("The provider answered without any choice (choices is empty).", status=502)
        return answer

    async def stream(self, llm_input: dict[str, Any], *, usage_to_caller: bool = True) -> AsyncIterator[dict[str, Any]]:
        """Open the stream and read it up to its first chunk with substance (a delta or usage), so that
        a provider error, or a stream with no answer at all, is still an HTTP error.

        ``usage_to_caller=False``: the usage ``llm_input`` asks for is the proxy's own, kept from the client.
        Where the fast path can (``Adapter.reports_provider_usage``), the last chunk then carries the
        provider's own usage figures, instead of the usage chunk litellm's wrapper makes by rebuilding the
        whole answer once the provider's last chunk is in (1.5 ms for an agent's three-chunk answer here,
        between that chunk and the end of the client's stream)."""
        secrets = _secrets(llm_input)
        hints = overflow_hints(llm_input)
        serializer = StreamSerializer()
        upstream = None
        reported = False  # the usage chunk is made here, from the provider's own (``_reported_usage_chunk``)
        try:
            arguments = self.provider_arguments({**llm_input, "stream": True})
            fast = self._fast.accepted(arguments) if self._fast is not None else None
            if self._fast is not None and fast is not None:
                reported = not usage_to_caller and fast.adapter.reports_provider_usage
                upstream = await self._fast.stream(fast, arguments["timeout"], usage_to_caller=not reported)
            else:
                upstream = await self._litellm.acompletion(**_own_messages(arguments))
            iterator = upstream.__aiter__()
            ahead: list[dict[str, Any]] = []
            while not any(_has_substance(out) for out in ahead):
                try:
                    chunk = await iterator.__anext__()
                except StopAsyncIteration:
                    # litellm turns a stream of nothing into one empty "stop" chunk; neither is an answer.
                    # A stream that only carries usage (include_usage) has substance and passes: the
                    # provider's own, where the wrapper was told to keep it (``reported``).
                    usage = _reported_usage_chunk(upstream, serializer) if reported else None
                    if usage is None:
                        raise EmptyStream("The provider's stream ended without any choice content or usage.") from None
                    ahead.append(usage)
                    reported = False  # made already: the stream has nothing left
                    break
                ahead += serializer.feed(chunk)
        except ProxyError:
            await _close(upstream)
            raise
        except Exception as exc:  # the boundary: every provider failure is translated here
            await _close(upstream)
            raise translate_provider_error(exc, secrets=secrets, hints=hints) from exc
        relayed = ProviderStream()
        relayed.chunks = _relay(upstream, iterator, serializer, ahead, secrets, hints, relayed, reported=reported)
        return relayed

    async def complete_native(
        self, api: Api, body: dict[str, Any], headers: Mapping[str, str], route: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A native request's answer, as the provider sent it (``native_transport.py``)."""
        return await self._transport().complete(api, body, headers, route)

    async def stream_native(
        self, api: Api, body: dict[str, Any], headers: Mapping[str, str], route: Mapping[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """A native request's events, as the provider sent them."""
        return await self._transport().stream(api, body, headers, route)

    def _transport(self) -> NativeTransport:
        if self._native is None:
            self._native = NativeTransport(self._litellm, self._parts, self._timeout)
        return self._native


def _own_messages(arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` with a shallow copy of each message (``copied_messages``: litellm writes into them)."""
    messages = arguments.get("messages")
    if not isinstance(messages, list):
        return arguments
    return {**arguments, "messages": copied_messages(messages)}


def _has_substance(chunk: dict[str, Any]) -> bool:
    return chunk.get("usage") is not None or any(choice["delta"] for choice in chunk["choices"])


async def _close(upstream: Any) -> None:
    aclose = getattr(upstream, "aclose", None)
    if aclose is not None:
        await aclose()


async def close_loop_clients(litellm: Any) -> None:
    """Close the HTTP clients the ``litellm`` module cached for the running event loop, and forget them.

    litellm caches its HTTP clients per event loop (the loop is part of the cache key) and never
    closes them: after the loop stops, their keep-alive sockets linger until the cache drops them and
    garbage collection finds them, unclosed. Only this loop's clients are closed, so another app in
    the same process (a second server, a test) keeps its own. With them, this loop's client inside
    ``litellm.aclient_session`` (``pool.PerLoopSdkClient``), which its SDK clients wrap.
    """
    cache = litellm.in_memory_llm_clients_cache
    this_loop = cache.update_cache_key_with_event_loop("")  # "-<loop token>": how litellm scopes a key
    for key in [key for key in list(cache.cache_dict) if this_loop and key.endswith(this_loop)]:
        client = cache.cache_dict.pop(key, None)
        cache.ttl_dict.pop(key, None)
        await _close_client(client)
    if isinstance(litellm.aclient_session, PerLoopSdkClient):  # ours; one an embedder set is theirs to close
        await litellm.aclient_session.aclose()  # this loop's client (its SDK clients above may have closed it)


async def _close_client(client: object) -> None:
    """Close an SDK or httpx client, whichever way it closes (``aclose()``, or an async ``close()``)."""
    close = getattr(client, "aclose", None) or getattr(client, "close", None)
    if close is None:
        return
    closing = close()
    if inspect.isawaitable(closing):
        await closing


# litellm calls these on localhost when no api_base is given.
_LOCAL_BY_DEFAULT = ("ollama/", "ollama_chat/", "lm_studio/", "llamafile/")


def overflow_hints(llm_input: dict[str, Any]) -> OverflowHints:
    """What this backend knows of the call beside the error: whether the server is a self-hosted one.

    Local inference engines (llama.cpp, LocalAI, Ollama, vLLM on a box of one's own) often answer an
    overflow with a bare 500; the recognizer counts their weaker words then. How full the window was is
    not known here (the window lives in the runtime's limits), so ``fill`` stays None.
    """
    api_base = llm_input.get("api_base")
    if not (isinstance(api_base, str) and api_base):
        model = llm_input.get("model")
        return OverflowHints(local=isinstance(model, str) and model.startswith(_LOCAL_BY_DEFAULT))
    return OverflowHints(local=_is_local_host(urlsplit(api_base if "//" in api_base else f"//{api_base}").hostname))


def _is_local_host(host: str | None) -> bool:
    """Loopback, a private or link-local address, ``localhost``, ``*.local``/``*.internal``, or a bare name
    (a compose service such as ``http://vllm:8000``)."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost" or host.endswith((".localhost", ".local", ".internal")) or "." not in host
    return address.is_loopback or address.is_private or address.is_link_local


def _secrets(llm_input: dict[str, Any]) -> list[str]:
    """Credentials a provider might echo back in an error message; they are masked before anyone sees it."""
    return [str(llm_input[key]) for key in ("api_key",) if llm_input.get(key)]


class ProviderStream(AsyncIterator[dict[str, Any]]):
    """A provider's stream as this backend relays it, with what the runtime must know of its usage.

    litellm makes a usage up when the caller asked for one (``stream_options.include_usage``) and the
    provider sent none (llama-cpp-python ignores the option): its own count of the prompt. The client may
    have it as litellm gives it, but it is not the provider's: ``usage_estimated`` says so, and
    calibration does not learn from it (``proxy/runtime/calls.py``)."""

    def __init__(self) -> None:
        self.chunks: AsyncGenerator[dict[str, Any], None] | None = None
        self.usage_estimated = False

    async def __anext__(self) -> dict[str, Any]:
        assert self.chunks is not None  # set by ``LiteLLMBackend.stream`` before it hands the stream out
        return await self.chunks.__anext__()

    async def aclose(self) -> None:
        """Close the relay, and with it the upstream call."""
        if self.chunks is not None:
            await self.chunks.aclose()


def _usage_reported(upstream: Any) -> bool:
    """Whether the provider itself sent a usage: litellm keeps the provider's chunks (``chunks``, a list),
    its own made-up usage is only in the chunk it synthesizes at the end. Read from the end, where a
    provider puts its usage: a long answer's hundred chunks are not walked to find it."""
    return _provider_usage(upstream) is not None


def _provider_usage(upstream: Any) -> Any:
    """The chunk of litellm's wrapper (a copy it keeps in ``chunks``) that carried the provider's last usage."""
    chunks = getattr(upstream, "chunks", None) or []
    return next((chunk for chunk in reversed(chunks) if getattr(chunk, "usage", None) is not None), None)


def _reported_usage_chunk(upstream: Any, serializer: StreamSerializer) -> dict[str, Any] | None:
    """The stream's usage chunk, made of the provider's own usage (``None``: it sent none), in the envelope of
    the stream's chunks, as litellm's wrapper makes its own."""
    chunk = _provider_usage(upstream)
    return None if chunk is None else serializer.usage_chunk(chunk)


async def _relay(
    upstream: Any,
    iterator: Any,
    serializer: StreamSerializer,
    ahead: list[dict[str, Any]],
    secrets: list[str],
    hints: OverflowHints,
    relayed: ProviderStream,
    *,
    reported: bool = False,
) -> AsyncGenerator[dict[str, Any], None]:
    """Yield the chunks read ahead, then the rest; closing this generator (client gone) closes the
    upstream call too. ``reported``: the stream ends with a usage chunk made of the provider's own usage
    (``LiteLLMBackend.stream``), when it sent one.

    ``StreamSerializer`` holds a tool call back until its name is whole, so every ``function.name``
    goes out in exactly one delta (agent SDKs keep only one fragment of it).
    """

    def judged(out: dict[str, Any]) -> dict[str, Any]:
        if out.get("usage") is not None and not _usage_reported(upstream):
            relayed.usage_estimated = True
        return out

    try:
        for out in ahead:
            yield judged(out)
        while True:
            try:
                chunk = await iterator.__anext__()
            except StopAsyncIteration:
                break
            except Exception as exc:  # the boundary, mid-stream
                raise translate_provider_error(exc, secrets=secrets, hints=hints) from exc
            for out in serializer.feed(chunk):
                yield judged(out)
        for out in serializer.finish():
            yield judged(out)
        usage = _reported_usage_chunk(upstream, serializer) if reported else None
        if usage is not None:
            yield usage
    finally:
        await _close(upstream)
