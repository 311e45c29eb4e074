"""Recording live traffic: client requests as received and the provider exchanges they caused.

vcrpy patches the HTTP library process-wide, so it cannot tell two concurrent sessions' calls apart;
this recorder sits at the provider adapter instead. ``RecordingMiddleware`` (``proxy/edge/recording.py``,
pure ASGI: it runs in the request's own task) opens a capture per client request (``Recorder.capturing``
puts it in a ``ContextVar``); ``RecordingBackend`` wraps the real ``ProviderBackend`` and adds each call
to the capture of the request that made it, tagged with its kind and index (``call_tag.py``). When the
response is complete the capture is written under the session's folder (``cassette.py``). Nothing here
is installed unless ``CONTEXT_PROXY_RECORD_DIR`` (or ``serve --record``) is set.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.kernel.errors import ContextOverflow, ProxyError
from proxy.kernel.route_api import Api
from proxy.provider.base import ProviderBackend
from proxy.provider.call_tag import current_tag, take_shadow_candidate
from proxy.provider.cassette import Exchange, RecordedRequest
from proxy.provider.redaction import redact_llm_input, without_credentials

log = logging.getLogger("context_proxy.record")

# The conversation in each wire format: kept as sent (redacting a URL inside a message would make the
# replayed request differ from the recorded one).
_CLIENT_CONTENT = frozenset({"messages", "input", "instructions", "system", "tools", "tool_choice", "response_format"})
_TRANSPORT_HEADERS = frozenset(
    {"host", "content-length", "connection", "transfer-encoding", "accept-encoding", "keep-alive"}
)
_ACTIVE: ContextVar[Capture | None] = ContextVar("context_proxy_recording", default=None)


@dataclass
class Capture:
    """What one client request has done so far."""

    stamp: str
    method: str
    path: str
    headers: dict[str, str]
    body: bytearray = field(default_factory=bytearray)
    status: int = 0
    answer: bytearray = field(default_factory=bytearray)
    context_id: str = ""
    mode: str = ""
    exchanges: list[Exchange] = field(default_factory=list)
    shadow: dict[str, dict[str, Any]] = field(default_factory=dict)
    _counts: Counter[str] = field(default_factory=Counter)

    def start(self, llm_input: dict[str, Any]) -> Exchange:
        """A new exchange for the call about to be made, tagged and numbered within this request."""
        key = current_tag().key
        index = self._counts[key]
        self._counts[key] += 1
        exchange = Exchange(key, index, redact_llm_input(llm_input))
        self.exchanges.append(exchange)
        candidate = take_shadow_candidate()
        if candidate is not None:
            self.shadow[f"{key}#{index}"] = redact_llm_input(candidate)
        return exchange


class Recorder:
    """Writes captures under ``root``; ``framing_nonce`` is set once the turn service exists."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.framing_nonce: Callable[[str], str] = lambda context_id: ""
        self.failures = 0
        self._counter = itertools.count(1)

    def wrap(self, backend: ProviderBackend) -> RecordingBackend:
        """``backend`` with every call recorded into the capture of the request making it."""
        return RecordingBackend(backend)

    def begin(self, method: str, path: str, headers: Mapping[str, str]) -> Capture:
        """A capture for one client request (``path`` with its query string; ``headers`` lower-cased)."""
        kept = {k: v for k, v in without_credentials(headers).items() if k not in _TRANSPORT_HEADERS}
        stamp = f"{int(time.time() * 1000):013d}-{next(self._counter):06d}"
        return Capture(stamp, method, path, kept)

    @contextmanager
    def capturing(self, capture: Capture) -> Iterator[None]:
        """Within the block (the request's own task), every provider call is added to ``capture``."""
        token = _ACTIVE.set(capture)
        try:
            yield
        finally:
            _ACTIVE.reset(token)

    def finish(self, capture: Capture) -> None:
        """Write the capture (best-effort, like traces: a failed write is logged and counted)."""
        if not capture.context_id:
            return  # refused before a session was known (authentication, an unreadable body): nothing to replay
        try:
            RecordedRequest(
                stamp=capture.stamp,
                context_id=capture.context_id,
                method=capture.method,
                path=capture.path,
                headers=capture.headers,
                body=_client_body(bytes(capture.body)),
                status=capture.status,
                answer=capture.answer.decode("utf-8", errors="replace"),
                mode=capture.mode,
                nonce=self.framing_nonce(capture.context_id),
                shadow=capture.shadow,
                exchanges=capture.exchanges,
            ).write(self.root)
        except (OSError, ValueError, TypeError) as exc:
            self.failures += 1
            log.warning("recording of %s not written (%d failed so far): %s", capture.path, self.failures, exc)


class RecordingBackend:
    """A ``ProviderBackend`` that records each call's arguments and answer, then hands it on unchanged."""

    def __init__(self, inner: ProviderBackend) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)  # model_map_limits and whatever else the wrapped backend offers

    def provider_arguments(self, llm_input: dict[str, Any]) -> dict[str, Any]:
        """What the wrapped backend calls the provider with (recording adds nothing)."""
        return self._inner.provider_arguments(llm_input)

    async def complete(self, llm_input: dict[str, Any]) -> dict[str, Any]:
        """The wrapped backend's answer, recorded."""
        capture = _ACTIVE.get()
        if capture is None:
            return await self._inner.complete(llm_input)
        exchange = capture.start(llm_input)
        try:
            response = await self._inner.complete(llm_input)
        except ProxyError as exc:
            exchange.error = error_record(exc)
            raise
        exchange.response = copy.deepcopy(response)
        return response

    async def stream(self, llm_input: dict[str, Any], *, usage_to_caller: bool = True) -> AsyncIterator[dict[str, Any]]:
        """The wrapped backend's chunks, recorded as they pass."""
        capture = _ACTIVE.get()
        if capture is None:
            return await self._inner.stream(llm_input, usage_to_caller=usage_to_caller)
        exchange = capture.start(llm_input)
        try:
            chunks = await self._inner.stream(llm_input, usage_to_caller=usage_to_caller)
        except ProxyError as exc:
            exchange.error = error_record(exc)
            raise
        exchange.chunks = []
        return _recorded(chunks, exchange)

    async def complete_native(
        self, api: Api, body: dict[str, Any], headers: Mapping[str, str], route: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The wrapped backend's native answer, recorded (the request as ``{"native_api": api, ...body}``)."""
        capture = _ACTIVE.get()
        if capture is None:
            return await self._inner.complete_native(api, body, headers, route)
        exchange = capture.start(native_input(api, body))
        try:
            response = await self._inner.complete_native(api, body, headers, route)
        except ProxyError as exc:
            exchange.error = error_record(exc)
            raise
        exchange.response = copy.deepcopy(response)
        return response

    async def stream_native(
        self, api: Api, body: dict[str, Any], headers: Mapping[str, str], route: Mapping[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """The wrapped backend's native events, recorded as they pass."""
        capture = _ACTIVE.get()
        if capture is None:
            return await self._inner.stream_native(api, body, headers, route)
        exchange = capture.start(native_input(api, body))
        try:
            events = await self._inner.stream_native(api, body, headers, route)
        except ProxyError as exc:
            exchange.error = error_record(exc)
            raise
        exchange.chunks = []
        return _recorded(events, exchange)


def native_input(api: Api, body: dict[str, Any]) -> dict[str, Any]:
    """How a native call's request is recorded and replayed: its body, tagged with its API."""
    return {"native_api": api, **body}


async def _recorded(chunks: AsyncIterator[dict[str, Any]], exchange: Exchange) -> AsyncIterator[dict[str, Any]]:
    kept = exchange.chunks if exchange.chunks is not None else []
    try:
        async for chunk in chunks:
            kept.append(copy.deepcopy(chunk))
            yield chunk
    except ProxyError as exc:
        exchange.error = error_record(exc)
        raise
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


def error_record(exc: ProxyError) -> dict[str, Any]:
    """What replay needs to raise the same error again."""
    record: dict[str, Any] = {"status": exc.status, "class": type(exc).__name__, **exc.body()}
    if isinstance(exc, ContextOverflow):
        record.update(limit=exc.limit, providerMessage=exc.provider_message, countsOutput=exc.counts_output)
    return record


def _client_body(raw: bytes) -> Any:
    """The client's body without credential fields (the conversation itself is kept as sent)."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        return raw.decode("utf-8", errors="replace")
    if not isinstance(body, dict):
        return body
    rest = redact_llm_input({k: v for k, v in body.items() if k not in _CLIENT_CONTENT})
    return {k: v if k in _CLIENT_CONTENT else rest[k] for k, v in body.items() if k in _CLIENT_CONTENT or k in rest}
