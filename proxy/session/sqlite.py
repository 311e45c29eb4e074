"""The embedded session store: one SQLite file in WAL mode.

sqlite3 blocks, so each connection lives on its own worker thread and the event loop only awaits it:
one writer connection (SQLite allows one writer at a time anyway) and one reader connection, which
WAL lets read while the writer writes. Turns of one session are serialized by an in-process lock;
this backend is for one proxy process (several replicas use PostgreSQL), which ``sqlite_files.py``
enforces with a lock file, along with private file modes.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from proxy.kernel.canonical import HistoryEntry
from proxy.session import keys as key_rows
from proxy.session import reconcile as rc
from proxy.session import sqlite_calibration as calibrations
from proxy.session import sqlite_sessions as whole_sessions
from proxy.session.locks import SessionLocks
from proxy.session.sqlite_files import ProcessLock, private_database, private_folder
from proxy.session.sqlite_schema import migrate
from proxy.session.sqlite_wal import Checkpointer, writer_pragmas
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

_BUSY_TIMEOUT_MS = 10_000  # only another process can hold the write lock; ours are serialized

_BRANCH_SQL = """
WITH RECURSIVE branch(chain_hash, parent_hash, position, message, tool_output_ref) AS (
    SELECT chain_hash, parent_hash, position, message, tool_output_ref
    FROM messages WHERE context_id = :cid AND chain_hash = :head
    UNION ALL
    SELECT m.chain_hash, m.parent_hash, m.position, m.message, m.tool_output_ref
    FROM messages AS m JOIN branch AS b ON m.context_id = :cid AND m.chain_hash = b.parent_hash
)
"""


class _Connection:
    """One sqlite3 connection confined to one worker thread."""

    def __init__(self, path: Path, *, query_only: bool) -> None:
        self._path = path
        self._query_only = query_only
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="session-sqlite")
        self._conn: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a transaction is exactly what we say.
        conn = sqlite3.connect(self._path, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys = ON")
        if self._query_only:
            conn.execute("PRAGMA query_only = ON")
        else:
            _enable_wal(conn)
            # NORMAL is safe from corruption in WAL mode; a power cut may lose the last commits only.
            conn.execute("PRAGMA synchronous = NORMAL")
            writer_pragmas(conn)  # checkpoints run on their own thread (sqlite_checkpoints.py)
        self._conn = conn
        return conn

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` with the connection on its thread; sqlite3 errors become ``StoreError``."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._call, fn)
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite session store: {exc}") from exc

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in one write transaction: committed if it returns, rolled back if it raises."""
        return await self.run(lambda conn: _transaction(conn, fn))

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return fn(self._conn or self._connect())

    async def close(self) -> None:
        """Close the connection on its thread, then stop the thread."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close)
        self._executor.shutdown(wait=True)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _enable_wal(conn: sqlite3.Connection) -> None:
    # Switching a new file to WAL needs an exclusive lock, and SQLite reports "locked" at once, without
    # consulting busy_timeout, while another connection holds the file (two stores opening together).
    give_up = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > give_up:
                raise
            time.sleep(0.01)


def _transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    # IMMEDIATE takes the write lock up front, so reads inside the transaction cannot go stale.
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _require_session(conn: sqlite3.Connection, context_id: str) -> None:
    if conn.execute("SELECT 1 FROM sessions WHERE context_id = ?", (context_id,)).fetchone() is None:
        raise UnknownSession(context_id)


class SqliteSessionStore:
    """``SessionStore`` on a SQLite file (the embedded default)."""

    def __init__(self, path: str | os.PathLike[str], lock_timeout_seconds: float = 30.0) -> None:
        self.path = Path(path)
        self.lock_timeout_seconds = lock_timeout_seconds
        self._locks = SessionLocks()
        self._hash_memo = rc.ChainMemo()
        self._process_lock = ProcessLock(self.path)
        self._writer: _Connection | None = None
        self._reader: _Connection | None = None
        self._checkpointer: Checkpointer | None = None

    async def open(self) -> None:
        """Lock the file for this process, make it private (created 0600 if missing), apply migrations.

        Raises ``DataFolderInUse`` when another process (or another open store) has the file.
        """
        if self._writer is not None:
            return
        private_folder(self.path.parent)
        self._process_lock.acquire()
        writer = _Connection(self.path, query_only=False)
        try:
            private_database(self.path)
            await writer.run(migrate)
        except BaseException:
            await writer.close()
            self._process_lock.release()
            raise
        self._writer = writer
        self._reader = _Connection(self.path, query_only=True)
        self._checkpointer = Checkpointer(self.path)
        self._checkpointer.start()

    def check_free(self) -> None:
        """Raise ``DataFolderInUse`` if another process has the file now (``open`` takes the lock)."""
        ProcessLock(self.path).check()

    async def close(self) -> None:
        """Close both connections and release the file; the store can be opened again."""
        if self._checkpointer is not None:
            await asyncio.to_thread(self._checkpointer.stop)
            self._checkpointer = None
        for conn in (self._reader, self._writer):
            if conn is not None:
                await conn.close()
        self._reader = self._writer = None
        self._process_lock.release()

    def _w(self) -> _Connection:
        if self._writer is None:
            raise StoreError("the session store is not open")
        return self._writer

    def _r(self) -> _Connection:
        if self._reader is None:
            raise StoreError("the session store is not open")
        return self._reader

    def turn_lock(self, context_id: str, branch: str = "") -> AbstractAsyncContextManager[None]:
        """Serialize the turns of one branch of a session in this process; ``SessionBusy`` after the wait."""
        return self._locks.hold(context_id, self.lock_timeout_seconds, branch)

    async def reconcile(self, context_id: str, scope: str, messages: Sequence[Mapping[str, Any]]) -> Reconciliation:
        """Store the request's new suffix and tool bodies in one transaction; say where it continues."""
        hashes = rc.request_hashes(context_id, messages, self._hash_memo)
        return await self._w().write(lambda conn: _reconcile(conn, context_id, scope, messages, hashes))

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
        """Reconcile, count the call and read its branch view in one transaction on the writer thread."""
        hashes = rc.given_or_computed(context_id, messages, chain_hashes, self._hash_memo)

        def work(conn: sqlite3.Connection) -> TurnStart:
            # The route's calibration as these updates leave it is their value: not read back (as PostgreSQL's).
            updated = {pending.route_key: calibrations.update(conn, pending, _now()) for pending in calibration_updates}
            reconciliation = _reconcile(conn, context_id, scope, messages, hashes)
            turn = _next_turn(conn, context_id)
            chain = rc.view_chain(hashes)
            wanted = [*channels, branch_counter] if branch_counter is not None else list(channels)
            found = _states_found(conn, context_id, chain, wanted)
            branch = None
            if branch_counter is not None:
                branch = rc.branch_count(hashes, found.get(branch_counter) or {})
                _put_state(conn, context_id, hashes[-1], branch_counter, branch.number)
            view = rc.branch_view(chain, found, channels, _checkpoints(conn, context_id))
            stored = None
            if calibration is not None:
                stored = updated[calibration] if calibration in updated else calibrations.read(conn, calibration)
            return TurnStart(reconciliation, turn, view, branch, stored)

        return await self._w().write(work)

    async def transcript(self, context_id: str, head_hash: str) -> list[HistoryEntry]:
        """The branch ending at ``head_hash``, oldest first, in one recursive query."""

        def work(conn: sqlite3.Connection) -> list[HistoryEntry]:
            rows = conn.execute(
                _BRANCH_SQL + "SELECT position, chain_hash, message, tool_output_ref FROM branch ORDER BY position",
                {"cid": context_id, "head": head_hash},
            ).fetchall()
            return [HistoryEntry(rc.load_json(msg), chash, ref, pos) for pos, chash, msg, ref in rows]

        return await self._r().run(work)

    async def tool_output(self, context_id: str, ref: str) -> str | None:
        """A stored tool body of this session, or ``None``: read from its message, the one copy kept."""
        row = await self._r().run(
            lambda conn: conn.execute(
                "SELECT message FROM messages WHERE context_id = ? AND tool_output_ref = ?", (context_id, ref)
            ).fetchone()
        )
        return None if row is None else rc.tool_body(rc.load_json(row[0]))

    async def next_turn(self, context_id: str) -> int:
        """Increment and return the session's model-call counter."""
        return await self._w().write(lambda conn: _next_turn(conn, context_id))

    async def put_internal_steps(
        self, context_id: str, anchor_hash: str, messages: Sequence[Mapping[str, Any]]
    ) -> None:
        """Append proxy-owned tool steps after ``anchor_hash``."""

        def work(conn: sqlite3.Connection) -> None:
            _require_session(conn, context_id)
            (start,) = conn.execute(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM internal_steps WHERE context_id = ? AND anchor_hash = ?",
                (context_id, anchor_hash),
            ).fetchone()
            for offset, message in enumerate(messages):
                conn.execute(
                    "INSERT INTO internal_steps (context_id, anchor_hash, seq, message) VALUES (?, ?, ?, ?)",
                    (context_id, anchor_hash, start + offset, rc.json_text(dict(message))),
                )

        await self._w().write(work)

    async def internal_steps(self, context_id: str, anchor_hash: str) -> list[dict[str, Any]]:
        """The proxy-owned steps recorded after ``anchor_hash``, in order."""
        rows = await self._r().run(
            lambda conn: conn.execute(
                "SELECT message FROM internal_steps WHERE context_id = ? AND anchor_hash = ? ORDER BY seq",
                (context_id, anchor_hash),
            ).fetchall()
        )
        return [rc.load_json(row[0]) for row in rows]

    async def put_checkpoint(self, context_id: str, covers_hash: str, checkpoint: Mapping[str, Any]) -> None:
        """Store (or replace) the checkpoint covering up to ``covers_hash``."""

        def work(conn: sqlite3.Connection) -> None:
            _require_session(conn, context_id)
            conn.execute(
                "INSERT INTO checkpoints (context_id, covers_hash, checkpoint, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (context_id, covers_hash) DO UPDATE"
                " SET checkpoint = excluded.checkpoint, updated_at = excluded.updated_at",
                (context_id, covers_hash, rc.json_text(dict(checkpoint)), _now()),
            )

        await self._w().write(work)

    async def put_state(self, context_id: str, chain_hash: str, channel: str, value: Any) -> None:
        """Store (or replace) a state channel's value as of ``chain_hash``."""

        def work(conn: sqlite3.Connection) -> None:
            _require_session(conn, context_id)
            _put_state(conn, context_id, chain_hash, channel, value)

        await self._w().write(work)

    async def state(self, context_id: str, chain_hash: str, channel: str) -> Any | None:
        """A state channel's value as of ``chain_hash``, or ``None``."""
        row = await self._r().run(
            lambda conn: conn.execute(
                "SELECT value FROM state_channels WHERE context_id = ? AND chain_hash = ? AND channel = ?",
                (context_id, chain_hash, channel),
            ).fetchone()
        )
        return None if row is None else rc.load_json(row[0])

    async def branch_view(self, context_id: str, chain_hashes: Sequence[str], channels: Sequence[str]) -> BranchView:
        """The channels along the chain (below the session-wide root) and the checkpoints, in one read."""
        chain = rc.view_chain(chain_hashes)

        def work(conn: sqlite3.Connection) -> BranchView:
            found = _states_found(conn, context_id, chain, channels)
            return rc.branch_view(chain, found, channels, _checkpoints(conn, context_id))

        return await self._r().run(work)

    async def put_skill_ref(self, context_id: str, ref: SkillRef) -> None:
        """Record a skill read; the same (name, revision, chain hash) twice is one record."""

        def work(conn: sqlite3.Connection) -> None:
            _require_session(conn, context_id)
            conn.execute(
                "INSERT INTO skill_refs (context_id, name, revision, chain_hash) VALUES (?, ?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (context_id, ref.name, ref.revision, ref.chain_hash),
            )

        await self._w().write(work)

    async def skill_refs(self, context_id: str) -> list[SkillRef]:
        """The session's skill references, oldest first."""
        rows = await self._r().run(
            lambda conn: conn.execute(
                "SELECT name, revision, chain_hash FROM skill_refs WHERE context_id = ? ORDER BY id", (context_id,)
            ).fetchall()
        )
        return [SkillRef(name, revision, chash) for name, revision, chash in rows]

    async def sessions(self) -> list[SessionSummary]:
        """Every stored session, the most recently updated first."""
        return await self._r().run(whole_sessions.summaries)

    async def delete_session(self, context_id: str) -> bool:
        """Delete the session in one transaction once no turn of it runs in this process (the only one)."""
        async with self._locks.hold_session(context_id, self.lock_timeout_seconds):
            return await self._w().write(lambda conn: whole_sessions.delete(conn, context_id))

    async def secret(self, name: str) -> bytes:
        """The secret ``name``, made on first use; a second process on the file reads the same one."""
        candidate = secrets.token_bytes(SECRET_BYTES)

        def work(conn: sqlite3.Connection) -> bytes:
            conn.execute(
                "INSERT INTO proxy_secrets (name, value, created_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING",
                (name, candidate, _now()),
            )
            return bytes(conn.execute("SELECT value FROM proxy_secrets WHERE name = ?", (name,)).fetchone()[0])

        return await self._w().write(work)

    async def calibration(self, route_key: str) -> Any | None:
        """The route's stored token calibration, or ``None``."""
        return await self._r().run(lambda conn: calibrations.read(conn, route_key))

    async def update_calibration(
        self, route_key: str, group: str, update: Callable[[Any | None], Any], keep: int | None = None
    ) -> Any:
        """Read, update and write the route's calibration under the one writer; trim the group to ``keep``."""
        pending = CalibrationUpdate(route_key, group, update, keep)
        return await self._w().write(lambda conn: calibrations.update(conn, pending, _now()))

    async def put_key(self, record: KeyRecord) -> None:
        """Store a new virtual key's row (its hash, never the key)."""

        def work(conn: sqlite3.Connection) -> None:
            try:
                conn.execute(
                    f"INSERT INTO virtual_keys ({key_rows.COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    key_rows.row_values(record),
                )
            except sqlite3.IntegrityError as exc:
                raise StoreError(f"key {record.key_id!r} exists already") from exc

        await self._w().write(work)

    async def key_by_hash(self, key_hash: str) -> KeyRecord | None:
        """The key whose current hash is ``key_hash``, or ``None``."""
        row = await self._r().run(
            lambda conn: conn.execute(
                f"SELECT {key_rows.COLUMNS} FROM virtual_keys WHERE key_hash = ?", (key_hash,)
            ).fetchone()
        )
        return None if row is None else key_rows.from_row(row)

    async def keys(self) -> list[KeyRecord]:
        """Every virtual key, oldest first."""
        rows = await self._r().run(
            lambda conn: conn.execute(
                f"SELECT {key_rows.COLUMNS} FROM virtual_keys ORDER BY created_at, key_id"
            ).fetchall()
        )
        return [key_rows.from_row(row) for row in rows]

    async def rotate_key(self, key_id: str, new_hash: str) -> bool:
        """Replace a live key's hash."""
        return await self._w().write(
            lambda conn: (
                conn.execute(
                    "UPDATE virtual_keys SET key_hash = ? WHERE key_id = ? AND revoked_at IS NULL", (new_hash, key_id)
                ).rowcount
                == 1
            )
        )

    async def revoke_key(self, key_id: str, revoked_at: str) -> bool:
        """Mark a live key revoked."""
        return await self._w().write(
            lambda conn: (
                conn.execute(
                    "UPDATE virtual_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL",
                    (revoked_at, key_id),
                ).rowcount
                == 1
            )
        )


def _reconcile(
    conn: sqlite3.Connection, context_id: str, scope: str, messages: Sequence[Mapping[str, Any]], hashes: list[str]
) -> Reconciliation:
    """Store the request's new suffix and tool bodies (inside the caller's transaction)."""
    now = _now()
    created = (
        conn.execute(
            "INSERT INTO sessions (context_id, scope, created_at, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (context_id) DO NOTHING",
            (context_id, scope, now, now),
        ).rowcount
        == 1
    )
    previous_head = conn.execute("SELECT head_hash FROM sessions WHERE context_id = ?", (context_id,)).fetchone()[0]

    # A few indexed point lookups instead of one set query over the whole history: in-process SQLite
    # answers each in microseconds, and a resent 1,000-message history no longer costs a JSON array of
    # its hashes and a join (PostgreSQL keeps the set query: there, every lookup is a round trip).
    def is_stored(chain_hash: str) -> bool:
        return (
            conn.execute(
                "SELECT 1 FROM messages WHERE context_id = ? AND chain_hash = ?", (context_id, chain_hash)
            ).fetchone()
            is not None
        )

    known = rc.stored_prefix_length(hashes, is_stored)
    forked = rc.fork_without_lookup(previous_head, hashes, known)
    if forked is None:
        forked = not _is_ancestor(conn, context_id, hashes[-1], previous_head, len(hashes) - 1)
    new: list[HistoryEntry] = []
    for row in rc.message_rows(messages, hashes, known):
        conn.execute(
            "INSERT INTO messages (context_id, chain_hash, parent_hash, position, message, tool_output_ref)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (context_id, row.chain_hash, row.parent_hash, row.position, row.message_json, row.tool_ref),
        )
        new.append(row.stored())
    conn.execute(
        "UPDATE sessions SET head_hash = ?, updated_at = ? WHERE context_id = ?", (hashes[-1], now, context_id)
    )
    return Reconciliation(context_id, hashes[-1], known, new, forked, created, tuple(hashes))


def _next_turn(conn: sqlite3.Connection, context_id: str) -> int:
    row = conn.execute(
        "UPDATE sessions SET turns = turns + 1 WHERE context_id = ? RETURNING turns", (context_id,)
    ).fetchone()
    if row is None:
        raise UnknownSession(context_id)
    return int(row[0])


def _put_state(conn: sqlite3.Connection, context_id: str, chain_hash: str, channel: str, value: Any) -> None:
    conn.execute(
        "INSERT INTO state_channels (context_id, chain_hash, channel, value) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (context_id, chain_hash, channel) DO UPDATE SET value = excluded.value",
        (context_id, chain_hash, channel, rc.json_text(value)),
    )


def _states_found(
    conn: sqlite3.Connection, context_id: str, chain: Sequence[str], channels: Sequence[str]
) -> dict[str, dict[str, Any]]:
    if not channels:
        return {}
    if len(chain) <= _SEEKS_UP_TO:
        rows = conn.execute(
            "SELECT channel, chain_hash, value FROM state_channels WHERE context_id = ?"
            " AND channel IN (SELECT value FROM json_each(?)) AND chain_hash IN (SELECT value FROM json_each(?))",
            (context_id, rc.json_text(list(channels)), rc.json_text(list(chain))),
        ).fetchall()
        return rc.states_found(rows)
    # A long chain: one index seek per prefix (a microsecond and a half each, a millisecond and more per
    # 1,000-message history) costs more than reading the session's state rows, which are written at a
    # few heads only (where a channel changed), and keeping those on the chain.
    on_chain = set(chain)
    rows = conn.execute(
        "SELECT channel, chain_hash, value FROM state_channels WHERE context_id = ?"
        " AND channel IN (SELECT value FROM json_each(?))",
        (context_id, rc.json_text(list(channels))),
    ).fetchall()
    return rc.states_found(row for row in rows if row[1] in on_chain)


_SEEKS_UP_TO = 256  # prefixes of a chain looked up one by one; beyond, the session's rows are read


def _checkpoints(conn: sqlite3.Connection, context_id: str) -> dict[str, dict[str, Any]]:
    rows = conn.execute(
        "SELECT covers_hash, checkpoint FROM checkpoints WHERE context_id = ? ORDER BY rowid", (context_id,)
    ).fetchall()
    return {covers: dict(rc.load_json(body)) for covers, body in rows}


def _is_ancestor(conn: sqlite3.Connection, context_id: str, candidate: str, head: str, position: int) -> bool:
    """Whether ``candidate`` (at ``position``) lies on the branch ending at ``head``."""
    row = conn.execute(
        _BRANCH_SQL + "SELECT 1 FROM branch WHERE position = :pos AND chain_hash = :cand",
        {"cid": context_id, "head": head, "pos": position, "cand": candidate},
    ).fetchone()
    return row is not None
