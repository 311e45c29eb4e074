"""The PostgreSQL store's schema as numbered migrations, and the code that applies them."""

from __future__ import annotations

import hashlib
import re
from typing import Any

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# Append only: a released migration is never edited, a change is a new version.
# Message and value columns are `json`, not `jsonb`: json keeps the text exactly as the client sent it
# (key order, duplicate keys), which is what "the transcript is what the client sent" needs.
MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
        CREATE TABLE sessions (
            context_id text PRIMARY KEY,
            scope text NOT NULL,
            head_hash text NOT NULL DEFAULT '',
            turns integer NOT NULL DEFAULT 0,
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now()
        );
        CREATE TABLE messages (
            context_id text NOT NULL REFERENCES sessions (context_id) ON DELETE CASCADE,
            chain_hash text NOT NULL,
            parent_hash text NOT NULL,
            position integer NOT NULL,
            message json NOT NULL,
            tool_output_ref text,
            PRIMARY KEY (context_id, chain_hash)
        );
        CREATE TABLE tool_outputs (
            context_id text NOT NULL REFERENCES sessions (context_id) ON DELETE CASCADE,
            ref text NOT NULL,
            chain_hash text NOT NULL,
            body text NOT NULL,
            PRIMARY KEY (context_id, ref)
        );
        CREATE TABLE internal_steps (
            context_id text NOT NULL REFERENCES sessions (context_id) ON DELETE CASCADE,
            anchor_hash text NOT NULL,
            seq integer NOT NULL,
            message json NOT NULL,
            PRIMARY KEY (context_id, anchor_hash, seq)
        );
        CREATE TABLE checkpoints (
            id bigint GENERATED ALWAYS AS IDENTITY,
            context_id text NOT NULL REFERENCES sessions (context_id) ON DELETE CASCADE,
            covers_hash text NOT NULL,
            checkpoint json NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (context_id, covers_hash)
        );
        CREATE TABLE state_channels (
            context_id text NOT NULL REFERENCES sessions (context_id) ON DELETE CASCADE,
            chain_hash text NOT NULL,
            channel text NOT NULL,
            value json NOT NULL,
            PRIMARY KEY (context_id, chain_hash, channel)
        );
        CREATE TABLE skill_refs (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            context_id text NOT NULL REFERENCES sessions (context_id) ON DELETE CASCADE,
            name text NOT NULL,
            revision text NOT NULL,
            chain_hash text NOT NULL,
            UNIQUE (context_id, name, revision, chain_hash)
        );
        """,
    ),
    (
        2,
        """
        CREATE TABLE proxy_secrets (
            name text PRIMARY KEY,
            value bytea NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now()
        );
        """,
    ),
    (
        3,
        """
        CREATE TABLE token_calibration (
            route_key text PRIMARY KEY,
            route_group text NOT NULL,
            state json NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
        );
        """,
    ),
    (
        4,
        """
        CREATE TABLE virtual_keys (
            key_id text PRIMARY KEY,
            key_hash text NOT NULL UNIQUE,
            team text NOT NULL,
            alias text,
            models text NOT NULL,
            rpm integer,
            tpm integer,
            expires_at text,
            created_at text NOT NULL,
            revoked_at text
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


def check_schema_name(schema: str) -> str:
    """The schema name, if it is a plain lowercase identifier (so it never needs quoting)."""
    if not _SCHEMA_NAME.fullmatch(schema):
        raise ValueError(f"PostgreSQL schema name {schema!r} must match {_SCHEMA_NAME.pattern}")
    return schema


def lock_key(*parts: str) -> int:
    """A signed 64-bit advisory-lock key for ``parts`` (stable across processes and releases)."""
    digest = hashlib.sha256("\x00".join(parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def applied_versions(conn: Any) -> list[int]:
    """The migration versions recorded in the connection's schema, ascending."""
    rows = await conn.fetch("SELECT version FROM schema_version ORDER BY version")
    return [int(row["version"]) for row in rows]


async def migrate(conn: Any, schema: str) -> None:
    """Create the schema and apply every pending migration in one transaction (idempotent).

    A transaction-scoped advisory lock makes replicas that start together take turns: the second
    one finds the versions already recorded and applies nothing. The connection's search_path must
    name ``schema``.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key("context-proxy-migrate", schema))
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version"
            " (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = set(await applied_versions(conn))
        for version, script in MIGRATIONS:
            if version in done:
                continue
            await conn.execute(script)
            await conn.execute("INSERT INTO schema_version (version) VALUES ($1)", version)
