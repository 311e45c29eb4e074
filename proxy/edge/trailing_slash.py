"""A route path with a trailing slash is the same route: ``/v1/chat/completions/`` is served as
``/v1/chat/completions``.

Starlette answers such a path with an empty 307 redirect, which an SDK does not follow for a POST (the
body would have to be sent again): the client saw an empty answer it could not read (issue 39). No route
of the proxy ends with a slash, so the slash is dropped before routing instead.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class TrailingSlashMiddleware:
    """Serves ``/path/`` (any number of trailing slashes) as ``/path``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, its path without trailing slashes (the root stays ``/``)."""
        if scope["type"] == "http":
            path: str = scope["path"]
            if len(path) > 1 and path.endswith("/"):
                scope = dict(scope)
                scope["path"] = path.rstrip("/") or "/"
                raw: bytes | None = scope.get("raw_path")
                if raw is not None:
                    scope["raw_path"] = raw.rstrip(b"/") or b"/"
        await self.app(scope, receive, send)
