"""Proxy errors in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``.

The type follows the HTTP status as Anthropic documents it. A provider that is unavailable (503, which
is also what the proxy makes of a provider's own 529) reads as Anthropic's ``529 overloaded_error``,
which Claude Code retries and reports as an overload. A context overflow that survived the proxy's
forced retry reads ``prompt is too long: N tokens > M maximum``: Claude Code parses those two numbers.
"""

from __future__ import annotations

import re
from typing import Any

from proxy.kernel.errors import AssemblyFailed, ContextOverflow, InvalidRequest, ProxyError
from proxy.kernel.jsonio import JSONAnswer

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
# "... resulted in 20010 tokens", "prompt is too long: 250000 tokens > 200000 maximum", "input length 9000 tokens"
_USED = re.compile(r"(?:resulted in|too long:|requested|input (?:length|is)|prompt has)\s*(\d[\d,]*)\s*tokens", re.I)


def anthropic_status(exc: ProxyError) -> int:
    """The HTTP status Anthropic would answer with."""
    return 529 if exc.status == 503 else exc.status


def error_body(exc: ProxyError) -> dict[str, Any]:
    """Anthropic's error body for ``exc``."""
    status = anthropic_status(exc)
    kind = _TYPE_BY_STATUS.get(status, "api_error" if status >= 500 or status == 409 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def error_response(exc: ProxyError) -> JSONAnswer:
    """The JSON response for ``exc``, with its headers (``retry-after``, ``x-context-id``)."""
    return JSONAnswer(error_body(exc), status_code=anthropic_status(exc), headers=exc.headers)


def prompt_too_long(exc: ContextOverflow | AssemblyFailed, limit: int, estimate: int) -> InvalidRequest:
    """The overflow reworded as Anthropic's: the provider's stated counts where it gave them, else the
    window the proxy knows and its estimate of the client's request (always over the limit)."""
    maximum = exc.limit if isinstance(exc, ContextOverflow) and exc.limit else limit
    text = exc.provider_message if isinstance(exc, ContextOverflow) and exc.provider_message else exc.message
    match = _USED.search(text)
    used = int(match.group(1).replace(",", "")) if match else estimate
    used = max(used, maximum + 1)
    return InvalidRequest(
        f"prompt is too long: {used} tokens > {maximum} maximum",
        code="context_length_exceeded",
        headers=exc.headers,
    )
