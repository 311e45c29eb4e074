"""What tests read from a store that the product never asks for: a session's row, one checkpoint.

These were ``SessionStore`` methods only tests called; the protocol now holds what the product uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.session.postgres import PostgresSessionStore
from proxy.session.sqlite import SqliteSessionStore
from proxy.session.store import SessionStore

_SESSION_COLUMNS = "scope, turns, head_hash, created_at, updated_at"


@dataclass(frozen=True)
class SessionInfo:
    """What the store keeps about a session besides its transcript."""

    context_id: str
    scope: str
    turns: int
    head_hash: str
    metadata: dict[str, Any] = field(default_factory=dict)


async def session_info(store: SessionStore, context_id: str) -> SessionInfo | None:
    """The session's row in either backend, or ``None``."""
    if isinstance(store, SqliteSessionStore):
        row = await store._r().run(
            lambda conn: conn.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE context_id = ?", (context_id,)
            ).fetchone()
        )
        if row is None:
            return None
        scope, turns, head, created_at, updated_at = row
        return SessionInfo(context_id, scope, turns, head, {"created_at": created_at, "updated_at": updated_at})
    assert isinstance(store, PostgresSessionStore), type(store)
    found = await store._read(
        lambda conn: conn.fetchrow(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE context_id = $1", context_id)
    )
    if found is None:
        return None
    times = {"created_at": found["created_at"].isoformat(), "updated_at": found["updated_at"].isoformat()}
    return SessionInfo(context_id, found["scope"], found["turns"], found["head_hash"], times)


async def stored_checkpoint(store: SessionStore, context_id: str, covers_hash: str) -> dict[str, Any] | None:
    """The checkpoint covering up to ``covers_hash``, or ``None``."""
    return dict((await store.branch_view(context_id, [], [])).checkpoints).get(covers_hash)


async def tables_with_context_id(store: SessionStore) -> set[str]:
    """The tables of the store's schema that have a ``context_id`` column."""
    if isinstance(store, SqliteSessionStore):
        rows = await store._r().run(
            lambda conn: conn.execute(
                "SELECT m.name FROM sqlite_master AS m, pragma_table_info(m.name) AS c"
                " WHERE m.type = 'table' AND c.name = 'context_id'"
            ).fetchall()
        )
        return {row[0] for row in rows}
    assert isinstance(store, PostgresSessionStore), type(store)
    found = await store._read(
        lambda conn: conn.fetch(
            "SELECT table_name FROM information_schema.columns WHERE table_schema = $1 AND column_name = 'context_id'",
            store.schema,
        )
    )
    return {row["table_name"] for row in found}


async def rows_of(store: SessionStore, context_id: str) -> dict[str, int]:
    """How many rows each table with a ``context_id`` column holds for the session."""
    counts: dict[str, int] = {}
    for table in sorted(await tables_with_context_id(store)):
        query = f"SELECT count(*) FROM {table} WHERE context_id = "
        if isinstance(store, SqliteSessionStore):
            row = await store._r().run(lambda conn, q=query: conn.execute(q + "?", (context_id,)).fetchone())
            counts[table] = int(row[0])
        else:
            assert isinstance(store, PostgresSessionStore), type(store)
            counts[table] = int(await store._read(lambda conn, q=query: conn.fetchval(q + "$1", context_id)))
    return counts


async def copies_of(store: SessionStore, text: str) -> dict[str, int]:
    """How many rows of each table of the store's schema hold ``text`` (anywhere in the row)."""
    if isinstance(store, SqliteSessionStore):

        def scan(conn: Any) -> dict[str, int]:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            rows = {t: conn.execute(f"SELECT * FROM {t}").fetchall() for t in tables}
            return {t: sum(any(text in str(v) for v in row) for row in found) for t, found in rows.items()}

        return {t: n for t, n in (await store._r().run(scan)).items() if n}
    assert isinstance(store, PostgresSessionStore), type(store)
    tables = await store._read(
        lambda conn: conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", store.schema
        )
    )
    found: dict[str, int] = {}
    for name in (row["table_name"] for row in tables):
        query = f"SELECT count(*) FROM {name} AS t WHERE strpos(t::text, $1) > 0"
        count = int(await store._read(lambda conn, q=query: conn.fetchval(q, text)))
        if count:
            found[name] = count
    return found
