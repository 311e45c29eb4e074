"""The run-scoped contributor registry: composed from factories, checked, filtered by scope, frozen.

A package registers a :class:`~proxy.context.types.ContextContributorFactory` under the entry-point
group ``science_context.contributors``; built-ins use the same mechanism. Once composed the registry
cannot change, so a package cannot alter an active run.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from proxy.context.types import ID_PATTERN, SCOPES, ContextContributor, ContextContributorFactory, Scope
from proxy.errors import ProxyError

ENTRY_POINT_GROUP = "science_context.contributors"
OWN_DISTRIBUTION = "science-context-proxy"
_ID = re.compile(ID_PATTERN)


class RegistryError(ProxyError):
    """The registry is inconsistent (duplicate or malformed IDs) or was changed after freezing.

    A server-side configuration fault, not the client's: HTTP 500.
    """

    status = 500
    type = "api_error"
    code = "context_registry_error"


@dataclass(frozen=True)
class FactorySource:
    """A factory and where it came from (``builtin``, ``entry-point name (distribution)``...)."""

    factory: ContextContributorFactory
    source: str
    # Protection is authority (protected sections are admitted first and never cut, and a failing
    # protected contributor fails the turn), so only the proxy's own contributors and factories the
    # operator composes in code may hold it; a third-party package's claim is not honoured.
    may_protect: bool = True


def discover_factories(allow: set[str] | None = None) -> list[FactorySource]:
    """Load the factories of the entry-point group, sorted by name for a stable order.

    ``allow`` is the allow-list: an entry point loads only if its name or its distribution's name is in
    it; ``None`` loads everything installed. An entry point may name a factory instance, a class or a
    zero-argument callable returning a factory.
    """
    found: list[FactorySource] = []
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = ep.dist.name if ep.dist is not None else ""
        if allow is not None and ep.name not in allow and dist not in allow:
            continue
        obj: Any = ep.load()
        factory = obj if isinstance(obj, ContextContributorFactory) and not isinstance(obj, type) else obj()
        if not isinstance(factory, ContextContributorFactory):
            raise RegistryError(f"entry point {ep.name!r} ({ep.value}) is not a ContextContributorFactory")
        source = f"entry point {ep.name!r} ({dist or 'unknown distribution'})"
        found.append(FactorySource(factory, source, may_protect=dist == OWN_DISTRIBUTION))
    return found


class ContextContributorRegistry:
    """The contributors of one run and scope, in registration order. Immutable once built."""

    def __init__(self, scope: Scope, factories: Iterable[FactorySource | ContextContributorFactory]) -> None:
        if scope not in SCOPES:
            raise RegistryError(f"unknown scope {scope!r}; expected one of {', '.join(SCOPES)}")
        self._scope: Scope = scope
        factory_sources: dict[str, str] = {}
        contributor_sources: dict[str, str] = {}
        contributors: list[ContextContributor] = []
        protected: set[str] = set()
        for item in factories:
            entry = item if isinstance(item, FactorySource) else FactorySource(item, f"factory {item.id!r}")
            fid = entry.factory.id
            _check_id("factory", fid, entry.source)
            if fid in factory_sources:
                raise RegistryError(f"duplicate factory id {fid!r}: from {factory_sources[fid]} and {entry.source}")
            factory_sources[fid] = entry.source
            contributor = entry.factory.create(scope)
            if contributor is None or scope not in contributor.scopes:
                continue
            cid = contributor.id
            _check_id("contributor", cid, entry.source)
            if cid in contributor_sources:
                raise RegistryError(
                    f"duplicate contributor id {cid!r}: from {contributor_sources[cid]} and {entry.source}"
                )
            contributor_sources[cid] = entry.source
            contributors.append(contributor)
            if entry.may_protect and bool(getattr(contributor, "protected", False)):
                protected.add(cid)
        self._contributors = tuple(contributors)
        self._sources = dict(contributor_sources)
        self._protected = frozenset(protected)
        self._frozen = True

    @property
    def scope(self) -> Scope:
        """The scope every contributor here serves."""
        return self._scope

    @property
    def contributors(self) -> tuple[ContextContributor, ...]:
        """The contributors, in registration order."""
        return self._contributors

    def is_protected(self, contributor_id: str) -> bool:
        """Whether the contributor is protected: it says so and its source may grant protection."""
        return contributor_id in self._protected

    def source_of(self, contributor_id: str) -> str:
        """Where a contributor's factory came from (for error messages and traces)."""
        return self._sources[contributor_id]

    def __iter__(self) -> Iterator[ContextContributor]:
        return iter(self._contributors)

    def __len__(self) -> int:
        return len(self._contributors)

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_frozen", False):
            raise RegistryError(f"the contributor registry is frozen; cannot set {name!r}")
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        raise RegistryError(f"the contributor registry is frozen; cannot delete {name!r}")


def _check_id(kind: str, value: object, source: str) -> None:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise RegistryError(f"{kind} id {value!r} from {source} must match {ID_PATTERN}")
