"""Virtual keys in the store (``proxy/session/keys.py``), on SQLite and PostgreSQL: kept only as hashes,
found by hash, rotated and revoked, shared by replicas."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from proxy.session import keys
from proxy.session.postgres import PostgresSessionStore
from proxy.session.store import SessionStore, StoreError


async def _all_stored_text(store: SessionStore) -> str:
    """Every value of every table of the store, as text: what a copy of the database would give away."""
    if isinstance(store, PostgresSessionStore):
        conn = await asyncpg.connect(store.dsn)
        try:
            tables = await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", store.schema
            )
            rows = [await conn.fetch(f"SELECT * FROM {store.schema}.{t['table_name']}") for t in tables]
        finally:
            await conn.close()
        return repr([[dict(r) for r in table] for table in rows])
    path = store.path  # type: ignore[attr-defined]
    with sqlite3.connect(path) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return repr([conn.execute(f"SELECT * FROM {name}").fetchall() for name in names])


async def test_a_key_is_stored_only_as_its_hash_and_found_by_it(store: SessionStore) -> None:
    key, record = await keys.create_key(store, "acme", models=["m1", "m2"], rpm=5, tpm=1000, alias="ci")
    assert key.startswith(keys.KEY_PREFIX) and len(key) > 40
    found = await store.key_by_hash(keys.hash_key(key))
    assert found == record
    assert (found.team, found.models, found.rpm, found.tpm, found.alias) == ("acme", ("m1", "m2"), 5, 1000, "ci")
    text = await _all_stored_text(store)
    assert keys.hash_key(key) in text
    assert key not in text and key[len(keys.KEY_PREFIX) :] not in text  # never in clear
    assert await store.key_by_hash(keys.hash_key(key + "x")) is None


async def test_rotate_replaces_the_secret_and_revoke_stops_the_key(store: SessionStore) -> None:
    old, record = await keys.create_key(store, "acme")
    new = await keys.rotate_key(store, record.key_id)
    assert new is not None and new != old
    assert await store.key_by_hash(keys.hash_key(old)) is None
    rotated = await store.key_by_hash(keys.hash_key(new))
    assert rotated is not None and rotated.key_id == record.key_id and rotated.team == "acme"
    assert await keys.find_key(store, new) == rotated
    assert await keys.find_key(store, record.key_id) == rotated

    assert await keys.revoke_key(store, record.key_id)
    revoked = await store.key_by_hash(keys.hash_key(new))
    assert revoked is not None and revoked.revoked_at is not None
    assert not await keys.revoke_key(store, record.key_id)  # already revoked
    assert await keys.rotate_key(store, record.key_id) is None  # a revoked key is not brought back
    assert [k.key_id for k in await store.keys()] == [record.key_id]


async def test_a_duplicate_key_id_is_a_store_error(store: SessionStore) -> None:
    _, record = await keys.create_key(store, "acme")
    with pytest.raises(StoreError):
        await store.put_key(record)


@pytest.mark.parametrize(
    ("team", "kwargs"),
    [("Acme", {}), ("default", {}), ("a.b", {}), ("acme", {"rpm": 0}), ("acme", {"expires": "soon"})],
)
async def test_bad_teams_limits_and_expiries_are_refused_before_anything_is_stored(
    store: SessionStore, team: str, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(ValueError):
        await keys.create_key(store, team, **kwargs)
    assert await store.keys() == []


def test_expiry_reads_durations_and_iso_times() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert keys.expiry("30d", now) == (now + timedelta(days=30)).isoformat()
    assert keys.expiry("90m", now) == (now + timedelta(minutes=90)).isoformat()
    assert keys.expiry("2026-02-01T00:00:00", now) == "2026-02-01T00:00:00+00:00"


async def test_replicas_see_each_others_keys_and_revocations(backend: Any) -> None:
    a = await backend.open()
    b = await backend.open() if backend.name == "postgres" else a
    key, record = await keys.create_key(a, "acme")
    assert await b.key_by_hash(keys.hash_key(key)) == record
    await keys.revoke_key(b, record.key_id)
    seen = await a.key_by_hash(keys.hash_key(key))
    assert seen is not None and seen.revoked_at is not None
