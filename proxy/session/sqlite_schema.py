"""The SQLite store's schema as numbered migrations, and the code that applies them."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

# Append only: a released migration is never edited, a change is a new version.
MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
        CREATE TABLE sessions (
            context_id TEXT PRIMARY KEY,
            scope TEXT NOT NULL,
            head_hash TEXT NOT NULL DEFAULT '',
            turns INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        CREATE TABLE messages (
            context_id TEXT NOT NULL REFERENCES sessions (context_id) ON DELETE CASCADE,
            chain_hash TEXT NOT NULL,
            parent_hash TEXT NOT NULL,
            position INTEGER NOT NULL,
            message TEXT NOT NULL,
            tool_output_ref TEXT,
            PRIMARY KEY (context_id, chain_hash)
        );
        CREATE TABLE tool_outputs (
            context_id TEXT NOT NULL REFERENCES sessions (context_id) ON DELETE CASCADE,
            ref TEXT NOT NULL,
            chain_hash TEXT NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (context_id, ref)
        );
        CREATE TABLE internal_steps (
            context_id TEXT NOT NULL REFERENCES sessions (context_id) ON DELETE CASCADE,
            anchor_hash TEXT NOT NULL,
            seq INTEGER NOT NULL,
            message TEXT NOT NULL,
            PRIMARY KEY (context_id, anchor_hash, seq)
        );
        CREATE TABLE checkpoints (
            context_id TEXT NOT NULL REFERENCES sessions (context_id) ON DELETE CASCADE,
            covers_hash TEXT NOT NULL,
            checkpoint TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (context_id, covers_hash)
        );
        CREATE TABLE state_channels (
            context_id TEXT NOT NULL REFERENCES sessions (context_id) ON DELETE CASCADE,
            chain_hash TEXT NOT NULL,
            channel TEXT NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (context_id, chain_hash, channel)
        );
        CREATE TABLE skill_refs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            context_id TEXT NOT NULL REFERENCES sessions (context_id) ON DELETE CASCADE,
            name TEXT NOT NULL,
            revision TEXT NOT NULL,
            chain_hash TEXT NOT NULL,
            UNIQUE (context_id, name, revision, chain_hash)
        );
        """,
    ),
    (
        2,
        """
        CREATE TABLE proxy_secrets (
            name TEXT PRIMARY KEY,
            value BLOB NOT NULL,
            created_at TEXT NOT NULL
        );
        """,
    ),
    (
        3,
        """
        CREATE TABLE token_calibration (
            route_key TEXT PRIMARY KEY,
            route_group TEXT NOT NULL,
            state TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        """,
    ),
    (
        4,
        """
        CREATE TABLE virtual_keys (
            key_id TEXT PRIMARY KEY,
            key_hash TEXT NOT NULL UNIQUE,
            team TEXT NOT NULL,
            alias TEXT,
            models TEXT NOT NULL,
            rpm INTEGER,
            tpm INTEGER,
            expires_at TEXT,
            created_at TEXT NOT NULL,
            revoked_at TEXT
        );
        """,
    ),
    (
        5,
        # A tool body was stored twice, in its message's JSON and in tool_outputs (584 MB and 570 MB after
        # 3,000 requests of 200 KB): it is now read from the message, found by its reference.
        """
        CREATE INDEX messages_tool_output_ref ON messages (context_id, tool_output_ref)
            WHERE tool_output_ref IS NOT NULL;
        DROP TABLE tool_outputs;
        """,
    ),
)


# Every table with rows of one session, the session's own row last (the others refer to it): what
# deleting a session deletes. A migration that adds such a table adds it here; the shared tables
# (``proxy_secrets``, ``token_calibration``, ``virtual_keys``) are not a session's. The store tests check the schema
# against this list.
SESSION_TABLES = (
    "messages",
    "internal_steps",
    "checkpoints",
    "state_channels",
    "skill_refs",
    "sessions",
)


def applied_versions(conn: sqlite3.Connection) -> list[int]:
    """The migration versions recorded in the database, ascending."""
    return [row[0] for row in conn.execute("SELECT version FROM schema_version ORDER BY version")]


def migrate(conn: sqlite3.Connection) -> None:
    """Apply every pending migration, each in its own transaction (idempotent).

    ``BEGIN IMMEDIATE`` takes the write lock before the version is read, so two processes opening
    the same file at once apply each migration exactly once.
    """
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
    for version, script in MIGRATIONS:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("SELECT 1 FROM schema_version WHERE version = ?", (version,)).fetchone() is None:
                # executescript() would commit the open transaction first; run statement by statement.
                for statement in _statements(script):
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                    (version, datetime.now(UTC).isoformat()),
                )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


def _statements(script: str) -> list[str]:
    return [part.strip() for part in script.split(";") if part.strip()]
