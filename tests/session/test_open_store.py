"""``open_store`` picks the backend from the store URL, and the URL's options configure PostgreSQL."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from proxy.kernel.config import Settings
from proxy.session import open_store
from proxy.session.postgres import PostgresSessionStore
from proxy.session.sqlite import SqliteSessionStore
from tests.session.store_rows import session_info


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


def test_store_url_options_configure_the_postgres_store_and_are_not_sent_to_the_server(tmp_path: Path) -> None:
    url = "postgresql://u:p%40ss@db:5432/proxy?sslmode=disable&schema=team_a&pool_size=3&lock_connections=7"

    store = open_store(url, tmp_path, lock_timeout_seconds=3.0)

    assert isinstance(store, PostgresSessionStore)
    assert (store.schema, store.pool_size, store._turn_locks.connections) == ("team_a", 3, 7)
    # asyncpg would send unknown query parameters to the server as settings, which it rejects.
    assert store.dsn == "postgresql://u:p%40ss@db:5432/proxy?sslmode=disable"


def test_without_options_the_store_uses_its_defaults() -> None:
    store = PostgresSessionStore.from_url("postgresql://u@db/proxy", lock_timeout_seconds=3.0)

    assert (store.schema, store.pool_size, store._turn_locks.connections) == ("context_proxy", 10, 32)


def test_the_settings_store_url_selects_the_schema(tmp_path: Path) -> None:
    settings = Settings.from_env({"CONTEXT_PROXY_STORE_URL": "postgresql://u@db/proxy?schema=replica_test"})

    store = open_store(settings.store_url, settings.data_dir, settings.session_lock_seconds)

    assert isinstance(store, PostgresSessionStore)
    assert store.schema == "replica_test"
    assert store.lock_timeout_seconds == settings.session_lock_seconds


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("schema=Team-A", "schema name"),
        ("pool_size=0", "pool_size='0' is not a positive integer"),
        ("lock_connections=many", "lock_connections='many' is not a positive integer"),
        ("schema=a&schema=b", "'schema' is given twice"),
    ],
)
def test_bad_store_url_options_are_refused_naming_the_parameter(tmp_path: Path, query: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_store(f"postgresql://u@db/proxy?{query}", tmp_path, lock_timeout_seconds=3.0)


@pytest.mark.postgres
async def test_two_stores_opened_from_urls_naming_one_schema_share_it(pg_backend: Any, tmp_path: Path) -> None:
    first = await pg_backend.open()
    await first.reconcile("s", "main", [{"role": "user", "content": "hi"}])
    assert isinstance(first, PostgresSessionStore)

    other = open_store(f"{first.dsn}?schema={first.schema}", tmp_path, lock_timeout_seconds=3.0)
    elsewhere = open_store(f"{first.dsn}?schema={first.schema}_other", tmp_path, lock_timeout_seconds=3.0)
    pg_backend.opened += [other, elsewhere]  # closed by the fixture; the fixture drops only its own schema
    await other.open()
    await elsewhere.open()
    try:
        assert (await session_info(other, "s")) is not None
        assert (await session_info(elsewhere, "s")) is None
    finally:
        conn = await asyncpg.connect(first.dsn)
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {first.schema}_other CASCADE")
        finally:
            await conn.close()
