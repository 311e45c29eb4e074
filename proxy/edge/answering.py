"""Every answer in its API's shape: the proxy's errors, Starlette's own (404, 405) and the unexpected ones.

Errors are JSON in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``) unless a route
renders them in its API's own (the Messages routes: Anthropic's), an unexpected error included: a 500
that leaves the keep-alive connection usable.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from proxy.kernel.errors import ProxyError
from proxy.kernel.jsonio import JSONAnswer

log = logging.getLogger("context_proxy")

Endpoint = Callable[[Request], Awaitable[Response]]
Render = Callable[[ProxyError], Response]


def openai_error(exc: ProxyError) -> Response:
    """The OpenAI-shaped answer for ``exc``: the default shape of every route."""
    return JSONAnswer(exc.body(), status_code=exc.status, headers=exc.headers)


def answering(endpoint: Endpoint, render: Render = openai_error) -> Endpoint:
    """``endpoint`` answering its errors itself: a ``ProxyError`` in the route's API shape (``render``),
    an unexpected error with a JSON 500.

    Starlette hands an ``Exception`` handler's error to ``ServerErrorMiddleware``, which sends the
    answer and then re-raises; uvicorn, seeing the error after a complete response, drops the
    connection without ``connection: close``, and the client's next request on it fails. An error
    answered here is an ordinary response: the connection stays usable.
    """

    async def answered(request: Request) -> Response:
        try:
            return await endpoint(request)
        except ProxyError as exc:
            return render(exc)
        except HTTPException:
            raise  # rendered by its handler, which returns normally
        except Exception:
            return internal_error(request)

    return answered


async def proxy_error(request: Request, exc: Exception) -> Response:
    """The app's handler for a ``ProxyError`` raised outside an endpoint (``answering`` renders the others)."""
    assert isinstance(exc, ProxyError)
    return openai_error(exc)


_HTTP_ERROR_TYPES = {404: ("not_found_error", "not_found"), 405: ("invalid_request_error", "method_not_allowed")}


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (no such path, a method the path does not take) in OpenAI's shape."""
    assert isinstance(exc, HTTPException)
    kind, code = _HTTP_ERROR_TYPES.get(exc.status_code, ("invalid_request_error", None))
    error = ProxyError(
        f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code, type=kind, code=code
    )
    return JSONAnswer(error.body(), status_code=exc.status_code, headers=dict(exc.headers or {}))


async def unexpected_error(request: Request, exc: Exception) -> Response:
    """An error outside an endpoint: the server closes the connection after this answer, so say so rather
    than leave the client to find out."""
    response = internal_error(request)
    response.headers["connection"] = "close"
    return response


def internal_error(request: Request) -> JSONAnswer:
    """The 500 answer for an unexpected error, logged with its traceback."""
    log.exception("unexpected error serving %s %s", request.method, request.url.path)
    return JSONAnswer(internal_error_body(), status_code=500)


def internal_error_body() -> dict[str, Any]:
    """The body of the 500 answer (also the ``error`` event of a stream that failed unexpectedly)."""
    error = ProxyError("The proxy failed unexpectedly; the error is in its log.", status=500, code="internal_error")
    return error.body()


HANDLERS = {ProxyError: proxy_error, HTTPException: http_error, Exception: unexpected_error}
