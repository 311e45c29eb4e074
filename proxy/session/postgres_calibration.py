"""The PostgreSQL store's token calibrations (the ``token_calibration`` table, shared by every replica):
read one, update one with its row locked inside the caller's transaction (``update_calibration``, and
``begin_turn`` for the samples it carries)."""

from __future__ import annotations

from typing import Any

from proxy.session import reconcile as rc
from proxy.session.store import CalibrationUpdate


async def read(conn: Any, route_key: str) -> Any | None:
    """The route's stored calibration, or ``None``."""
    text = await conn.fetchval("SELECT state FROM token_calibration WHERE route_key = $1", route_key)
    return None if text is None else rc.load_json(text)


async def update(conn: Any, pending: CalibrationUpdate) -> Any:
    """Apply ``pending`` inside the caller's transaction, the route's row locked until it commits; trim the
    route's group to ``pending.keep``. Returns the new value."""
    key, group = pending.route_key, pending.group
    # The row exists before it is locked, so two replicas' first samples for a route take turns
    # instead of one overwriting the other.
    await conn.execute(
        "INSERT INTO token_calibration (route_key, route_group, state) VALUES ($1, $2, 'null'::json)"
        " ON CONFLICT (route_key) DO NOTHING",
        key,
        group,
    )
    text = await conn.fetchval("SELECT state FROM token_calibration WHERE route_key = $1 FOR UPDATE", key)
    value = pending.update(rc.load_json(text))
    await conn.execute(
        "UPDATE token_calibration SET state = $2::json, updated_at = clock_timestamp() WHERE route_key = $1",
        key,
        rc.json_text(value),
    )
    if pending.keep is not None:
        await conn.execute(
            "DELETE FROM token_calibration WHERE route_group = $1 AND route_key NOT IN ("
            " SELECT route_key FROM token_calibration WHERE route_group = $1"
            " ORDER BY updated_at DESC, route_key LIMIT $2)",
            group,
            pending.keep,
        )
    return value
