"""Store fixtures: every store test runs on SQLite (a temp file) and on PostgreSQL (a fresh schema).

PostgreSQL comes from ``CONTEXT_PROXY_TEST_PG`` (default ``postgresql://postgres@127.0.0.1:5432/test``).
When it cannot be reached the PostgreSQL half skips and says why, except under ``CI=true``, where an
unreachable database fails the run: CI must never pass by silently testing one backend.
"""

from __future__ import annotations

import getpass
import os
import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from proxy.session.postgres import PostgresSessionStore
from proxy.session.sqlite import SqliteSessionStore
from proxy.session.store import SessionStore

DEFAULT_PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass
class Backend:
    """One storage location (a file, a schema) and a way to open any number of stores on it."""

    name: str
    make: Callable[..., SessionStore]  # a new, unopened store on the same location
    versions: Callable[[], Awaitable[list[int]]]  # the migration versions recorded there
    opened: list[SessionStore] = field(default_factory=list)

    async def open(self, **kwargs: Any) -> SessionStore:
        """A new opened store on this location (a restart, or another replica)."""
        store = self.make(**kwargs)
        self.opened.append(store)
        await store.open()
        return store


def pg_candidates() -> list[str]:
    """DSNs to try: the one configured, else the default as ``postgres`` and as the current user."""
    configured = os.environ.get("CONTEXT_PROXY_TEST_PG")
    if configured:
        return [configured]
    return [DEFAULT_PG_DSN, DEFAULT_PG_DSN.replace("postgres@", f"{getpass.getuser()}@", 1)]


async def reachable_postgres() -> str:
    """The first DSN that connects; skip (or, under CI=true, fail) when none does."""
    failures = []
    for dsn in dict.fromkeys(pg_candidates()):
        try:
            conn = await asyncpg.connect(dsn, timeout=5)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            failures.append(f"{dsn}: {type(exc).__name__}: {exc}")
            continue
        await conn.close()
        return dsn
    message = "PostgreSQL is not reachable (" + "; ".join(failures) + ")"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message}; CI=true requires the PostgreSQL store tests to run")
    pytest.skip(f"{message}; set CONTEXT_PROXY_TEST_PG to run the PostgreSQL store tests")


def _sqlite_backend(path: Path) -> Backend:
    def make(**kwargs: Any) -> SessionStore:
        return SqliteSessionStore(path, **kwargs)

    async def versions() -> list[int]:
        with sqlite3.connect(path) as conn:
            return [row[0] for row in conn.execute("SELECT version FROM schema_version ORDER BY version")]

    return Backend("sqlite", make, versions)


def _postgres_backend(dsn: str, schema: str) -> Backend:
    def make(**kwargs: Any) -> SessionStore:
        return PostgresSessionStore(dsn, schema=schema, **kwargs)

    async def versions() -> list[int]:
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch(f"SELECT version FROM {schema}.schema_version ORDER BY version")
        finally:
            await conn.close()
        return [row["version"] for row in rows]

    return Backend("postgres", make, versions)


@asynccontextmanager
async def _location(kind: str, tmp_path: Path) -> AsyncIterator[Backend]:
    if kind == "sqlite":
        chosen = _sqlite_backend(tmp_path / "sessions.sqlite3")
        schema = dsn = None
    else:
        dsn = await reachable_postgres()
        schema = f"test_store_{uuid.uuid4().hex[:16]}"
        chosen = _postgres_backend(dsn, schema)
    try:
        yield chosen
    finally:
        for store in chosen.opened:
            await store.close()
        if schema is not None and dsn is not None:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            finally:
                await conn.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """A fresh storage location of each backend; stores opened on it are closed, the schema dropped."""
    async with _location(request.param, tmp_path) as chosen:
        yield chosen


@pytest.fixture
async def pg_backend(tmp_path: Path) -> AsyncIterator[Backend]:
    """A fresh PostgreSQL schema, for what only the shared-database backend promises."""
    async with _location("postgres", tmp_path) as chosen:
        yield chosen


@pytest.fixture
async def store(backend: Backend) -> SessionStore:
    """An opened store with a short lock wait (tests that need another wait open their own)."""
    return await backend.open(lock_timeout_seconds=2.0)
