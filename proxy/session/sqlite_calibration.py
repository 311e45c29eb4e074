"""The SQLite store's token calibrations (the ``token_calibration`` table): read one, update one inside the
caller's transaction (``update_calibration``, and ``begin_turn`` for the samples it carries)."""

from __future__ import annotations

import sqlite3
from typing import Any

from proxy.session import reconcile as rc
from proxy.session.store import CalibrationUpdate


def read(conn: sqlite3.Connection, route_key: str) -> Any | None:
    """The route's stored calibration, or ``None``."""
    row = conn.execute("SELECT state FROM token_calibration WHERE route_key = ?", (route_key,)).fetchone()
    return None if row is None else rc.load_json(row[0])


def update(conn: sqlite3.Connection, pending: CalibrationUpdate, now: str) -> Any:
    """Apply ``pending`` inside the caller's transaction (the store's one writer serializes them), stamped
    ``now``; trim the route's group to ``pending.keep``. Returns the new value."""
    key, group = pending.route_key, pending.group
    row = conn.execute("SELECT state FROM token_calibration WHERE route_key = ?", (key,)).fetchone()
    value = pending.update(None if row is None else rc.load_json(row[0]))
    conn.execute(
        "INSERT INTO token_calibration (route_key, route_group, state, updated_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (route_key) DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at",
        (key, group, rc.json_text(value), now),
    )
    if pending.keep is not None:
        conn.execute(
            "DELETE FROM token_calibration WHERE route_group = ? AND route_key NOT IN ("
            " SELECT route_key FROM token_calibration WHERE route_group = ?"
            " ORDER BY updated_at DESC, route_key LIMIT ?)",
            (group, group, pending.keep),
        )
    return value
