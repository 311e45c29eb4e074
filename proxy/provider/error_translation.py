"""Translate whatever a provider call raised into the proxy's error hierarchy, once, at the boundary.

litellm wraps provider answers in its own exception classes, but its class and ``str(exc)`` lose
information: a plain-text body becomes "Error code: 400", an error event inside a 200 stream becomes a
500 ``InternalServerError``, a connection failure is also a 500. So the provider's own words are read
from the exception's ``body`` and ``response`` (and those of the exceptions it wraps), the status is
decided from what the upstream actually answered, and the overflow normalizer gets the last word on
whether this is a context overflow. litellm's own ``ContextWindowExceededError`` is trusted unless the
text is a known look-alike (litellm classes OpenAI's 10 MiB string limit as an overflow).

litellm is not imported here: its exceptions subclass openai's, and the rest is read by duck typing,
so this module stays cheap to import and works for the openai SDK's and httpx's exceptions too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from proxy.kernel.errors import ContextOverflow, InvalidRequest, ProviderError, ProxyError
from proxy.provider.overflow import (
    OverflowHints,
    detect_overflow,
    lookalike_reason,
    parse_error_body,
    provider_message,
    stated_limit,
)

_TYPE_BY_STATUS = {
    401: "authentication_error",
    403: "permission_error",
    408: "timeout_error",
    429: "rate_limit_error",
    504: "timeout_error",
}
_DEFAULT_CODE = {408: "timeout", 413: "request_too_large", 429: "rate_limit_exceeded", 504: "timeout"}
# litellm prefixes its class names ("litellm.BadRequestError: OpenAIException - ..."); clients want
# the provider's sentence.
_PREFIX = re.compile(r"^\s*(?:litellm\.\w+:|\w*(?:Error|Exception):|\w+Exception\s+-|\w+Error\s+-)\s*")
_USELESS = re.compile(r"^(?:error code: \d{3}\s*)?$", re.IGNORECASE)
_SECRET_PATTERNS = (
    (re.compile(r"(?i)\b(bearer|basic)\s+[^\s\"',;]+"), r"\1 ***"),
    (re.compile(r"\b(sk|pk|rk)-[A-Za-z0-9_\-*.]{3,}"), r"\1-***"),
    (re.compile(r"\bAIza[0-9A-Za-z_\-]{20,}"), "***"),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "***"),
    (re.compile(r"(?i)([?&](?:key|api[_-]?key|access_token|token|sig)=)[^&\s\"']+"), r"\1***"),
    (
        re.compile(r"(?i)((?:api[_-]?key|authorization)[\"']?\s*[:=]\s*[\"']?)(?!(?:bearer|basic)\s)[^\s\"',}]+"),
        r"\1***",
    ),
)
_MAX_MESSAGE = 2000
_RETRY_AFTER = re.compile(r"^[A-Za-z0-9 ,:.\-]{1,64}$")  # seconds or an HTTP date; nothing else passes


@dataclass
class _Facts:
    """What the exception and the exceptions it wraps say about the provider's answer."""

    upstream_status: int | None = None  # the HTTP status the provider really answered with
    litellm_status: int | None = None  # the status litellm (or openai) attached, maybe synthesized
    bodies: list[Any] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    timed_out: bool = False
    unreachable: bool = False
    midstream: bool = False
    broke_off: bool = False  # the answer began but its body ended early (connection closed mid-JSON)
    transport: bool = False  # a network-level error is in the chain
    local: str | None = None  # litellm could not build the call from this request (its own words)


def translate_provider_error(
    exc: BaseException, *, secrets: Iterable[str] = (), hints: OverflowHints | None = None
) -> ProxyError:
    """Map an exception from a provider call to a ``ProxyError``.

    A recognized context overflow becomes ``ContextOverflow`` (400, ``context_length_exceeded``) with
    the stated limit. Anything else becomes ``ProviderError`` whose status is the provider's 4xx as is,
    500/502/503/504 as is (other 5xx: 503), 504 when it did not answer in time (408 when it said 408),
    502 when it could not be reached or answered something that is not an answer; ``retry-after`` is
    passed on. Messages are the provider's own words, with API keys (and ``secrets``) masked. ``hints``
    (is the server local, how full was the window) only decide errors whose words are weak.
    """
    if isinstance(exc, ProxyError):
        return exc
    facts = _read(exc)
    keys = [s for s in secrets if len(s) >= 4]
    text = "\n".join(facts.texts)
    status = facts.upstream_status or facts.litellm_status
    message = _provider_sentence(facts)
    overflow = detect_overflow(status, facts.bodies, text, hints=hints)
    if overflow is not None:
        # The normalizer quotes the body's message; when it matched only litellm's text, that text
        # is the joined exception messages, so the cleaned-up sentence reads better.
        words = redact(message if overflow.message == text else overflow.message, keys)
        return ContextOverflow(
            words, limit=overflow.limit, counts_output=overflow.counts_output, provider_message=words
        )
    if _mro_has(exc, "ContextWindowExceededError") and lookalike_reason(status, facts.bodies, text) is None:
        return ContextOverflow(redact(message, keys), limit=stated_limit(text), provider_message=redact(message, keys))
    mapped = _mapped_status(exc, facts)
    code = _provider_code(facts.bodies) or _DEFAULT_CODE.get(mapped)
    if facts.midstream and not facts.upstream_status:
        message = f"The provider's stream broke off: {message}"
    elif facts.broke_off and not facts.upstream_status:
        code, message = "provider_answer_incomplete", f"The provider's answer broke off mid-body: {message}"
    elif facts.local is not None and not facts.upstream_status:
        # litellm wraps its own refusal to translate a request (an unknown content part, say) in an
        # APIConnectionError; nothing was sent, and retrying the same request cannot help.
        return InvalidRequest(
            redact(f"The provider call could not be made from this request: {facts.local}", keys),
            code="invalid_provider_request",
        )
    elif facts.unreachable and not facts.upstream_status:
        code, message = "provider_unreachable", f"Could not reach the provider: {message}"
    elif mapped == 504 and not facts.upstream_status:
        message = f"The provider did not answer in time: {message}"
    headers = {"retry-after": value} if mapped in (429, 503) and (value := _retry_after(facts.headers)) else {}
    error_type = _TYPE_BY_STATUS.get(mapped, "invalid_request_error" if mapped < 500 else "api_error")
    param = _provider_param(facts.bodies) if 400 <= mapped < 500 else None
    return ProviderError(redact(message, keys), status=mapped, type=error_type, code=code, param=param, headers=headers)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with API keys, bearer tokens, key query parameters and the given ``secrets`` masked,
    cut to a readable length (a gateway's HTML error page is not a message)."""
    for secret in secrets:
        text = text.replace(secret, "***")
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE] + "…"  # masked first: no half keys


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, what litellm wrapped in it, and its causes; each once, a bounded number."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo and len(seen) < 12:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        original = getattr(current, "original_exception", None)
        todo.extend(e for e in (original, current.__cause__, current.__context__) if isinstance(e, BaseException))


def _read(exc: BaseException) -> _Facts:
    facts = _Facts(midstream=_mro_has(exc, "MidStreamFallbackError"))
    for current in _chain(exc):
        status = getattr(current, "status_code", None)
        if facts.litellm_status is None and isinstance(status, int) and not isinstance(status, bool):
            facts.litellm_status = status
        body = getattr(current, "body", None)
        if body is not None:
            facts.bodies.append(body)
        response = _real_response(current)
        if response is not None:
            facts.upstream_status = facts.upstream_status or response.status_code
            facts.bodies.append(parse_error_body(response.content))
            facts.headers = {**{k.lower(): v for k, v in response.headers.items()}, **facts.headers}
        extra = getattr(current, "headers", None)
        if isinstance(extra, (dict, httpx.Headers)):
            facts.headers = {**{str(k).lower(): str(v) for k, v in extra.items()}, **facts.headers}
        message = getattr(current, "message", None)
        facts.texts.append(message if isinstance(message, str) else str(current))
        if isinstance(current, (openai.APITimeoutError, httpx.TimeoutException, TimeoutError)):
            facts.timed_out = True
        elif isinstance(current, (openai.APIConnectionError, httpx.TransportError, ConnectionError)):
            facts.unreachable = True
        if isinstance(current, (httpx.TransportError, OSError)) or _mro_has_any(current, _TRANSPORT_ERRORS):
            facts.transport = True
        if _mro_has_any(current, _BROKEN_BODY_ERRORS) or (
            isinstance(current, httpx.RemoteProtocolError) and _INCOMPLETE_BODY.search(str(current))
        ):
            facts.broke_off = True
    facts.local = _local_failure(exc, facts)
    return facts


# aiohttp (litellm's default transport) and http.client name a body that ended before its declared
# length or final chunk like this; httpx says it in the RemoteProtocolError message.
_BROKEN_BODY_ERRORS = frozenset({"ClientPayloadError", "ContentLengthError", "TransferEncodingError", "IncompleteRead"})
_INCOMPLETE_BODY = re.compile(r"incomplete|complete message body", re.IGNORECASE)
_TRANSPORT_ERRORS = frozenset({"ClientConnectionError", "ClientOSError", "ServerDisconnectedError", "ClientError"})


def _local_failure(exc: BaseException, facts: _Facts) -> str | None:
    """litellm's own words when it refused to build the call (a plain exception inside its
    APIConnectionError, no network error, no answer), else None."""
    if not _mro_has(exc, "APIConnectionError") or facts.transport or facts.midstream or facts.timed_out:
        return None
    causes = [e for e in _chain(exc) if type(e).__module__ == "builtins" and not isinstance(e, StopAsyncIteration)]
    return str(causes[-1]) if causes and str(causes[-1]) else None


def _real_response(exc: BaseException) -> httpx.Response | None:
    """The provider's HTTP response, if this exception carries one.

    litellm fills ``response`` with a synthesized, empty one when it has none; only a response with a
    body (or a status litellm would not invent) is taken as what the provider really answered.
    """
    response = getattr(exc, "response", None)
    if not isinstance(response, httpx.Response):
        return None
    try:
        content = response.content
    except (httpx.ResponseNotRead, RuntimeError):
        return None
    return response if content.strip() else None


def _mapped_status(exc: BaseException, facts: _Facts) -> int:
    upstream = facts.upstream_status
    if facts.timed_out and upstream in (None, 408, 504):
        return upstream or 504
    if upstream is None and (facts.unreachable or facts.midstream):
        return 502  # no usable answer: could not connect, or the stream broke after it began
    status = upstream or facts.litellm_status
    if status is None:
        return 502 if isinstance(exc, (openai.OpenAIError, httpx.HTTPError)) else 500
    if upstream is None and status == 500 and _mro_has(exc, "InternalServerError"):
        return 502  # litellm's "empty or invalid response" carries an invented 500
    if 400 <= status < 500 or status in (500, 502, 503, 504):
        return status
    if status >= 500:
        return 503  # e.g. Anthropic's 529 "overloaded": clients retry a 503 the same way
    return 502  # an error inside a 2xx answer (an error event in a stream)


def _provider_sentence(facts: _Facts) -> str:
    for body in facts.bodies:
        message = provider_message(body)
        if message:
            return message
    for text in facts.texts:
        cleaned = text
        while (stripped := _PREFIX.sub("", cleaned, count=1)) != cleaned:
            cleaned = stripped
        if not _USELESS.match(cleaned):
            return cleaned.strip()
    status = facts.upstream_status or facts.litellm_status
    return f"The provider answered HTTP {status} without a message." if status else "The provider call failed."


def _provider_code(bodies: list[Any]) -> str | None:
    for body in bodies:
        node = body[0] if isinstance(body, list) and body else body
        if isinstance(node, dict):
            inner = node.get("error")
            for candidate in (inner.get("code") if isinstance(inner, dict) else None, node.get("code")):
                if isinstance(candidate, str) and candidate:
                    return candidate
    return None


def _provider_param(bodies: list[Any]) -> str | None:
    """The request field a provider's 4xx names (OpenAI's ``error.param``), if any."""
    for body in bodies:
        node = body[0] if isinstance(body, list) and body else body
        inner = node.get("error") if isinstance(node, dict) else None
        param = inner.get("param") if isinstance(inner, dict) else None
        if isinstance(param, str) and param:
            return param
    return None


def _retry_after(headers: dict[str, str]) -> str | None:
    value = headers.get("retry-after")
    if value and _RETRY_AFTER.match(value.strip()):
        return value.strip()
    millis = headers.get("retry-after-ms")
    try:
        return str(math.ceil(float(millis) / 1000)) if millis else None
    except ValueError:
        return None


def _mro_has(exc: BaseException, name: str) -> bool:
    return any(cls.__name__ == name for cls in type(exc).__mro__)


def _mro_has_any(exc: BaseException, names: frozenset[str]) -> bool:
    return any(cls.__name__ in names for cls in type(exc).__mro__)
