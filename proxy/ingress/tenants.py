"""Who a request is and what it may do: the master key or a team's virtual key, the key's models, and its
request and token rate limits.

A virtual key is looked up in the store by its hash once, then served from a cache for
``CONTEXT_PROXY_KEY_CACHE_SECONDS`` (5 s): the hot path costs no store query, and a key revoked on one
replica stops on every replica within that bound. An unknown key is cached as unknown for the same time,
so a stream of bad keys costs one query per key and bound, not one per request.

Rate limits are a sliding minute per key, kept in this process: requests are counted when admitted,
tokens (what the proxy sent to the provider: the provider's ``prompt_tokens``, else the proxy's estimate)
when a model call ends, through the observer port. A request is refused (429 with ``retry-after``) before
its turn begins, so nothing of it is stored and the provider is not called.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from proxy.edge.auth import is_key, presented_key
from proxy.kernel.config import ModelRoute
from proxy.kernel.errors import AuthenticationFailed, InvalidRequest, ProxyError
from proxy.kernel.tenancy import ADMIN, Limits, Principal, check_team
from proxy.runtime.assembly import TurnRequest
from proxy.runtime.trace_record import CallRecord
from proxy.session.keys import KEY_PREFIX, expired, hash_key
from proxy.session.store import KeyRecord, SessionStore

WINDOW_SECONDS = 60.0
_MAX_CACHED = 10_000  # keys remembered at once (known and unknown); expired entries go first


class PermissionDenied(ProxyError):
    """The key may not use what it asked for (403)."""

    status = 403
    type = "permission_error"
    code = "model_not_allowed"


class RateLimited(ProxyError):
    """The key's request or token rate limit is used up for now (429, with ``retry-after``)."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class KeyCache:
    """Virtual keys by hash, each read from the store at most once per ``ttl_seconds``."""

    def __init__(
        self, store: Callable[[], SessionStore], ttl_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._store = store
        self._ttl = ttl_seconds
        self._clock = clock
        self._entries: dict[str, tuple[float, KeyRecord | None]] = {}

    async def get(self, key_hash: str) -> KeyRecord | None:
        """The stored key (revoked or expired ones included), at most ``ttl_seconds`` old; ``None`` if unknown."""
        now = self._clock()
        cached = self._entries.get(key_hash)
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        record = await self._store().key_by_hash(key_hash)
        if len(self._entries) >= _MAX_CACHED:
            self._entries = {h: e for h, e in self._entries.items() if now - e[0] < self._ttl}
            if len(self._entries) >= _MAX_CACHED:
                self._entries.clear()
        self._entries[key_hash] = (now, record)
        return record

    def forget(self, key_hash: str) -> None:
        """Drop a key this process changed (rotated, revoked): here it stops at once, elsewhere within the TTL."""
        self._entries.pop(key_hash, None)

    def cached(self, key_hash: str) -> KeyRecord | None:
        """The cached record of a hash, however old (no store query): for the usage observer."""
        entry = self._entries.get(key_hash)
        return None if entry is None else entry[1]


class SlidingMinute:
    """Amounts over the last minute: what is used, and when enough will have expired to allow more."""

    def __init__(self) -> None:
        self._events: deque[tuple[float, int]] = deque()
        self.total = 0

    def _expire(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - WINDOW_SECONDS:
            self.total -= self._events.popleft()[1]

    def used(self, now: float) -> int:
        """The amount counted within the last minute."""
        self._expire(now)
        return self.total

    def add(self, now: float, amount: int) -> None:
        """Count ``amount`` now."""
        if amount > 0:
            self._events.append((now, amount))
            self.total += amount

    def retry_after(self, now: float, limit: int) -> int:
        """Whole seconds until the amount used falls below ``limit`` (at least 1)."""
        self._expire(now)
        total = self.total
        for stamp, amount in self._events:
            total -= amount
            if total < limit:
                return max(1, math.ceil(stamp + WINDOW_SECONDS - now))
        return 1


class Tenants:
    """Authentication and the per-key limits of one app; its ``observer`` counts what each key sent."""

    def __init__(
        self,
        master_key: str | None,
        store: Callable[[], SessionStore],
        cache_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        gateway: Gateway | None = None,
    ) -> None:
        self._master = master_key
        self._gateway = gateway
        self.keys = KeyCache(store, cache_seconds, clock)
        self._clock = clock
        self._requests: dict[str, SlidingMinute] = {}
        self._tokens: dict[str, SlidingMinute] = {}

    async def principal(self, headers: Mapping[str, str], peer: str | None = None) -> Principal:
        """Who sent the request: the team an authenticating gateway names (``Gateway``), the administrator
        (the master key, or anyone without a key when none is set) or a live virtual key's team;
        ``AuthenticationFailed`` for anything else. ``peer``: the address the request came from."""
        if self._gateway is not None:
            team = self._gateway.team(headers, peer)
            if team is not None:
                return Principal(team, f"gateway:{team}")
        return await self.resolve(presented_key(headers))

    async def resolve(self, given: str) -> Principal:
        """The principal of a presented key (``principal`` without the headers)."""
        if is_key(given, self._master):
            return ADMIN
        if given.startswith(KEY_PREFIX):
            return await self.by_hash(hash_key(given))
        if self._master is None:
            return ADMIN  # no master key: the operator serves loopback only, or authenticates in front
        raise AuthenticationFailed("Missing or invalid API key: send Authorization: Bearer <key> or x-api-key: <key>.")

    async def by_hash(self, key_hash: str) -> Principal:
        """The team principal of the live virtual key with this hash; ``AuthenticationFailed`` for any other."""
        record = await self.keys.get(key_hash)
        if record is None or record.revoked_at is not None or expired(record, datetime.now(UTC)):
            raise AuthenticationFailed("Invalid, revoked or expired API key.")
        return Principal(record.team, record.key_id, Limits(record.models, record.rpm, record.tpm))

    async def administrator(self, headers: Mapping[str, str], peer: str | None = None) -> None:
        """Pass the master key only: a team's key gets 403 (the key API, ``/metrics``)."""
        if not (await self.principal(headers, peer)).admin:
            raise ProxyError("This needs the master key.", status=403, type="permission_error", code="admin_only")

    def allow_model(self, principal: Principal, route: ModelRoute) -> None:
        """403 when the key's model list does not name the route (an empty list allows every model)."""
        models = principal.limits.models
        if models and route.model_name not in models:
            raise PermissionDenied(
                f"This key may not use the model {route.model_name!r} (it may use: {', '.join(models)}).",
                param="model",
            )

    def admit(self, principal: Principal) -> None:
        """Count one request against the key's limits, or refuse it with 429 and ``retry-after`` (before
        anything of it is stored or sent). The administrator has no limits."""
        limits, key_id = principal.limits, principal.key_id
        if key_id is None or (limits.rpm is None and limits.tpm is None):
            return
        now = self._clock()
        requests = self._requests.setdefault(key_id, SlidingMinute())
        if limits.rpm is not None and requests.used(now) >= limits.rpm:
            raise self._limited(f"{limits.rpm} requests per minute", requests.retry_after(now, limits.rpm))
        tokens = self._tokens.get(key_id)
        if limits.tpm is not None and tokens is not None and tokens.used(now) >= limits.tpm:
            raise self._limited(f"{limits.tpm} tokens per minute", tokens.retry_after(now, limits.tpm))
        requests.add(now, 1)

    @staticmethod
    def _limited(what: str, seconds: int) -> RateLimited:
        return RateLimited(
            f"Rate limit reached for this key: {what}. Try again in {seconds} s.",
            headers={"retry-after": str(seconds)},
        )

    # -- the observer port: what each key's model calls sent ----------------------------------------------

    def model_call(self, record: CallRecord) -> None:
        """Count the tokens a finished model call sent against its key's token limit."""
        given = presented_key(record.request.headers)
        if not given.startswith(KEY_PREFIX):
            return
        key = self.keys.cached(hash_key(given))
        if key is None or key.tpm is None:
            return
        self._tokens.setdefault(key.key_id, SlidingMinute()).add(self._clock(), sent_tokens(record))

    def proxy_tool_calls(self, request: TurnRequest, tools: Sequence[str]) -> None:
        """Proxy-owned tools cost the provider nothing by themselves."""


class Gateway:
    """The team header of an authenticating gateway in front (``CONTEXT_PROXY_TEAM_HEADER``): believed only
    with the gateway's shared secret (as ``x-context-proxy-gateway-secret``) or from the networks named."""

    SECRET_HEADER = "x-context-proxy-gateway-secret"  # a credential's name: never recorded, traced or shown

    def __init__(self, header: str, secret: str | None, networks: Sequence[str]) -> None:
        self.header = header
        self._secret = secret
        self._networks = [ipaddress.ip_network(n, strict=False) for n in networks]

    def team(self, headers: Mapping[str, str], peer: str | None) -> str | None:
        """The team the request's header names (``None`` without one); 401 when the header is not the
        gateway's, 400 for a name that is not a team's."""
        named = headers.get(self.header, "").strip()
        if not named:
            return None
        if not (is_key(headers.get(self.SECRET_HEADER, "").strip(), self._secret) or self._trusted(peer)):
            raise AuthenticationFailed(f"{self.header} is accepted only from the gateway in front of this proxy.")
        try:
            return check_team(named)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param=self.header) from None

    def _trusted(self, peer: str | None) -> bool:
        if peer is None:
            return False
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in network for network in self._networks)


def sent_tokens(record: CallRecord) -> int:
    """What a model call sent the provider: its own ``prompt_tokens``, else the proxy's estimate."""
    usage = record.usage or {}
    reported = usage.get("prompt_tokens", usage.get("input_tokens"))
    if isinstance(reported, int) and reported >= 0:
        return reported
    candidate = record.candidate
    pipeline = candidate.record.pipeline if candidate is not None and candidate.record is not None else None
    if pipeline is not None and record.request.mode == "dynamic":
        return pipeline.estimated_tokens
    return record.client_tokens
