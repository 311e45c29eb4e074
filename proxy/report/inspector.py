"""The live inspector: ``GET /ui`` serves the report's views from the running proxy's trace folder.

A browser cannot send a bearer header when it navigates, so with a master key set the inspector asks
for a key once (``POST /ui/login``) and keeps a signed, expiring session cookie (HttpOnly,
SameSite=Strict, path ``/ui``); a bearer header or ``x-api-key`` is accepted too, for scripts.
Without a master key it serves directly (``serve`` binds only loopback then, unless told otherwise).
The master key sees every team's sessions; a team's virtual key sees its own team's only (its folder
``teams/<team>/``). A team's cookie names the key by its hash and is checked against the store like the
key itself, so a revoked key's cookie stops working as soon as the key does.

Only files under the trace folder are ever read: a session is a folder name matching the context-id
pattern, a turn a file name matching the trace pattern, and the resolved path must lie inside the
folder. Summaries are cached by (mtime, size), so reloading the overview re-reads only new traces.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable
from html import escape
from pathlib import Path
from typing import Protocol
from urllib.parse import parse_qs, quote

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from proxy.kernel.errors import AuthenticationFailed
from proxy.kernel.tenancy import ADMIN, TEAMS_FOLDER, Principal, trace_folder
from proxy.report.build import read_folder
from proxy.report.chart import legend
from proxy.report.page import CSP, document, overview, session_section, summary_data
from proxy.report.traces import CONTEXT_ID, TRACE_NAME, TraceFolder, TurnSummary, group_sessions, session_files

__all__ = ["COOKIE", "Inspector"]

Endpoint = Callable[[Request], Awaitable[Response]]

COOKIE = "context_proxy_ui"
SESSION_SECONDS = 12 * 3600
LIVE_TEXT_CAP = 1_000_000  # one session's page: inputs are shown whole up to a megabyte per text
_MAX_LOGIN_BYTES = 4096
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": CSP,
}


class Keys(Protocol):
    """Whose key a request carries (``proxy/ingress/tenants.py``): raises ``AuthenticationFailed`` for none."""

    async def resolve(self, given: str) -> Principal:
        """The principal of a presented key."""

    async def by_hash(self, key_hash: str) -> Principal:
        """The principal of a live virtual key, named by its hash."""


class Inspector:
    """The ``/ui`` routes over one trace folder, behind the master key (or a team's key) when one is set."""

    def __init__(self, root: Path, master_key: str | None, tracing: bool, keys: Keys | None = None) -> None:
        self.root = root
        self.master_key = master_key
        self.tracing = tracing
        self._keys = keys
        self._summaries: dict[Path, tuple[tuple[int, int], TurnSummary]] = {}

    def routes(self, wrap: Callable[[Endpoint], Endpoint] = lambda endpoint: endpoint) -> list[Route]:
        """The inspector's routes, each endpoint passed through ``wrap`` (the app's error handling)."""
        return [
            Route("/ui", wrap(self.index), methods=["GET"]),
            Route("/ui/login", wrap(self.login), methods=["POST"]),
            Route("/ui/session/{context_id}", wrap(self.session), methods=["GET"]),
            Route("/ui/session/{context_id}/{name}", wrap(self.raw), methods=["GET"]),
        ]

    # -- authentication -------------------------------------------------------------------------------

    def _token(self, expires: int, key_hash: str = "") -> str:
        """The cookie: when it expires, whose it is (a virtual key's hash; empty for the master key), a MAC."""
        assert self.master_key is not None
        mac = hmac.new(self.master_key.encode(), f"context-proxy-ui:{expires}:{key_hash}".encode(), hashlib.sha256)
        return f"{expires}.{key_hash}.{mac.hexdigest()}"

    async def _principal(self, request: Request) -> Principal | None:
        """Who is looking (``None``: nobody it may serve)."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key", "").strip()
        if given or self.master_key is None:
            return await self._resolve(given)
        cookie = request.cookies.get(COOKIE, "")
        expires, _, rest = cookie.partition(".")
        key_hash, _, _ = rest.partition(".")
        if not expires.isdigit() or int(expires) < time.time():
            return None
        if not hmac.compare_digest(cookie.encode(), self._token(int(expires), key_hash).encode()):
            return None
        if not key_hash:
            return ADMIN
        if self._keys is None:
            return None
        try:
            return await self._keys.by_hash(key_hash)
        except AuthenticationFailed:
            return None

    async def _resolve(self, given: str) -> Principal | None:
        if self._keys is None:
            if self.master_key is None:
                return ADMIN
            return ADMIN if hmac.compare_digest(given.encode(), self.master_key.encode()) else None
        try:
            return await self._keys.resolve(given)
        except AuthenticationFailed:
            return None

    def _login_page(self, status: int, message: str = "") -> Response:
        body = (
            '<form class="login" method="post" action="/ui/login"><h1>Context proxy inspector</h1>'
            "<p>Enter the proxy's master key (CONTEXT_PROXY_MASTER_KEY) or your team's key.</p>"
            + (f'<p class="bad">{escape(message)}</p>' if message else "")
            + '<input type="password" name="key" autocomplete="current-password" autofocus required>'
            '<input type="submit" value="Open the inspector"></form>'
        )
        return _html(document("Context proxy inspector: sign in", body, {}), status)

    async def login(self, request: Request) -> Response:
        """Check the posted master key; on success set the session cookie and go to the overview."""
        if self.master_key is None:
            return RedirectResponse("/ui", status_code=303)
        raw = bytearray()
        async for piece in request.stream():
            raw.extend(piece)
            if len(raw) > _MAX_LOGIN_BYTES:
                return self._login_page(413, "That form was too large.")
        fields = parse_qs(raw.decode("utf-8", errors="replace"), max_num_fields=4)
        given = (fields.get("key") or [""])[0].strip()
        principal = await self._resolve(given) if given else None
        if principal is None:
            return self._login_page(401, "That is neither the master key nor a live team key.")
        key_hash = "" if principal.admin else hashlib.sha256(given.encode()).hexdigest()
        response = RedirectResponse("/ui", status_code=303)
        response.set_cookie(
            COOKIE,
            self._token(int(time.time()) + SESSION_SECONDS, key_hash),
            max_age=SESSION_SECONDS,
            path="/ui",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    # -- views ----------------------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        """The overview: every session the key may see, most recently active first."""
        principal = await self._principal(request)
        if principal is None:
            return self._login_page(401)
        folder = await anyio.to_thread.run_sync(lambda: self._scan(principal))
        sessions = group_sessions(folder.turns)
        off = "" if self.tracing else " · tracing is off (SCIENCE_AGENT_CONTEXT_TRACE=0): no new traces are written"
        body = (
            f'<header><h1>Context proxy inspector</h1><p class="meta">{len(sessions)} sessions · '
            f"{len(folder.turns)} model calls · {escape(str(self.root))}{off}</p></header>"
            "<main><h2>Sessions, most recently active first</h2>"
            + overview(sessions, lambda s: _session_link(s.turns[0].file))
            + "</main>"
        )
        return _html(document("Context proxy inspector", body, summary_data(folder, sessions)))

    async def session(self, request: Request) -> Response:
        """One session folder: the chart, the turn table and every turn's detail."""
        principal = await self._principal(request)
        if principal is None:
            return self._login_page(401)
        context_id = request.path_params["context_id"]
        files = self._files(principal, context_id)
        if not files:
            return _not_found(f"No traces for session {context_id!r}.")
        folder = await anyio.to_thread.run_sync(
            lambda: read_folder(self.root, files, with_details=True, cap=LIVE_TEXT_CAP)
        )
        sessions = group_sessions(folder.turns)
        body = (
            '<header><p><a href="/ui">← all sessions</a></p>'
            f"<h1>{escape(context_id)}</h1></header><main>"
            + legend()
            + "".join(
                session_section(s, folder, f"s{i}", lambda file: _session_link(file) + "/" + quote(file.split("/")[-1]))
                for i, s in enumerate(sessions)
            )
            + "</main>"
        )
        return _html(document(f"Context proxy inspector: {context_id}", body, summary_data(folder, sessions)))

    async def raw(self, request: Request) -> Response:
        """One trace file as it was written."""
        principal = await self._principal(request)
        if principal is None:
            return self._login_page(401)
        context_id, name = request.path_params["context_id"], request.path_params["name"]
        files = self._files(principal, context_id) if TRACE_NAME.match(name) else None
        path = next((f for f in files or [] if f.name == name), None)
        if path is None:
            return _not_found("No such trace.")
        data = await anyio.to_thread.run_sync(path.read_bytes)
        return Response(data, media_type="application/json", headers=_HEADERS)

    def _files(self, principal: Principal, context_id: str) -> list[Path] | None:
        """The trace files of a session the principal may see (another team's: ``None``, as if there were none)."""
        if not CONTEXT_ID.match(context_id) or not principal.owns(context_id):
            return None
        return session_files(self.root / trace_folder(context_id).parent, context_id)

    def _session_folders(self, principal: Principal) -> list[tuple[Path, str]]:
        """(parent folder, context id) of every session folder the principal may see."""
        parents = [self.root] if principal.admin else []
        teams = self.root / TEAMS_FOLDER
        if teams.is_dir():
            parents += [team for team in sorted(teams.iterdir()) if principal.admin or team.name == principal.team]
        return [
            (parent, session.name)
            for parent in parents
            if parent.is_dir()
            for session in sorted(parent.iterdir())
            if principal.owns(session.name) and trace_folder(session.name).parent == parent.relative_to(self.root)
        ]

    def _scan(self, principal: Principal) -> TraceFolder:
        """Summaries of the traces of every session folder the principal may see, reading only files that
        changed since the last scan."""
        folder = TraceFolder(self.root)
        seen = dict(self._summaries)
        if self.root.is_dir():
            for parent, name in self._session_folders(principal):
                for path in session_files(parent, name) or []:
                    try:
                        stat = path.stat()
                    except OSError:
                        continue
                    stamp = (stat.st_mtime_ns, stat.st_size)
                    cached = self._summaries.get(path)
                    if cached is not None and cached[0] == stamp:
                        seen[path] = cached
                        folder.turns.append(cached[1])
                        continue
                    before = len(folder.turns)
                    folder.add(path, with_detail=False, cap=0)
                    if len(folder.turns) > before:
                        seen[path] = (stamp, folder.turns[-1])
        self._summaries = seen
        return folder


def _session_link(file: str) -> str:
    return "/ui/session/" + quote(file.split("/")[-2])


def _html(page: str, status: int = 200) -> Response:
    return HTMLResponse(page, status_code=status, headers=_HEADERS)


def _not_found(message: str) -> Response:
    return _html(
        document("Not found", f'<main><p class="bad">{escape(message)}</p><p><a href="/ui">back</a></p></main>', {}),
        404,
    )
