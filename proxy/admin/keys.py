"""``context-proxy keys create | list | rotate | revoke``: the teams' virtual keys, in the store ``serve`` uses.

A key is printed once, on standard output, when it is made or rotated; the store keeps only its hash.
On SQLite the store is one process's: stop the proxy first, or use the key API of the running proxy
(``POST /key/generate``, ``docs/tenants.md``). On PostgreSQL the command runs beside the replicas, and a
revoked key stops on every replica within ``CONTEXT_PROXY_KEY_CACHE_SECONDS``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from proxy.admin.sessions import with_store
from proxy.kernel.config import ConfigError, Settings
from proxy.session import keys
from proxy.session.store import KeyRecord, SessionStore

UNKNOWN = 1  # exit code: no live key by that name


def create_key(
    settings: Settings,
    team: str,
    models: Sequence[str],
    rpm: int | None,
    tpm: int | None,
    expires: str | None,
    alias: str | None,
) -> int:
    """Make a key for ``team`` and print it (the only time it is shown)."""

    async def work(store: SessionStore) -> tuple[str, KeyRecord]:
        return await keys.create_key(store, team, models=models, rpm=rpm, tpm=tpm, expires=expires, alias=alias)

    try:
        made = with_store(settings, work, create=True)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    assert made is not None  # create=True opens (or makes) the store
    key, record = made
    print(key)
    print(f"created {record.key_id} for team {record.team}: {_limits(record)} (the key is shown once)", file=sys.stderr)
    return 0


def list_keys(settings: Settings) -> int:
    """Print each key: id, team, alias, models, limits, expiry, whether it is live (never the key)."""
    found: list[KeyRecord] = with_store(settings, lambda store: store.keys()) or []
    for record in found:
        state = f"revoked {record.revoked_at}" if record.revoked_at else "live"
        print(f"{record.key_id}\t{record.team}\t{record.alias or '-'}\t{_limits(record)}\t{state}")
    if not found:
        print("no keys", file=sys.stderr)
    return 0


def rotate_key(settings: Settings, name: str) -> int:
    """Give the key ``name`` (its id, alias, the key or its hash) a new secret and print it; the old one stops."""

    async def work(store: SessionStore) -> str | None:
        record = await keys.find_key(store, name)
        return None if record is None else await keys.rotate_key(store, record.key_id)

    key = with_store(settings, work)
    if key is None:
        print(f"context-proxy keys rotate: no live key {name!r}", file=sys.stderr)
        return UNKNOWN
    print(key)
    return 0


def revoke_key(settings: Settings, name: str) -> int:
    """Revoke the key ``name``: it stops on every replica within the key cache's bound."""

    async def work(store: SessionStore) -> bool:
        record = await keys.find_key(store, name)
        return record is not None and await keys.revoke_key(store, record.key_id)

    if not with_store(settings, work):
        print(f"context-proxy keys revoke: no live key {name!r}", file=sys.stderr)
        return UNKNOWN
    print(f"revoked {name}", file=sys.stderr)
    return 0


def _limits(record: KeyRecord) -> str:
    models = ",".join(record.models) or "all models"
    rpm = f"{record.rpm} rpm" if record.rpm else "no rpm limit"
    tpm = f"{record.tpm} tpm" if record.tpm else "no tpm limit"
    return f"{models}\t{rpm}\t{tpm}\texpires {record.expires_at or 'never'}"
