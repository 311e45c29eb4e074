"""The proxy's provider connections: one pooled ``httpx.AsyncClient`` per path that posts for itself
(the fast path, ``fast/``; native passage, ``native_transport.py``), on litellm's own transport; and the
one client litellm's OpenAI and Azure SDK routes post over (``PerLoopSdkClient``).

Built as litellm's OpenAI route builds its client (``_get_async_http_client``): the transport
``AsyncHTTPHandler.create_async_transport`` makes with litellm's SSL settings (aiohttp's, unless the operator
disables it with ``DISABLE_AIOHTTP_TRANSPORT``, then httpx's), so a call connects, and fails to connect,
as acompletion's does. Redirects are not followed. httpx's own pool (httpcore, h11) cost an agent's
140 KB call a third more CPU: its pure-Python HTTP parsing, and a readability check of every pooled
connection on every request.

The client keeps no cookies. Every team's calls share it, and a cookie jar would send what a provider set
on one call (a load balancer's affinity, the login session of a gateway in front of a self-hosted model)
with every later call to that host, another team's and another route's included. A call carries its own
route's credentials and headers, nothing an earlier call left behind. litellm's own shared HTTP handler
refuses them the same way (``blocked_cookie_jar``); the policy is the standard library's, so it holds
whichever litellm is installed.

The calls the fast path declines (an image part, a route's ``extra_headers``, a model litellm bridges to
the Responses API) go through ``litellm.acompletion``, whose OpenAI and Azure routes wrap an SDK client
around an httpx client litellm builds for them and caches by the route's key: every team's calls on a
route share it, and litellm builds it with a cookie jar (its other handlers' clients refuse cookies as
``litellm_client`` does; aiohttp's session under all of them keeps none). litellm takes the client those
SDK routes wrap from ``litellm.aclient_session`` when it is set (its documented way to supply one, which
its client cache never closes); ``install_sdk_session`` sets it to litellm's own client with the same
cookie policy, one per event loop (``PerLoopSdkClient``).
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx


def _keeps_no_cookies() -> CookieJar:
    """A jar whose policy allows no domain: nothing is stored, nothing is sent (module docstring)."""
    return CookieJar(DefaultCookiePolicy(allowed_domains=[]))


def _litellm_transport(parts: Mapping[str, Any]) -> tuple[Any, httpx.AsyncBaseTransport]:
    """litellm's SSL settings and the transport it makes with them."""
    ssl_config = parts["get_ssl_configuration"]()
    transport = parts["AsyncHTTPHandler"].create_async_transport(
        ssl_context=ssl_config if isinstance(ssl_config, ssl.SSLContext) else None,
        ssl_verify=ssl_config if isinstance(ssl_config, bool) else None,
    )
    return ssl_config, transport


def litellm_client(parts: Mapping[str, Any]) -> PooledClient:
    """A new pooled client on litellm's transport; ``parts``: the fast path's litellm surface
    (``fast/surface.py``: ``AsyncHTTPHandler``, ``get_ssl_configuration``)."""
    ssl_config, transport = _litellm_transport(parts)
    return PooledClient(verify=ssl_config, transport=transport)


class PooledClient(httpx.AsyncClient):
    """httpx's client on one transport, no redirects followed, no cookies kept, and ``post_bytes``: its
    ``post`` without the layers of httpx's client a pooled provider call has no use for.

    ``client.post`` spends about a tenth of the CPU of an agent's fast-path turn around the transport: it
    parses the URL again, merges empty defaults (base URL, query, cookies), walks the auth and redirect
    generators, extracts cookies the jar refuses, logs. ``post_bytes`` builds the same request (the
    client's headers under the call's, the URL parsed once per address, the timeout as an extension),
    hands it to the transport, and does what ``send`` does with the answer: the request attached to it and
    to a transport error, the body read unless it is a stream, ``elapsed`` set when the body is done
    (litellm copies it into the errors it makes of a response). What httpx's client would do more with goes
    through its ``send``: a URL with credentials in it (sent as Basic auth), a relative one, a closed client.
    Either way no cycle is left between the response and its stream (``_TimedStream``, ``without_cycle``)."""

    def __init__(self, *, verify: Any, transport: httpx.AsyncBaseTransport) -> None:
        super().__init__(verify=verify, transport=transport, follow_redirects=False, cookies=_keeps_no_cookies())
        self._pooled_transport = transport  # no mounts, no environment proxies: httpx sends every call here

    async def post_bytes(
        self, url: str, content: bytes | str, headers: Mapping[str, str], timeout: float, *, stream: bool = False
    ) -> httpx.Response:
        """What ``post(url, content=content, headers=headers, timeout=timeout)`` returns (``stream``: what
        ``send(build_request(...), stream=True)`` returns: the head read, the body not), sent as it sends it."""
        target = _parsed_url(url)
        if target.userinfo or not target.is_absolute_url or self.is_closed:
            request = self.build_request("POST", url, content=content, headers=headers, timeout=httpx.Timeout(timeout))
            sent = await self.send(request, stream=stream)  # as httpx does it, or its error for a closed client
            without_cycle(sent, streamed=stream)
            return sent
        merged = httpx.Headers(self.headers)
        merged.update(headers)
        timeouts = httpx.Timeout(timeout).as_dict()
        request = httpx.Request("POST", target, headers=merged, content=content, extensions={"timeout": timeouts})
        started = time.perf_counter()
        try:
            response = await self._pooled_transport.handle_async_request(request)
        except httpx.RequestError as exc:
            exc.request = request  # as httpx's client attaches it to what its transport raises
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)  # as httpx's client checks a transport's answer
        response.request = request
        response.stream = _TimedStream(response.stream, response, started)
        if not stream:
            try:
                await response.aread()
            except BaseException:
                await response.aclose()
                raise
        return response


@functools.lru_cache(maxsize=256)
def _parsed_url(url: str) -> httpx.URL:
    """A provider's address, parsed once (an ``httpx.URL`` is immutable); a route has one or two."""
    return httpx.URL(url)


class _TimedStream(httpx.AsyncByteStream):
    """A response's body as its transport gives it, setting the response's ``elapsed`` once it is closed
    (what httpx's client wraps around every answer).

    The response holds this stream and this stream the response: a cycle that keeps the request (the
    provider body: 140 KB for an agent, megabytes on a long history) alive until the cyclic collector
    runs, which after a streamed answer may be dozens of turns later. Closing lets go of the response."""

    def __init__(self, stream: httpx.AsyncByteStream, response: httpx.Response, started: float) -> None:
        self._stream = stream
        self._response: httpx.Response | None = response
        self._started = started

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        if self._response is not None:
            self._response.elapsed = datetime.timedelta(seconds=time.perf_counter() - self._started)
            self._response = None
        await self._stream.aclose()


def without_cycle(response: httpx.Response, *, streamed: bool) -> None:
    """Break the cycle httpx's client leaves between ``response`` and its stream (its ``send`` binds the
    stream to the response, to set ``elapsed``): a read answer's stream gives way to its content, a streamed
    one's lets go of httpx's once closed (``_Released``). Otherwise the request, the provider body, lives on
    until the cyclic collector runs, which the proxy has it do seldom (``process/startup_gc.py``)."""
    if streamed:
        response.stream = _Released(response.stream)
    else:
        response.stream = httpx.ByteStream(response.content)


class _Released(httpx.AsyncByteStream):
    """A response's stream, dropped once closed (``without_cycle``)."""

    def __init__(self, stream: Any) -> None:
        self._stream: Any = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._stream is not None:  # httpx itself refuses to read a closed response before this
            async for chunk in self._stream:
                yield chunk

    async def aclose(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.aclose()


def sdk_route_client(parts: Mapping[str, Any]) -> httpx.AsyncClient:
    """A client as litellm's OpenAI route builds the one its SDK clients wrap (``BaseOpenAILLM.
    _get_async_http_client``, which hands back ``litellm.aclient_session`` instead once that is set):
    its transport, SSL settings, environment proxies, redirects and HTTP/2 setting, and no cookies."""
    ssl_config, transport = _litellm_transport(parts)
    return httpx.AsyncClient(
        verify=ssl_config,
        transport=transport,
        mounts=parts["AsyncHTTPHandler"].create_httpx_proxy_mounts(transport, verify=ssl_config, cert=None),
        follow_redirects=True,
        http2=parts["http2_enabled"](),
        cookies=_keeps_no_cookies(),
    )


def install_sdk_session(litellm: Any, parts: Mapping[str, Any]) -> None:
    """Set ``litellm.aclient_session`` to a ``PerLoopSdkClient`` (module docstring), once per process; a
    session set by someone else (whoever embeds the proxy) is left as it is."""
    if litellm.aclient_session is None:
        litellm.aclient_session = PerLoopSdkClient(functools.partial(sdk_route_client, parts))


class PerLoopSdkClient(httpx.AsyncClient):
    """The client litellm's OpenAI and Azure SDK routes post over: on each event loop, one as litellm
    builds it for them, with a jar that keeps no cookies (``sdk_route_client``).

    One object for the process, as ``litellm.aclient_session`` must be, and one real client per event
    loop behind it, as litellm keeps its own clients: a connection belongs to the loop that opened it, and
    the apps of one process (the tests' servers) each run their own. The SDK builds a request on this
    object (its jar adds no cookie) and sends it here; ``send`` hands it to the running loop's client, and
    breaks the cycle httpx leaves between the answer and its stream (``without_cycle``).
    ``aclose`` closes that loop's client only (an app shutting down, or litellm closing an SDK client);
    the object itself stays usable for the process's life.
    """

    def __init__(self, make: Callable[[], httpx.AsyncClient]) -> None:
        super().__init__(cookies=_keeps_no_cookies())
        self._make = make
        self._by_loop: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}

    async def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        response = await self._loop_client().send(request, **kwargs)
        without_cycle(response, streamed=bool(kwargs.get("stream")))
        return response

    async def aclose(self) -> None:
        client = self._by_loop.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    def _loop_client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._by_loop.get(loop)
        if client is None:
            for gone in [known for known in self._by_loop if known.is_closed()]:
                self._by_loop.pop(gone, None)  # an app that stopped without closing: its loop is gone
            client = self._by_loop[loop] = self._make()
        return client
