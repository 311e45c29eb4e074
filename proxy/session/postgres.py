"""The scale-out session store: PostgreSQL through asyncpg, shared by several proxy replicas.

Queries use a pool; every write is one transaction. Turn locks are advisory locks held on a second
pool's connections (see ``postgres_lock.py``). Tables live in one schema, named on the connections'
search_path, so several deployments (or test runs) can share a database.

The store URL (``CONTEXT_PROXY_STORE_URL``) may carry three options of ours as query parameters, which
are taken out before the rest goes to asyncpg: ``schema`` (default ``context_proxy``), ``pool_size``
(query connections, default 10) and ``lock_connections`` (turns one process can hold at once, default
32), e.g. ``postgresql://proxy@db:5432/proxy?schema=team_a&pool_size=5``.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from proxy.kernel.canonical import HistoryEntry
from proxy.session import keys as key_rows
from proxy.session import postgres_calibration as calibrations
from proxy.session import postgres_sessions as whole_sessions
from proxy.session import reconcile as rc
from proxy.session.postgres_lock import AdvisoryTurnLocks
from proxy.session.postgres_schema import check_schema_name, migrate
from proxy.session.store import (
    SECRET_BYTES,
    BranchView,
    CalibrationUpdate,
    KeyRecord,
    Reconciliation,
    SessionSummary,
    SkillRef,
    StoreError,
    TurnStart,
    UnknownSession,
)

T = TypeVar("T")

DEFAULT_SCHEMA = "context_proxy"
DEFAULT_POOL_SIZE = 10
DEFAULT_LOCK_CONNECTIONS = 32
# Our own query parameters. asyncpg would send any unknown one to the server as a run-time setting,
# which the server rejects ("unrecognized configuration parameter"), so they must be taken out.
_URL_OPTIONS = ("schema", "pool_size", "lock_connections")

# The LATERAL ... LIMIT 1 step pins the walk to one primary-key lookup per message. A plain join lets
# the planner, without statistics on a young table, hash-join a scan of the whole session per step:
# 5,000 messages took 9 s that way, 15 ms this way.
_BRANCH_SQL = """
WITH RECURSIVE branch(chain_hash, parent_hash, position, message, tool_output_ref) AS (
    SELECT chain_hash, parent_hash, position, message, tool_output_ref
    FROM messages WHERE context_id = $1 AND chain_hash = $2
    UNION ALL
    SELECT m.chain_hash, m.parent_hash, m.position, m.message, m.tool_output_ref
    FROM branch AS b CROSS JOIN LATERAL (
        SELECT chain_hash, parent_hash, position, message, tool_output_ref
        FROM messages WHERE context_id = $1 AND chain_hash = b.parent_hash LIMIT 1
    ) AS m
)
"""


@contextmanager
def _translated() -> Iterator[None]:
    """Driver and network failures become ``StoreError``; our own errors pass through."""
    try:
        yield
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
        raise StoreError(f"postgres session store: {exc}") from exc


async def _require_session(conn: Any, context_id: str) -> None:
    # FOR UPDATE also serializes concurrent writers of one session (e.g. the seq of internal steps).
    if await conn.fetchval("SELECT 1 FROM sessions WHERE context_id = $1 FOR UPDATE", context_id) is None:
        raise UnknownSession(context_id)


class PostgresSessionStore:
    """``SessionStore`` on PostgreSQL; several processes may share one database schema."""

    def __init__(
        self,
        dsn: str,
        lock_timeout_seconds: float = 30.0,
        schema: str = DEFAULT_SCHEMA,
        *,
        pool_size: int = DEFAULT_POOL_SIZE,
        lock_connections: int = DEFAULT_LOCK_CONNECTIONS,
    ) -> None:
        self.dsn = dsn
        self.lock_timeout_seconds = lock_timeout_seconds
        self.schema = check_schema_name(schema)
        self.pool_size = pool_size
        self._turn_locks = AdvisoryTurnLocks(self.schema, lock_timeout_seconds, lock_connections)
        self._hash_memo = rc.ChainMemo()
        self._pool: Any = None

    @classmethod
    def from_url(cls, url: str, lock_timeout_seconds: float) -> PostgresSessionStore:
        """A store for a ``postgresql://`` URL, honouring its ``schema``, ``pool_size`` and ``lock_connections``.

        Raises ``ValueError`` naming the parameter when one of them is repeated or invalid, or when the
        URL is not a PostgreSQL one. The one check of the store URL: ``check_settings`` runs it at start-up.
        """
        if not url.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"{url!r} is not a postgresql:// URL (unset means SQLite)")
        dsn, options = split_url_options(url)
        schema = options.get("schema", DEFAULT_SCHEMA)
        pool_size = _positive_option(options, "pool_size", DEFAULT_POOL_SIZE)
        lock_connections = _positive_option(options, "lock_connections", DEFAULT_LOCK_CONNECTIONS)
        return cls(dsn, lock_timeout_seconds, schema, pool_size=pool_size, lock_connections=lock_connections)

    async def open(self) -> None:
        """Create the pools and apply pending migrations under an advisory lock."""
        if self._pool is not None:
            return
        settings = {"search_path": self.schema, "application_name": "context-proxy"}
        with _translated():
            pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self.pool_size, server_settings=settings)
            try:
                async with pool.acquire() as conn:
                    await migrate(conn, self.schema)
                await self._turn_locks.open(self.dsn, settings)
            except BaseException:
                await pool.close()
                raise
        self._pool = pool

    async def close(self) -> None:
        """Close both pools; the store can be opened again."""
        pool, self._pool = self._pool, None
        with _translated():
            await self._turn_locks.close()
            if pool is not None:
                await pool.close()

    def _query_pool(self) -> Any:
        if self._pool is None:
            raise StoreError("the session store is not open")
        return self._pool

    async def _read(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        with _translated():
            async with self._query_pool().acquire() as conn:
                return await fn(conn)

    async def _write(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        with _translated():
            async with self._query_pool().acquire() as conn, conn.transaction():
                return await fn(conn)

    def turn_lock(self, context_id: str, branch: str = "") -> AbstractAsyncContextManager[None]:
        """Serialize the turns of one branch of a session across every replica; ``SessionBusy`` after the wait."""
        return self._turn_locks.hold(context_id, branch)

    async def reconcile(self, context_id: str, scope: str, messages: Sequence[Mapping[str, Any]]) -> Reconciliation:
        """Store the request's new suffix and tool bodies in one transaction; say where it continues."""
        hashes = rc.request_hashes(context_id, messages, self._hash_memo)
        return await self._write(lambda conn: _reconcile(conn, context_id, scope, messages, hashes))

    async def begin_turn(
        self,
        context_id: str,
        scope: str,
        messages: Sequence[Mapping[str, Any]],
        channels: Sequence[str] = (),
        *,
        branch_counter: str | None = None,
        calibration: str | None = None,
        chain_hashes: Sequence[str] | None = None,
        calibration_updates: Sequence[CalibrationUpdate] = (),
    ) -> TurnStart:
        """Reconcile, count the call and read its branch view in one transaction on one connection."""
        hashes = rc.given_or_computed(context_id, messages, chain_hashes, self._hash_memo)

        async def work(conn: Any) -> TurnStart:
            # The reads first: reconciling locks the session's row until the commit, and concurrent turns
            # of the session's other branches wait for that lock, so it is held for the writes only.
            chain = rc.view_chain(hashes)
            wanted = [*channels, branch_counter] if branch_counter is not None else list(channels)
            found = await _states_found(conn, context_id, chain, wanted)
            view = rc.branch_view(chain, found, channels, await _checkpoints(conn, context_id))
            stored = await calibrations.read(conn, calibration) if calibration is not None else None
            reconciliation = await _reconcile(conn, context_id, scope, messages, hashes)
            turn = await _next_turn(conn, context_id)
            branch = None
            if branch_counter is not None:
                branch = rc.branch_count(hashes, found.get(branch_counter) or {})
                await _put_state(conn, context_id, hashes[-1], branch_counter, branch.number)
            # Last, like the other writes: each locks its route's row until the commit, in the order of
            # their keys (the same in every transaction: no deadlock; a key's own samples keep theirs).
            # The route read above is then as these updates leave it.
            for pending in sorted(calibration_updates, key=lambda update: update.route_key):
                value = await calibrations.update(conn, pending)
                if pending.route_key == calibration:
                    stored = value
            return TurnStart(reconciliation, turn, view, branch, stored)

        return await self._write(work)

    async def transcript(self, context_id: str, head_hash: str) -> list[HistoryEntry]:
        """The branch ending at ``head_hash``, oldest first, in one recursive query."""

        async def work(conn: Any) -> list[HistoryEntry]:
            rows = await conn.fetch(
                _BRANCH_SQL + "SELECT position, chain_hash, message, tool_output_ref FROM branch ORDER BY position",
                context_id,
                head_hash,
            )
            return [
                HistoryEntry(rc.load_json(row["message"]), row["chain_hash"], row["tool_output_ref"], row["position"])
                for row in rows
            ]

        return await self._read(work)

    async def tool_output(self, context_id: str, ref: str) -> str | None:
        """A stored tool body of this session, or ``None``: read from its message, the one copy kept."""
        message = await self._read(
            lambda conn: conn.fetchval(
                "SELECT message FROM messages WHERE context_id = $1 AND tool_output_ref = $2", context_id, ref
            )
        )
        return None if message is None else rc.tool_body(rc.load_json(message))

    async def next_turn(self, context_id: str) -> int:
        """Increment and return the session's model-call counter."""
        return await self._write(lambda conn: _next_turn(conn, context_id))

    async def put_internal_steps(
        self, context_id: str, anchor_hash: str, messages: Sequence[Mapping[str, Any]]
    ) -> None:
        """Append proxy-owned tool steps after ``anchor_hash``."""

        async def work(conn: Any) -> None:
            await _require_session(conn, context_id)
            start = await conn.fetchval(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM internal_steps WHERE context_id = $1 AND anchor_hash = $2",
                context_id,
                anchor_hash,
            )
            texts = [rc.json_text(dict(message)) for message in messages]
            await conn.execute(
                "INSERT INTO internal_steps (context_id, anchor_hash, seq, message)"
                " SELECT $1, $2, $3 + ord - 1, m::json FROM unnest($4::text[]) WITH ORDINALITY AS t(m, ord)",
                context_id,
                anchor_hash,
                start,
                texts,
            )

        await self._write(work)

    async def internal_steps(self, context_id: str, anchor_hash: str) -> list[dict[str, Any]]:
        """The proxy-owned steps recorded after ``anchor_hash``, in order."""
        rows = await self._read(
            lambda conn: conn.fetch(
                "SELECT message FROM internal_steps WHERE context_id = $1 AND anchor_hash = $2 ORDER BY seq",
                context_id,
                anchor_hash,
            )
        )
        return [rc.load_json(row["message"]) for row in rows]

    async def put_checkpoint(self, context_id: str, covers_hash: str, checkpoint: Mapping[str, Any]) -> None:
        """Store (or replace) the checkpoint covering up to ``covers_hash``."""

        async def work(conn: Any) -> None:
            await _require_session(conn, context_id)
            await conn.execute(
                "INSERT INTO checkpoints (context_id, covers_hash, checkpoint) VALUES ($1, $2, $3::json)"
                " ON CONFLICT (context_id, covers_hash) DO UPDATE"
                " SET checkpoint = excluded.checkpoint, updated_at = now()",
                context_id,
                covers_hash,
                rc.json_text(dict(checkpoint)),
            )

        await self._write(work)

    async def put_state(self, context_id: str, chain_hash: str, channel: str, value: Any) -> None:
        """Store (or replace) a state channel's value as of ``chain_hash``."""

        async def work(conn: Any) -> None:
            await _require_session(conn, context_id)
            await _put_state(conn, context_id, chain_hash, channel, value)

        await self._write(work)

    async def state(self, context_id: str, chain_hash: str, channel: str) -> Any | None:
        """A state channel's value as of ``chain_hash``, or ``None``."""
        text = await self._read(
            lambda conn: conn.fetchval(
                "SELECT value FROM state_channels WHERE context_id = $1 AND chain_hash = $2 AND channel = $3",
                context_id,
                chain_hash,
                channel,
            )
        )
        return None if text is None else rc.load_json(text)

    async def branch_view(self, context_id: str, chain_hashes: Sequence[str], channels: Sequence[str]) -> BranchView:
        """The channels along the chain (below the session-wide root) and the checkpoints, on one connection."""
        chain = rc.view_chain(chain_hashes)

        async def work(conn: Any) -> BranchView:
            found = await _states_found(conn, context_id, chain, channels)
            return rc.branch_view(chain, found, channels, await _checkpoints(conn, context_id))

        return await self._read(work)

    async def put_skill_ref(self, context_id: str, ref: SkillRef) -> None:
        """Record a skill read; the same (name, revision, chain hash) twice is one record."""

        async def work(conn: Any) -> None:
            await _require_session(conn, context_id)
            await conn.execute(
                "INSERT INTO skill_refs (context_id, name, revision, chain_hash) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT DO NOTHING",
                context_id,
                ref.name,
                ref.revision,
                ref.chain_hash,
            )

        await self._write(work)

    async def skill_refs(self, context_id: str) -> list[SkillRef]:
        """The session's skill references, oldest first."""
        rows = await self._read(
            lambda conn: conn.fetch(
                "SELECT name, revision, chain_hash FROM skill_refs WHERE context_id = $1 ORDER BY id", context_id
            )
        )
        return [SkillRef(row["name"], row["revision"], row["chain_hash"]) for row in rows]

    async def sessions(self) -> list[SessionSummary]:
        """Every stored session, the most recently updated first."""
        return await self._read(whole_sessions.summaries)

    async def delete_session(self, context_id: str) -> bool:
        """Delete the session in one transaction once no turn of it runs on any replica."""
        async with self._turn_locks.hold_session(context_id):
            return await self._write(lambda conn: whole_sessions.delete(conn, context_id))

    async def secret(self, name: str) -> bytes:
        """The secret ``name``, made on first use; replicas starting together agree on one."""
        candidate = secrets.token_bytes(SECRET_BYTES)

        async def work(conn: Any) -> bytes:
            # ON CONFLICT DO NOTHING: the first insert wins and every racer then reads the winner.
            await conn.execute(
                "INSERT INTO proxy_secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING", name, candidate
            )
            return bytes(await conn.fetchval("SELECT value FROM proxy_secrets WHERE name = $1", name))

        return await self._write(work)

    async def calibration(self, route_key: str) -> Any | None:
        """The route's stored token calibration, or ``None``."""
        return await self._read(lambda conn: calibrations.read(conn, route_key))

    async def update_calibration(
        self, route_key: str, group: str, update: Callable[[Any | None], Any], keep: int | None = None
    ) -> Any:
        """Read, update and write the route's calibration with its row locked; trim the group to ``keep``."""
        pending = CalibrationUpdate(route_key, group, update, keep)
        return await self._write(lambda conn: calibrations.update(conn, pending))

    async def put_key(self, record: KeyRecord) -> None:
        """Store a new virtual key's row (its hash, never the key)."""
        values = key_rows.row_values(record)

        async def work(conn: Any) -> None:
            try:
                await conn.execute(
                    f"INSERT INTO virtual_keys ({key_rows.COLUMNS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)", *values
                )
            except asyncpg.UniqueViolationError as exc:
                raise StoreError(f"key {record.key_id!r} exists already") from exc

        await self._write(work)

    async def key_by_hash(self, key_hash: str) -> KeyRecord | None:
        """The key whose current hash is ``key_hash``, or ``None``."""
        row = await self._read(
            lambda conn: conn.fetchrow(f"SELECT {key_rows.COLUMNS} FROM virtual_keys WHERE key_hash = $1", key_hash)
        )
        return None if row is None else key_rows.from_row(dict(row))

    async def keys(self) -> list[KeyRecord]:
        """Every virtual key, oldest first."""
        rows = await self._read(
            lambda conn: conn.fetch(f"SELECT {key_rows.COLUMNS} FROM virtual_keys ORDER BY created_at, key_id")
        )
        return [key_rows.from_row(dict(row)) for row in rows]

    async def rotate_key(self, key_id: str, new_hash: str) -> bool:
        """Replace a live key's hash."""
        status = await self._write(
            lambda conn: conn.execute(
                "UPDATE virtual_keys SET key_hash = $2 WHERE key_id = $1 AND revoked_at IS NULL", key_id, new_hash
            )
        )
        return str(status).endswith(" 1")

    async def revoke_key(self, key_id: str, revoked_at: str) -> bool:
        """Mark a live key revoked."""
        status = await self._write(
            lambda conn: conn.execute(
                "UPDATE virtual_keys SET revoked_at = $2 WHERE key_id = $1 AND revoked_at IS NULL", key_id, revoked_at
            )
        )
        return str(status).endswith(" 1")


def split_url_options(url: str) -> tuple[str, dict[str, str]]:
    """The URL without our query parameters (``schema``, ``pool_size``, ``lock_connections``), and those."""
    parts = urlsplit(url)
    kept: list[tuple[str, str]] = []
    options: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in _URL_OPTIONS:
            kept.append((key, value))
        elif key in options:
            raise ValueError(f"store URL parameter {key!r} is given twice")
        else:
            options[key] = value
    return urlunsplit(parts._replace(query=urlencode(kept))), options


def _positive_option(options: Mapping[str, str], name: str, default: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) <= 0:
        raise ValueError(f"store URL parameter {name}={raw!r} is not a positive integer")
    return int(raw)


async def _reconcile(
    conn: Any, context_id: str, scope: str, messages: Sequence[Mapping[str, Any]], hashes: list[str]
) -> Reconciliation:
    """Store the request's new suffix and tool bodies (inside the caller's transaction)."""
    created = (
        await conn.fetchval(
            "INSERT INTO sessions (context_id, scope) VALUES ($1, $2)"
            " ON CONFLICT (context_id) DO NOTHING RETURNING true",
            context_id,
            scope,
        )
        is not None
    )
    # The row lock makes a concurrent reconcile of the same session wait for this one.
    previous_head = await conn.fetchval("SELECT head_hash FROM sessions WHERE context_id = $1 FOR UPDATE", context_id)
    stored = {
        row["chain_hash"]
        for row in await conn.fetch(
            "SELECT chain_hash FROM messages WHERE context_id = $1 AND chain_hash = ANY($2::text[])",
            context_id,
            hashes,
        )
    }
    known = rc.known_count(hashes, stored)
    forked = rc.fork_without_lookup(previous_head, hashes, known)
    if forked is None:
        forked = not await _is_ancestor(conn, context_id, hashes[-1], previous_head, len(hashes) - 1)
    rows = list(rc.message_rows(messages, hashes, known))
    if rows:
        await conn.execute(
            "INSERT INTO messages (context_id, chain_hash, parent_hash, position, message, tool_output_ref)"
            " SELECT $1, h, p, pos, m::json, r"
            " FROM unnest($2::text[], $3::text[], $4::int[], $5::text[], $6::text[]) AS t(h, p, pos, m, r)",
            context_id,
            [row.chain_hash for row in rows],
            [row.parent_hash for row in rows],
            [row.position for row in rows],
            [row.message_json for row in rows],
            [row.tool_ref for row in rows],
        )
    await conn.execute(
        "UPDATE sessions SET head_hash = $2, updated_at = now() WHERE context_id = $1", context_id, hashes[-1]
    )
    return Reconciliation(context_id, hashes[-1], known, [row.stored() for row in rows], forked, created, tuple(hashes))


async def _next_turn(conn: Any, context_id: str) -> int:
    turns = await conn.fetchval(
        "UPDATE sessions SET turns = turns + 1 WHERE context_id = $1 RETURNING turns", context_id
    )
    if turns is None:
        raise UnknownSession(context_id)
    return int(turns)


async def _put_state(conn: Any, context_id: str, chain_hash: str, channel: str, value: Any) -> None:
    await conn.execute(
        "INSERT INTO state_channels (context_id, chain_hash, channel, value) VALUES ($1, $2, $3, $4::json)"
        " ON CONFLICT (context_id, chain_hash, channel) DO UPDATE SET value = excluded.value",
        context_id,
        chain_hash,
        channel,
        rc.json_text(value),
    )


async def _states_found(
    conn: Any, context_id: str, chain: Sequence[str], channels: Sequence[str]
) -> dict[str, dict[str, Any]]:
    if not channels:
        return {}
    rows = await conn.fetch(
        "SELECT channel, chain_hash, value FROM state_channels"
        " WHERE context_id = $1 AND channel = ANY($2::text[]) AND chain_hash = ANY($3::text[])",
        context_id,
        list(channels),
        list(chain),
    )
    return rc.states_found((row["channel"], row["chain_hash"], row["value"]) for row in rows)


async def _checkpoints(conn: Any, context_id: str) -> dict[str, dict[str, Any]]:
    rows = await conn.fetch(
        "SELECT covers_hash, checkpoint FROM checkpoints WHERE context_id = $1 ORDER BY id", context_id
    )
    return {row["covers_hash"]: dict(rc.load_json(row["checkpoint"])) for row in rows}


async def _is_ancestor(conn: Any, context_id: str, candidate: str, head: str, position: int) -> bool:
    """Whether ``candidate`` (at ``position``) lies on the branch ending at ``head``."""
    found = await conn.fetchval(
        _BRANCH_SQL + "SELECT true FROM branch WHERE position = $3 AND chain_hash = $4",
        context_id,
        head,
        position,
        candidate,
    )
    return found is not None
