"""``proxy.session.sqlite_wal``: the SQLite store's commits never run a WAL checkpoint; a thread of
its own copies the WAL into the database while the writer goes on."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from proxy.session.sqlite import SqliteSessionStore
from proxy.session.sqlite_wal import Checkpointer, writer_pragmas

PAGE = 4096
ROWS = 1_600  # about 6.5 MB: well past SQLite's automatic checkpoint at 1,000 pages


def _writer(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    writer_pragmas(conn)
    conn.execute("CREATE TABLE IF NOT EXISTS blobs (body BLOB)")
    return conn


def _write(conn: sqlite3.Connection, rows: int = ROWS) -> None:
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO blobs VALUES (?)", [(bytes([n % 251]) * PAGE,) for n in range(rows)])
    conn.execute("COMMIT")


def _until(condition, seconds: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    give_up = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.02)
    return True


@contextmanager
def _checkpointing(path: Path, **timing: float) -> Iterator[tuple[sqlite3.Connection, Checkpointer]]:
    """A writer and a running checkpointer of one database, both stopped on the way out."""
    conn = _writer(path)
    checkpointer = Checkpointer(path, **timing)
    checkpointer.start()
    try:
        yield conn, checkpointer
    finally:
        checkpointer.stop()
        conn.close()


def test_the_writer_commits_past_a_thousand_pages_without_checkpointing(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    conn = _writer(path)
    for _ in range(3):
        _write(conn)
    # Everything is still in the WAL: no commit copied it into the database file.
    assert path.stat().st_size < 100 * PAGE
    assert (tmp_path / "store.db-wal").stat().st_size > 3 * ROWS * PAGE
    conn.close()


def test_the_checkpointer_copies_the_wal_while_the_writer_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with _checkpointing(path, quiet=0.05) as (conn, checkpointer):
        _write(conn)
        assert _until(lambda: checkpointer.checkpoints >= 1 and path.stat().st_size > ROWS * PAGE)  # copied
        runs = checkpointer.checkpoints
        time.sleep(0.3)
        assert checkpointer.checkpoints == runs  # nothing written since: no checkpoint
        _write(conn)  # the writer is not held up, and the next write is copied too
        assert _until(lambda: path.stat().st_size > 2 * ROWS * PAGE)
    assert sqlite3.connect(path).execute("SELECT count(*) FROM blobs").fetchone() == (2 * ROWS,)


def test_the_checkpointer_waits_while_turns_write_and_copies_in_the_pause(tmp_path: Path) -> None:
    with _checkpointing(tmp_path / "store.db", quiet=0.3, at_most=30.0) as (conn, checkpointer):
        busy_until = time.monotonic() + 1.2
        while time.monotonic() < busy_until:  # a commit every 20 ms: never a quiet poll
            _write(conn, rows=2)
            time.sleep(0.02)
        assert checkpointer.checkpoints == 0, "a checkpoint ran while the writer was busy"
        assert _until(lambda: checkpointer.checkpoints == 1), "no checkpoint once the writes paused"


def test_writes_that_never_pause_are_checkpointed_after_the_longest_wait(tmp_path: Path) -> None:
    with _checkpointing(tmp_path / "store.db", quiet=0.1, at_most=0.4) as (conn, checkpointer):
        started = time.monotonic()
        while checkpointer.checkpoints == 0 and time.monotonic() - started < 5:
            _write(conn, rows=2)
            time.sleep(0.02)
        assert checkpointer.checkpoints >= 1
        assert time.monotonic() - started >= 0.4, "the checkpoint did not wait for the longest wait"


async def test_the_store_checkpoints_on_its_own_thread_and_reopens_whole(tmp_path: Path) -> None:
    store = SqliteSessionStore(tmp_path / "data" / "sessions.db")
    await store.open()
    big = [{"role": "user", "content": "x" * 200_000 + str(n)} for n in range(30)]  # about 6 MB
    await store.reconcile("ctx", "main", big)
    path = store.path
    assert _until(lambda: path.stat().st_size > 5_000_000)  # the store's checkpointer copied it
    await store.close()
    again = SqliteSessionStore(path)
    await again.open()
    try:
        head = (await again.reconcile("ctx", "main", big)).head_hash
        assert len(await again.transcript("ctx", head)) == 30
    finally:
        await again.close()


def test_what_the_last_run_left_in_the_wal_is_copied_once_the_checkpointer_starts(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    conn = _writer(path)
    _write(conn)  # left in the WAL, as by a store that stopped before its checkpointer copied it
    assert path.stat().st_size < 100 * PAGE
    checkpointer = Checkpointer(path, quiet=0.05)
    checkpointer.start()
    try:
        assert _until(lambda: path.stat().st_size > ROWS * PAGE), "the WAL found at start was not copied"
    finally:
        checkpointer.stop()
        conn.close()
