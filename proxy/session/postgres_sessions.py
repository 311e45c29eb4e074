"""The PostgreSQL store's sessions as a whole: list them, delete one inside the caller's transaction."""

from __future__ import annotations

from typing import Any

from proxy.session.postgres_schema import SESSION_TABLES
from proxy.session.store import SessionSummary


async def summaries(conn: Any) -> list[SessionSummary]:
    """Every session with its stored message count, the most recently updated first."""
    rows = await conn.fetch(
        "SELECT s.context_id, s.scope, s.updated_at,"
        " (SELECT count(*) FROM messages AS m WHERE m.context_id = s.context_id) AS messages"
        " FROM sessions AS s ORDER BY s.updated_at DESC, s.context_id"
    )
    return [
        SessionSummary(row["context_id"], row["scope"], int(row["messages"]), row["updated_at"].isoformat())
        for row in rows
    ]


async def delete(conn: Any, context_id: str) -> bool:
    """Delete the session's rows from every table that holds them; whether there were any."""
    # Table by table, not through ON DELETE CASCADE: nothing rests on a connection's foreign-key setting.
    deleted = 0
    for table in SESSION_TABLES:
        status = await conn.execute(f"DELETE FROM {table} WHERE context_id = $1", context_id)
        deleted += int(status.rsplit(" ", 1)[-1])  # "DELETE <rows>"
    return deleted > 0
