"""The SQLite store's files are private, looser modes are tightened, and one store holds the file at a time."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from proxy.session import DataFolderInUse, SqliteSessionStore, open_store
from tests.session.store_rows import session_info


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_new_store_is_private_database_wal_shm_and_lock(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    store = open_store(None, data_dir, lock_timeout_seconds=2.0)
    await store.open()
    try:
        await store.reconcile("s", "main", [{"role": "user", "content": "a private transcript"}])
        files = {p.name: mode(p) for p in data_dir.iterdir()}
    finally:
        await store.close()

    assert mode(data_dir) == 0o700
    # -wal and -shm exist while the store is open; SQLite gives them the database file's mode.
    assert files == {
        "sessions.sqlite3": 0o600,
        "sessions.sqlite3-wal": 0o600,
        "sessions.sqlite3-shm": 0o600,
        "sessions.sqlite3.lock": 0o600,
    }


async def test_looser_modes_found_at_start_are_tightened_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    database = data_dir / "sessions.sqlite3"
    # A store left by an older version: a world-readable folder and files, its WAL still on disk
    # (another connection keeps it open, as after a crash).
    other = sqlite3.connect(database)
    other.execute("PRAGMA journal_mode = WAL")
    other.execute("CREATE TABLE leftover (x)")
    other.execute("INSERT INTO leftover VALUES (1)")
    other.commit()
    leftovers = [database, data_dir / "sessions.sqlite3-wal", data_dir / "sessions.sqlite3-shm"]
    for path in leftovers:
        os.chmod(path, 0o644)
    os.chmod(data_dir, 0o755)

    with caplog.at_level(logging.WARNING, logger="context_proxy.store"):
        store = SqliteSessionStore(database)
        await store.open()
        await store.close()
    other.close()

    assert mode(data_dir) == 0o700
    assert [mode(path) for path in leftovers if path.exists()] == [0o600] * sum(p.exists() for p in leftovers)
    tightened = [r.getMessage() for r in caplog.records if "tightened" in r.getMessage()]
    assert any(str(data_dir) in line and "0o755" in line for line in tightened), tightened
    assert any(line.startswith(f"tightened {database} from 0o644") for line in tightened), tightened
    assert any("sessions.sqlite3-wal from 0o644" in line for line in tightened), tightened


async def test_a_second_store_on_an_open_file_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    first = SqliteSessionStore(tmp_path / "sessions.sqlite3")
    await first.open()
    await first.reconcile("s", "main", [{"role": "user", "content": "hi"}])
    second = SqliteSessionStore(tmp_path / "sessions.sqlite3")

    with pytest.raises(DataFolderInUse) as refused:
        await second.open()
    with pytest.raises(DataFolderInUse):
        second.check_free()

    assert "CONTEXT_PROXY_STORE_URL" in str(refused.value) and "one process" in str(refused.value)
    await first.close()
    second.check_free()
    await second.open()
    try:
        assert await session_info(second, "s") is not None
    finally:
        await second.close()


async def test_a_store_that_fails_to_open_releases_the_file(tmp_path: Path) -> None:
    database = tmp_path / "sessions.sqlite3"
    database.write_bytes(b"this is not a SQLite database, it is long enough to have a header......")
    broken = SqliteSessionStore(database)

    with pytest.raises(Exception, match="not a database"):
        await broken.open()

    broken.check_free()  # nothing holds the lock after the failed open
