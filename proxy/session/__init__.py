"""The session store: the protocol, the SQLite default and the PostgreSQL scale-out backend."""

from __future__ import annotations

from pathlib import Path

from proxy.session.postgres import PostgresSessionStore
from proxy.session.sqlite import SqliteSessionStore
from proxy.session.sqlite_files import DataFolderInUse, private_folder
from proxy.session.store import SessionStore

SQLITE_FILE_NAME = "sessions.sqlite3"


def open_store(store_url: str | None, data_dir: Path, lock_timeout_seconds: float) -> SessionStore:
    """The configured store, not yet opened (the caller awaits ``open()``).

    A ``postgresql://`` or ``postgres://`` URL selects PostgreSQL (its ``schema``, ``pool_size`` and
    ``lock_connections`` query parameters configure the store, see ``proxy.session.postgres``); nothing
    selects the SQLite file ``<data_dir>/sessions.sqlite3``, creating ``data_dir`` private to the user
    (``open()`` tightens it, and refuses when another process has the file: ``DataFolderInUse``).
    """
    if store_url:
        return PostgresSessionStore.from_url(store_url, lock_timeout_seconds=lock_timeout_seconds)
    private_folder(data_dir)
    return SqliteSessionStore(data_dir / SQLITE_FILE_NAME, lock_timeout_seconds=lock_timeout_seconds)


__all__ = ["DataFolderInUse", "PostgresSessionStore", "SessionStore", "SqliteSessionStore", "open_store"]
