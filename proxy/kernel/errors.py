"""The proxy's error hierarchy. Every failure a client can see is one of these.

Foreign exceptions (litellm, providers, the store) are translated into these once, at their boundary;
one handler in the app renders them as OpenAI-shaped JSON:
``{"error": {"message", "type", "param", "code"}}`` with ``status`` as the HTTP status.
"""

from __future__ import annotations

from typing import Any


class ProxyError(Exception):
    """An error with an HTTP status and an OpenAI-shaped body."""

    status: int = 500
    type: str = "api_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        if code is not None:
            self.code = code
        self.param = param
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The OpenAI error body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InvalidRequest(ProxyError):
    """The client's request is malformed or inconsistent (400)."""

    status = 400
    type = "invalid_request_error"


class AuthenticationFailed(ProxyError):
    """Missing or wrong credentials (401)."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class ModelNotFound(ProxyError):
    """The requested model is not served (404)."""

    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class RequestTooLarge(ProxyError):
    """The request body exceeds the configured limit (413)."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class SessionConflict(ProxyError):
    """The session is busy with another turn longer than the lock wait allows (409)."""

    status = 409
    type = "conflict_error"
    code = "session_busy"


class ContextOverflow(ProxyError):
    """The provider rejected the request as larger than the model's context window.

    ``limit`` is the window the provider stated in its message, when it stated one. ``counts_output``
    says the provider counted the requested ``max_tokens`` against the window (lowering it may suffice).
    ``sent_tokens`` is the runtime's estimate of what it sent, set where the request is known.
    """

    status = 400
    type = "invalid_request_error"
    code = "context_length_exceeded"

    def __init__(
        self,
        message: str,
        *,
        limit: int | None = None,
        provider_message: str = "",
        counts_output: bool = False,
        sent_tokens: int | None = None,
        **kw: Any,
    ) -> None:
        # LangChain recognizes an overflow only when the message text names the code.
        if "context_length_exceeded" not in message:
            message = f"context_length_exceeded: {message}"
        super().__init__(message, **kw)
        self.limit = limit
        self.provider_message = provider_message
        self.counts_output = counts_output
        self.sent_tokens = sent_tokens  # the estimated size of the request that overflowed, once known


class ProviderError(ProxyError):
    """The provider failed or answered with an error; ``status`` is the mapped HTTP status."""

    status = 502
    type = "api_error"


class EmptyStream(ProviderError):
    """The provider accepted a streamed request (HTTP 200) and ended the stream without any content, usage
    or error. Some local servers (llama-cpp-python) answer a streamed prompt over their window this way;
    the runtime judges whether this request could have been one (``proxy/runtime/empty_stream.py``)."""

    code = "empty_stream"


class AssemblyFailed(ProxyError):
    """The context could not be assembled within the limits (the provider was not called)."""

    status = 400
    type = "invalid_request_error"
    code = "context_assembly_failed"
