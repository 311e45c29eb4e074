"""``context-proxy sessions list | delete`` (proxy/admin/sessions.py) on a real SQLite file and a PostgreSQL schema."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from proxy.cli import main
from proxy.session.postgres import PostgresSessionStore
from proxy.session.sqlite import SqliteSessionStore
from proxy.session.store import SessionStore
from tests.session.conftest import reachable_postgres

STORE_VARIABLES = ("CONTEXT_PROXY_STORE_URL", "SCIENCE_AGENT_CONTEXT_TRACE_DIR", "CONTEXT_PROXY_RECORD_DIR")


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The SQLite data folder ``serve`` would use, with recordings on (traces go to its default folder)."""
    for name in STORE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SCIENCE_AGENT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CONTEXT_PROXY_RECORD_DIR", str(tmp_path / "record"))
    return tmp_path / "data"


async def _seed(store: SessionStore, sessions: dict[str, int]) -> None:
    await store.open()
    try:
        for context_id, count in sessions.items():
            messages = [{"role": "user", "content": f"{context_id} {i}"} for i in range(count)]
            start = await store.begin_turn(context_id, "main", messages)
            await store.put_checkpoint(context_id, start.reconciliation.head_hash, {"summary": context_id})
    finally:
        await store.close()


async def _ids(store: SessionStore) -> list[str]:
    await store.open()
    try:
        return sorted(summary.context_id for summary in await store.sessions())
    finally:
        await store.close()


def _folders(root: Path, context_id: str) -> list[Path]:
    """The session's trace and recording folders, made with a file each."""
    made = [root / "data" / "context-traces" / context_id, root / "record" / context_id]
    for folder in made:
        folder.mkdir(parents=True)
        (folder / "turn-0001.json").write_text("{}")
    return made


def test_delete_removes_the_session_its_traces_and_recordings_and_nothing_else(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = data_dir / "sessions.sqlite3"
    data_dir.mkdir()
    asyncio.run(_seed(SqliteSessionStore(database), {"codex-1": 3, "codex-2": 2}))
    gone, kept = _folders(tmp_path, "codex-1"), _folders(tmp_path, "codex-2")

    assert main(["sessions", "delete", "codex-1"]) == 0

    assert capsys.readouterr().out.splitlines() == [
        f"deleted session codex-1 from the SQLite store {database}",
        f"removed trace folder {gone[0]}",
        f"removed recording folder {gone[1]}",
    ]
    assert asyncio.run(_ids(SqliteSessionStore(database))) == ["codex-2"]
    assert not any(folder.exists() for folder in gone)
    assert all((folder / "turn-0001.json").exists() for folder in kept)


def test_an_unknown_session_exits_1_and_a_leftover_folder_alone_is_removed(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir.mkdir()
    asyncio.run(_seed(SqliteSessionStore(data_dir / "sessions.sqlite3"), {"codex-1": 1}))
    assert main(["sessions", "delete", "codex-1"]) == 0
    capsys.readouterr()

    assert main(["sessions", "delete", "codex-1"]) == 1
    assert "session 'codex-1' is unknown" in capsys.readouterr().err
    assert main(["sessions", "delete", "never-seen"]) == 1

    traces, _ = _folders(tmp_path, "traced-only")
    assert main(["sessions", "delete", "traced-only"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"removed trace folder {traces}"


def test_a_sqlite_store_in_use_is_refused_and_nothing_is_removed(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = data_dir / "sessions.sqlite3"
    data_dir.mkdir()
    asyncio.run(_seed(SqliteSessionStore(database), {"codex-1": 1}))
    folders = _folders(tmp_path, "codex-1")

    async def delete_beside_a_proxy() -> int:
        serving = SqliteSessionStore(database)
        await serving.open()
        try:
            # main() runs its own event loop: off this one's thread, as a second process would.
            return await asyncio.to_thread(main, ["sessions", "delete", "codex-1"])
        finally:
            await serving.close()

    assert asyncio.run(delete_beside_a_proxy()) == 2

    err = capsys.readouterr().err
    assert "is in use by another store" in err and "a running proxy must be stopped first" in err
    assert "CONTEXT_PROXY_STORE_URL=postgresql://" in err
    assert asyncio.run(_ids(SqliteSessionStore(database))) == ["codex-1"]
    assert all(folder.exists() for folder in folders)


def test_an_id_that_is_not_one_folder_name_is_refused(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = data_dir / "precious"
    outside.mkdir(parents=True)
    (data_dir / "context-traces").mkdir()

    assert main(["sessions", "delete", "../precious"]) == 2
    assert "is not a context id" in capsys.readouterr().err
    assert outside.exists()


def test_list_prints_each_session_and_never_creates_a_store(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sessions", "list"]) == 0
    assert "there is none yet" in capsys.readouterr().err
    assert not data_dir.exists()

    data_dir.mkdir()
    asyncio.run(_seed(SqliteSessionStore(data_dir / "sessions.sqlite3"), {"older": 2, "newer": 3}))
    assert main(["sessions", "list"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [row[:3] for row in rows] == [["newer", "main", "3 messages"], ["older", "main", "2 messages"]]


# --- PostgreSQL: replicas serve while an operator deletes -------------------------------------------


@pytest.fixture
def pg_url(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``CONTEXT_PROXY_STORE_URL`` naming a fresh schema, dropped after."""
    dsn = asyncio.run(reachable_postgres())
    schema = f"test_cli_{uuid.uuid4().hex[:16]}"
    monkeypatch.setenv("CONTEXT_PROXY_STORE_URL", f"{dsn}?schema={schema}")
    yield f"{dsn}?schema={schema}"

    async def drop() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        finally:
            await conn.close()

    asyncio.run(drop())


@pytest.mark.postgres
def test_on_postgresql_a_session_is_deleted_unless_a_replica_runs_its_turn(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_seed(PostgresSessionStore.from_url(pg_url, 5.0), {"codex-1": 2, "codex-2": 1}))
    monkeypatch.setenv("CONTEXT_PROXY_SESSION_LOCK_SECONDS", "1")
    turn_started, turn_may_end = threading.Event(), threading.Event()

    def replica_turn() -> None:
        async def turn() -> None:
            replica = PostgresSessionStore.from_url(pg_url, 5.0)
            await replica.open()
            try:
                async with replica.turn_lock("codex-1", "some-branch"):
                    turn_started.set()
                    await asyncio.to_thread(turn_may_end.wait, 10)
            finally:
                await replica.close()

        asyncio.run(turn())

    replica = threading.Thread(target=replica_turn)
    replica.start()
    try:
        assert turn_started.wait(10)
        busy = main(["sessions", "delete", "codex-1"])
    finally:
        turn_may_end.set()
        replica.join()
    assert busy == 2
    assert "busy with a running turn" in capsys.readouterr().err

    assert main(["sessions", "delete", "codex-1"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "deleted session codex-1 from the PostgreSQL store (CONTEXT_PROXY_STORE_URL)"
    ]
    assert main(["sessions", "list"]) == 0
    assert [line.split("\t")[:3] for line in capsys.readouterr().out.splitlines()] == [["codex-2", "main", "1 message"]]
