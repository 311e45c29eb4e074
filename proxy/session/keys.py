"""Virtual keys: how one is made and recognised, and the ``virtual_keys`` row both stores keep of it.

A key is ``sk-cp-`` and 32 random bytes (URL-safe base64); the store keeps only its SHA-256, so a copy
of the database lets no one in. A key is shown once, when it is made (or rotated).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from proxy.kernel.tenancy import check_team
from proxy.session.store import KeyRecord, SessionStore

KEY_PREFIX = "sk-cp-"
COLUMNS = "key_id, key_hash, team, alias, models, rpm, tpm, expires_at, created_at, revoked_at"


def new_key() -> str:
    """A fresh virtual key (shown once; store its ``hash_key``)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    """A fresh key id: how operators name a key, the same over rotations."""
    return "key-" + secrets.token_hex(8)


def hash_key(key: str) -> str:
    """The hex SHA-256 the store keeps instead of the key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def row_values(record: KeyRecord) -> tuple[Any, ...]:
    """The row of ``record`` in ``COLUMNS`` order (its models as a JSON list)."""
    return (
        record.key_id,
        record.key_hash,
        record.team,
        record.alias,
        json.dumps(list(record.models)),
        record.rpm,
        record.tpm,
        record.expires_at,
        record.created_at,
        record.revoked_at,
    )


def from_row(row: Mapping[str, Any] | tuple[Any, ...]) -> KeyRecord:
    """The record of a row read as ``SELECT {COLUMNS}``."""
    values = tuple(row.values()) if isinstance(row, Mapping) else tuple(row)
    key_id, key_hash, team, alias, models, rpm, tpm, expires_at, created_at, revoked_at = values
    return KeyRecord(
        key_id=key_id,
        key_hash=key_hash,
        team=team,
        alias=alias,
        models=tuple(json.loads(models)),
        rpm=rpm,
        tpm=tpm,
        expires_at=expires_at,
        created_at=created_at,
        revoked_at=revoked_at,
    )


_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def expiry(value: str, now: datetime) -> str:
    """When a key given ``--expires`` / ``duration`` stops: a duration (``30d``, ``12h``, ``90m``, ``45s``,
    litellm's form) after ``now``, or an ISO 8601 time; ``ValueError`` for anything else."""
    text = value.strip()
    if text[:-1].isdigit() and text[-1:] in _DURATION:
        return (now + timedelta(seconds=int(text[:-1]) * _DURATION[text[-1]])).isoformat()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"expiry {value!r} is neither a duration (30d, 12h, 90m, 45s) nor an ISO 8601 time") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC).isoformat()


def expired(record: KeyRecord, now: datetime) -> bool:
    """Has the key's expiry passed?"""
    return record.expires_at is not None and datetime.fromisoformat(record.expires_at) <= now


async def create_key(
    store: SessionStore,
    team: str,
    *,
    models: Sequence[str] = (),
    rpm: int | None = None,
    tpm: int | None = None,
    expires: str | None = None,
    alias: str | None = None,
) -> tuple[str, KeyRecord]:
    """Make and store a key for ``team``; returns the key (shown once) and its stored record.
    ``ValueError`` for a bad team name, limit or expiry."""
    check_team(team)
    for name, limit in (("rpm", rpm), ("tpm", tpm)):
        if limit is not None and limit < 1:
            raise ValueError(f"{name} must be a positive integer, got {limit}")
    now = datetime.now(UTC)
    key = new_key()
    record = KeyRecord(
        key_id=new_key_id(),
        key_hash=hash_key(key),
        team=team,
        alias=alias or None,
        models=tuple(dict.fromkeys(m for m in models if m)),
        rpm=rpm,
        tpm=tpm,
        expires_at=expiry(expires, now) if expires else None,
        created_at=now.isoformat(),
    )
    await store.put_key(record)
    return key, record


async def find_key(store: SessionStore, name: str) -> KeyRecord | None:
    """The key ``name`` names: its id, its alias, the key itself or its hash."""
    wanted = {name, hash_key(name)}
    for record in await store.keys():
        if record.key_id in wanted or record.key_hash in wanted or (record.alias is not None and record.alias == name):
            return record
    return None


async def rotate_key(store: SessionStore, key_id: str) -> str | None:
    """A new key for the live key ``key_id`` (same team and limits; the old key stops), or ``None``."""
    key = new_key()
    return key if await store.rotate_key(key_id, hash_key(key)) else None


async def revoke_key(store: SessionStore, key_id: str) -> bool:
    """Revoke the live key ``key_id``; ``False`` when there is none."""
    return await store.revoke_key(key_id, datetime.now(UTC).isoformat())
