"""The SQLite store's sessions as a whole: list them, delete one inside the caller's transaction."""

from __future__ import annotations

import sqlite3

from proxy.session.sqlite_schema import SESSION_TABLES
from proxy.session.store import SessionSummary


def summaries(conn: sqlite3.Connection) -> list[SessionSummary]:
    """Every session with its stored message count, the most recently updated first."""
    rows = conn.execute(
        "SELECT s.context_id, s.scope, (SELECT count(*) FROM messages AS m WHERE m.context_id = s.context_id),"
        " s.updated_at FROM sessions AS s ORDER BY s.updated_at DESC, s.context_id"
    ).fetchall()
    return [SessionSummary(cid, scope, int(count), str(updated)) for cid, scope, count, updated in rows]


def delete(conn: sqlite3.Connection, context_id: str) -> bool:
    """Delete the session's rows from every table that holds them; whether there were any."""
    # Table by table, not through ON DELETE CASCADE: nothing rests on a connection's foreign-key setting.
    deleted = 0
    for table in SESSION_TABLES:
        deleted += conn.execute(f"DELETE FROM {table} WHERE context_id = ?", (context_id,)).rowcount
    return deleted > 0
