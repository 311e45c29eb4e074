"""``context-proxy sessions list | delete``: find a session's id, and delete everything the proxy keeps of it.

The store is the one ``serve`` would open (``CONTEXT_PROXY_STORE_URL``, else the SQLite file in the data
folder). A delete also removes the session's trace folder and, when ``CONTEXT_PROXY_RECORD_DIR`` is
set, its recording folder: both are named by the context id.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from proxy.kernel.config import ConfigError, Settings
from proxy.kernel.tenancy import trace_folder
from proxy.session import SQLITE_FILE_NAME, DataFolderInUse, SessionStore, open_store
from proxy.session.store import SessionSummary, StoreError

T = TypeVar("T")

UNKNOWN = 1  # exit code: nothing of the session was found
FAILED = 2  # exit code: the configuration or the store failed


def list_sessions(settings: Settings) -> int:
    """Print each stored session: context id, scope, message count (every branch), last update."""
    found: list[SessionSummary] = with_store(settings, lambda store: store.sessions()) or []
    for summary in found:
        count = f"{summary.messages} message" + ("" if summary.messages == 1 else "s")
        print(f"{summary.context_id}\t{summary.scope}\t{count}\t{summary.updated_at}")
    if not found:
        print(f"no sessions in {_describe(settings)}", file=sys.stderr)
    return 0


def delete_session(settings: Settings, context_id: str) -> int:
    """Delete the session from the store, then its trace and recording folders; print what went."""
    if context_id in ("", ".", "..") or Path(context_id).name != context_id:
        # The id names folders below; one that is not a single folder name could reach outside them.
        raise ConfigError(f"CONTEXT_ID {context_id!r} is not a context id (a single folder name)")
    deleted = with_store(settings, lambda store: store.delete_session(context_id))
    removed = 0
    if deleted:
        print(f"deleted session {context_id} from {_describe(settings)}")
        removed += 1
    # A team's traces are in the team's folder; recordings are named by the context id alone.
    folders = [("trace", settings.resolved_trace_dir / trace_folder(context_id).parent)]
    if settings.record_dir is not None:
        folders.append(("recording", settings.record_dir))
    for kind, root in folders:
        folder = root / context_id
        if not folder.is_dir():
            continue
        try:
            shutil.rmtree(folder)
        except OSError as exc:
            print(f"context-proxy sessions delete: {kind} folder {folder} not removed: {exc}", file=sys.stderr)
            return FAILED
        print(f"removed {kind} folder {folder}")
        removed += 1
    if removed == 0:
        looked = " or ".join(f"{kind} folder {root / context_id}" for kind, root in folders)
        print(
            f"context-proxy sessions delete: session {context_id!r} is unknown: not in {_describe(settings)}, "
            f"and there is no {looked}",
            file=sys.stderr,
        )
        return UNKNOWN
    return 0


def with_store(settings: Settings, work: Callable[[SessionStore], Awaitable[T]], *, create: bool = False) -> T | None:
    """``work`` on the opened store, closed after; ``None`` when there is no SQLite store to open (unless
    ``create``: then it is made, as ``serve`` would)."""
    if not create and not settings.store_url and not (settings.data_dir / SQLITE_FILE_NAME).exists():
        return None  # opening would create an empty store where the operator likely expected one
    try:
        store = open_store(settings.store_url, settings.data_dir, settings.session_lock_seconds)
    except ValueError as exc:
        raise ConfigError(f"CONTEXT_PROXY_STORE_URL={exc}") from None

    async def run() -> T:
        try:
            await store.open()
        except DataFolderInUse as exc:
            raise StoreError(
                f"the SQLite session store {exc.database} is in use by {exc.holder}: a running proxy must be "
                "stopped first, since one process at a time may use a SQLite store (its turns are serialized "
                "in that process's memory). To delete sessions while the proxy serves, run it on the "
                "PostgreSQL store (CONTEXT_PROXY_STORE_URL=postgresql://..., see docs/deployment.md)."
            ) from None
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(run())


def _describe(settings: Settings) -> str:
    """The store, as the messages name it (never the URL: it may carry a password)."""
    if settings.store_url:
        return "the PostgreSQL store (CONTEXT_PROXY_STORE_URL)"
    path = settings.data_dir / SQLITE_FILE_NAME
    return f"the SQLite store {path}" if path.exists() else f"the SQLite store {path} (there is none yet)"
