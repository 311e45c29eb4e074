"""Keys, the key cache and the rate limits (``proxy/ingress/tenants.py``) on a real SQLite store."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.ingress.tenants import PermissionDenied, RateLimited, SlidingMinute, Tenants
from proxy.kernel.config import ModelRoute
from proxy.kernel.errors import AuthenticationFailed
from proxy.kernel.tenancy import ADMIN
from proxy.session import keys
from proxy.session.sqlite import SqliteSessionStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    opened = SqliteSessionStore(tmp_path / "sessions.sqlite3")
    await opened.open()
    yield opened
    await opened.close()


async def test_a_revoked_key_is_served_from_the_cache_until_the_ttl_then_refused(store: SqliteSessionStore) -> None:
    clock = Clock()
    tenants = Tenants("master", lambda: store, cache_seconds=5, clock=clock)
    key, record = await keys.create_key(store, "alpha")
    bearer = {"authorization": f"Bearer {key}"}
    assert (await tenants.principal(bearer)).team == "alpha"
    await keys.revoke_key(store, record.key_id)  # as another replica would
    clock.now += 4.9
    assert (await tenants.principal(bearer)).team == "alpha"  # no store query within the bound
    clock.now += 0.2
    with pytest.raises(AuthenticationFailed):
        await tenants.principal(bearer)


async def test_the_master_key_unknown_keys_and_no_key(store: SqliteSessionStore) -> None:
    tenants = Tenants("master", lambda: store)
    assert await tenants.principal({"x-api-key": "master"}) == ADMIN
    for headers in ({}, {"authorization": "Bearer nope"}, {"x-api-key": keys.KEY_PREFIX + "unknown"}):
        with pytest.raises(AuthenticationFailed):
            await tenants.principal(headers)
    assert await Tenants(None, lambda: store).principal({}) == ADMIN  # no master key: loopback, no auth


async def test_models_and_request_rate_are_enforced_with_retry_after(store: SqliteSessionStore) -> None:
    clock = Clock()
    tenants = Tenants("master", lambda: store, clock=clock)
    key, _ = await keys.create_key(store, "alpha", models=["m1"], rpm=2)
    principal = await tenants.principal({"x-api-key": key})
    tenants.allow_model(principal, ModelRoute("m1", {"model": "m1"}))
    with pytest.raises(PermissionDenied):
        tenants.allow_model(principal, ModelRoute("m2", {"model": "m2"}))
    tenants.admit(principal)
    clock.now += 20
    tenants.admit(principal)
    with pytest.raises(RateLimited) as limited:
        tenants.admit(principal)
    assert limited.value.headers["retry-after"] == "40"  # when the first of the two leaves the minute
    clock.now += 40
    tenants.admit(principal)
    for _ in range(5):
        tenants.admit(ADMIN)  # the administrator has no limits


def test_a_sliding_minute_forgets_what_is_older_than_a_minute() -> None:
    minute = SlidingMinute()
    minute.add(0.0, 70)
    minute.add(30.0, 50)
    assert minute.used(59.0) == 120
    assert minute.retry_after(59.0, 100) == 1  # at 60 s the 70 leave: 50 < 100
    assert minute.retry_after(59.0, 40) == 31  # both must leave
    assert minute.used(60.0) == 50
