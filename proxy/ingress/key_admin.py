"""The key API, in the litellm proxy's shapes so operators moving from litellm keep their scripts:
``POST /key/generate``, ``POST /key/delete``, ``GET /key/info`` and ``POST /key/{key}/regenerate``.

Master key only. A key is returned once, by ``generate`` (and ``regenerate``); the store keeps its hash.
A field litellm knows but this proxy does not enforce (budgets, parallel-request caps, ...) is refused with
400 ``unsupported_parameter`` rather than accepted and silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.edge.answering import answering
from proxy.edge.request_reader import RequestReader
from proxy.ingress.tenants import Tenants
from proxy.kernel.errors import InvalidRequest, ProxyError
from proxy.kernel.jsonio import JSONAnswer
from proxy.session import keys
from proxy.session.store import KeyRecord, SessionStore, StoreError

_GENERATE_FIELDS = frozenset({"team_id", "models", "duration", "key_alias", "rpm_limit", "tpm_limit", "metadata"})


class KeyNotFound(ProxyError):
    """The key named is not one of this proxy's (404)."""

    status = 404
    type = "not_found_error"
    code = "key_not_found"


def key_info(record: KeyRecord) -> dict[str, Any]:
    """A key as ``/key/info`` and ``context-proxy keys list`` show it (never the key itself)."""
    return {
        "token": record.key_hash,
        "key_id": record.key_id,
        "key_alias": record.alias,
        "team_id": record.team,
        "models": list(record.models),
        "rpm_limit": record.rpm,
        "tpm_limit": record.tpm,
        "expires": record.expires_at,
        "created_at": record.created_at,
        "revoked_at": record.revoked_at,
    }


class KeyAdmin:
    """The key API's routes over the app's store, behind the master key."""

    def __init__(self, tenants: Tenants, store: Callable[[], SessionStore], reader: RequestReader) -> None:
        self._tenants = tenants
        self._store = store  # raises the 503 ``starting`` until the app has opened it
        self._reader = reader

    def routes(self) -> list[Route]:
        """``/key/generate``, ``/key/delete``, ``/key/info``, ``/key/{key}/regenerate``."""
        return [
            Route("/key/generate", answering(self.generate), methods=["POST"]),
            Route("/key/delete", answering(self.delete), methods=["POST"]),
            Route("/key/info", answering(self.info), methods=["GET"]),
            Route("/key/{key}/regenerate", answering(self.regenerate), methods=["POST"]),
        ]

    async def _body(self, request: Request) -> Mapping[str, Any]:
        await self._tenants.administrator(request.headers, request.client.host if request.client else None)
        body = await self._reader.json(request)
        if not isinstance(body, dict):
            raise InvalidRequest("The body must be a JSON object.")
        return body

    async def generate(self, request: Request) -> Response:
        """``POST /key/generate``: a new key for ``team_id`` (shown once)."""
        body = await self._body(request)
        unknown = sorted(set(body) - _GENERATE_FIELDS)
        if unknown:
            raise InvalidRequest(
                f"{unknown[0]!r} is not supported by this proxy's keys "
                f"(supported: {', '.join(sorted(_GENERATE_FIELDS))}).",
                param=unknown[0],
                code="unsupported_parameter",
            )
        team = body.get("team_id")
        if not isinstance(team, str) or not team:
            raise InvalidRequest("team_id is required: every key belongs to a team.", param="team_id")
        models = body.get("models") or []
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise InvalidRequest("models must be a list of model names.", param="models")
        for name in ("rpm_limit", "tpm_limit"):
            value = body.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise InvalidRequest(f"{name} must be a positive integer.", param=name)
        for name in ("duration", "key_alias"):
            if body.get(name) is not None and not isinstance(body.get(name), str):
                raise InvalidRequest(f"{name} must be a string.", param=name)
        store = self._store()
        try:
            key, record = await keys.create_key(
                store,
                team,
                models=models,
                rpm=body.get("rpm_limit"),
                tpm=body.get("tpm_limit"),
                expires=body.get("duration"),
                alias=body.get("key_alias"),
            )
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from exc
        except StoreError as exc:
            raise ProxyError(str(exc), status=409, type="conflict_error", code="key_exists") from exc
        return JSONAnswer({"key": key, "key_name": _shown(key), **key_info(record)})

    async def delete(self, request: Request) -> Response:
        """``POST /key/delete``: revoke ``keys`` (keys, their hashes or ids) or ``key_aliases``; all or none."""
        body = await self._body(request)
        names = [*(body.get("keys") or []), *(body.get("key_aliases") or [])]
        if not names or not all(isinstance(n, str) for n in names):
            raise InvalidRequest("Name the keys to delete: keys or key_aliases, a list of strings.", param="keys")
        store = self._store()
        found = []
        for name in names:
            record = await keys.find_key(store, name)
            if record is None or record.revoked_at is not None:
                raise KeyNotFound(f"No live key {_shown(name)!r}: nothing was deleted.", param="keys")
            found.append(record)
        for record in found:
            await keys.revoke_key(store, record.key_id)
            self._tenants.keys.forget(record.key_hash)
        return JSONAnswer({"deleted_keys": names})

    async def info(self, request: Request) -> Response:
        """``GET /key/info?key=...``: what is stored about a key (not the key)."""
        await self._tenants.administrator(request.headers, request.client.host if request.client else None)
        name = request.query_params.get("key", "")
        if not name:
            raise InvalidRequest("Name the key: /key/info?key=<key, its hash, id or alias>.", param="key")
        record = await keys.find_key(self._store(), name)
        if record is None:
            raise KeyNotFound(f"No key {_shown(name)!r}.", param="key")
        return JSONAnswer({"key": record.key_hash, "info": key_info(record)})

    async def regenerate(self, request: Request) -> Response:
        """``POST /key/{key}/regenerate``: a new key for the same team and limits; the old one stops."""
        await self._tenants.administrator(request.headers, request.client.host if request.client else None)
        store = self._store()
        record = await keys.find_key(store, request.path_params["key"])
        key = None if record is None else await keys.rotate_key(store, record.key_id)
        if record is None or key is None:
            raise KeyNotFound("No live key by that name.", param="key")
        self._tenants.keys.forget(record.key_hash)
        rotated = await store.key_by_hash(keys.hash_key(key))
        assert rotated is not None  # just written
        return JSONAnswer({"key": key, "key_name": _shown(key), **key_info(rotated)})


def _shown(name: str) -> str:
    """A key as it may be shown: its first characters only."""
    return name[:10] + "..." if name.startswith(keys.KEY_PREFIX) else name
