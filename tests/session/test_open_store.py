"""``open_store`` picks the backend from the store URL."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from proxy.session import open_store
from proxy.session.postgres import PostgresSessionStore
from proxy.session.sqlite import SqliteSessionStore


async def test_no_url_means_sqlite_in_a_private_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "data" / "nested"

    store = open_store(None, data_dir, lock_timeout_seconds=7.0)

    assert isinstance(store, SqliteSessionStore)
    assert store.path == data_dir / "sessions.sqlite3"
    assert store.lock_timeout_seconds == 7.0
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    await store.open()
    try:
        await store.reconcile("s", "main", [{"role": "user", "content": "hi"}])
    finally:
        await store.close()
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 1


@pytest.mark.parametrize("url", ["postgresql://u@db:5432/proxy", "postgres://u@db/proxy"])
def test_a_postgres_url_means_postgres(tmp_path: Path, url: str) -> None:
    store = open_store(url, tmp_path / "unused", lock_timeout_seconds=3.0)

    assert isinstance(store, PostgresSessionStore)
    assert (store.dsn, store.lock_timeout_seconds) == (url, 3.0)
    assert not (tmp_path / "unused").exists()


def test_an_unknown_url_is_refused_rather_than_falling_back_to_a_local_file(tmp_path: Path) -> None:
    # A typo must not leave each replica quietly writing its own SQLite file.
    with pytest.raises(ValueError, match="postgresq://"):
        open_store("postgresq://u@db/proxy", tmp_path, lock_timeout_seconds=3.0)


def test_a_schema_name_that_would_need_quoting_is_refused() -> None:
    with pytest.raises(ValueError, match="schema name"):
        PostgresSessionStore("postgresql://u@db/proxy", schema='x"; DROP TABLE sessions; --')
