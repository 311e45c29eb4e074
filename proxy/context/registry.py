"""The run-scoped contributor registry: composed from factories, checked, filtered by scope, frozen.

A package registers a :class:`~proxy.context.types.ContributorFactory` (or a plain object of the
protocol form, :class:`~proxy.context.types.ContextContributorFactory`) under the entry-point group
``science_context.contributors``; built-ins use the same mechanism. A factory of the protocol form is
adapted once, as it enters a :class:`FactorySource` (``proxy/context/adapter.py``): the registry reads
the declared members of the bases only, and checks their values, since a package's annotations are
promises. Once composed the registry cannot change, so a package cannot alter an active run.

A registry is a run's own: :class:`RunRegistries` composes one per run (a session branch) and scope,
lazily, on the run's first turn in this process, and keeps it while the run is active, for at most
``MAX_RUNS`` runs (the least recently used goes first). A contributor's instance therefore never serves
two runs; and since any replica may serve a run's next turn, and a restart or an eviction makes a new
instance, a contributor keeps nothing in memory that it relies on across turns: what must last goes
through the store and its channels.

At start-up :func:`configure` validates each factory's part of the operator's ``contributors:`` config
once (against its ``options_model``), and :func:`proxy_tools` / :func:`state_channels` collect the
proxy-owned tools and run-state channels the loaded factories offer: what is not loaded (the
allow-list) offers nothing.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ValidationError

from proxy.context.adapter import adapt_factory
from proxy.context.types import (
    DEFAULT_PRIORITY,
    ID_PATTERN,
    SCOPES,
    THIRD_PARTY_MIN_PRIORITY,
    ContextContributorFactory,
    Contributor,
    ContributorFactory,
    ProxyTool,
    Scope,
    StateChannel,
)
from proxy.kernel.errors import ProxyError

ENTRY_POINT_GROUP = "science_context.contributors"
OWN_DISTRIBUTION = "science-context-proxy"
_ID = re.compile(ID_PATTERN)
_NO_OPTIONS: Mapping[str, Any] = MappingProxyType({})  # the options of a contributor given none: one read-only view


class RegistryError(ProxyError):
    """The registry is inconsistent (duplicate or malformed IDs) or was changed after freezing.

    A server-side configuration fault, not the client's: HTTP 500.
    """

    status = 500
    type = "api_error"
    code = "context_registry_error"


class OptionsInvalid(RegistryError):
    """The operator's ``contributors:`` config does not fit a contributor's options (start-up only)."""


# The one name a package cannot offer a tool under: the proxy's own reader, always there.
CORE_TOOLS = frozenset({"read_tool_output"})
RESERVED_CHANNELS = frozenset({"diagnostics"})


@dataclass(frozen=True, init=False)
class FactorySource:
    """A factory, where it came from (``builtin``, ``entry-point name (distribution)``...) and its options.

    Takes a factory of either form and holds a ``ContributorFactory``: one of the protocol form is adapted
    here, once (``dataclasses.replace`` hands the adapted one back in, which is taken as it is).
    """

    factory: ContributorFactory
    source: str
    # Protection is authority (protected sections are admitted first and never cut, and a failing
    # protected contributor fails the turn), so only the proxy's own contributors and factories the
    # operator composes in code may hold it; a third-party package's claim is not honoured. The same
    # source decides whether a declared priority may rank above THIRD_PARTY_MIN_PRIORITY.
    may_protect: bool
    # This factory's own options, as :func:`configure` validated them: an instance of its
    # ``options_model``, else a read-only mapping.
    options: Any

    def __init__(
        self,
        factory: ContributorFactory | ContextContributorFactory,
        source: str,
        may_protect: bool = True,
        options: Any = _NO_OPTIONS,
    ) -> None:
        object.__setattr__(self, "factory", adapt_factory(factory))
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "may_protect", may_protect)
        object.__setattr__(self, "options", options)


def configure(factories: Iterable[FactorySource], raw: Mapping[str, Any]) -> list[FactorySource]:
    """The factories with their options validated from the ``contributors:`` config section ``raw``.

    Raises :class:`OptionsInvalid` naming ``contributors.<id>`` (a section for no loaded contributor) or
    ``contributors.<id>.<field>`` with pydantic's reason and the bad value.
    """
    found = list(factories)
    ids = {source.factory.id for source in found}
    for contributor_id in raw:
        if contributor_id not in ids:
            raise OptionsInvalid(f"contributors.{contributor_id} names no installed contributor")
    return [dataclasses.replace(source, options=_options(source, raw.get(source.factory.id))) for source in found]


def _options(source: FactorySource, raw: Any) -> Any:
    fid = source.factory.id
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise OptionsInvalid(f"contributors.{fid} must be a mapping of options, got {raw!r}")
    # Declared ``type[BaseModel] | None``, checked anyway: anything else is ignored, as it always was.
    model: object = source.factory.options_model
    if isinstance(model, type) and issubclass(model, BaseModel):
        try:
            return model.model_validate(dict(raw))
        except ValidationError as exc:
            problems = "; ".join(
                f"contributors.{fid}.{'.'.join(str(part) for part in error['loc']) or '?'}: {error['msg']} "
                f"(got {error['input']!r})"
                for error in exc.errors()
            )
            raise OptionsInvalid(problems) from None
    try:
        source.factory.validate_options(raw)
    except ValueError as exc:
        raise OptionsInvalid(str(exc)) from None
    return MappingProxyType(dict(raw))


def proxy_tools(factories: Iterable[FactorySource]) -> list[ProxyTool]:
    """The proxy-owned tools the loaded factories offer, in registration order. A tool that does not
    keep the ``ProxyTool`` contract, a second tool of one name, or one named like a core tool is an
    error naming its source."""
    tools: list[ProxyTool] = []
    sources: dict[str, str] = {}
    for source in factories:
        # Declared ``ProxyTool``s, checked anyway: a package's annotations are promises only mypy holds it to.
        offered: Sequence[object] = source.factory.tools(source.options)
        for tool in offered:
            if not isinstance(tool, ProxyTool):
                raise RegistryError(f"{source.source} offers {tool!r}, which is not a ProxyTool")
            _check_id("tool name", tool.name, source.source)
            if tool.name in CORE_TOOLS:
                raise RegistryError(f"{source.source} offers a tool named {tool.name!r}, the proxy's own")
            if tool.name in sources:
                raise RegistryError(f"duplicate tool {tool.name!r}: from {sources[tool.name]} and {source.source}")
            sources[tool.name] = source.source
            tools.append(tool)
    return tools


def state_channels(factories: Iterable[FactorySource]) -> tuple[StateChannel, ...]:
    """The run-state channels the loaded factories declare, in registration order; a duplicate channel
    name is an error naming both sources."""
    channels: list[StateChannel] = []
    sources: dict[str, str] = {}
    for source in factories:
        declared: Sequence[object] = source.factory.channels(source.options)  # checked, as tools are
        for channel in declared:
            if not isinstance(channel, StateChannel):
                raise RegistryError(f"{source.source} declares {channel!r}, which is not a StateChannel")
            if channel.name in RESERVED_CHANNELS or channel.name in sources:
                first = sources.get(channel.name, "the proxy")
                raise RegistryError(f"duplicate state channel {channel.name!r}: from {first} and {source.source}")
            sources[channel.name] = source.source
            channels.append(channel)
    return tuple(channels)


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

    def __init__(
        self, scope: Scope, factories: Iterable[FactorySource | ContributorFactory | ContextContributorFactory]
    ) -> None:
        if scope not in SCOPES:
            raise RegistryError(f"unknown scope {scope!r}; expected one of {', '.join(SCOPES)}")
        self._scope: Scope = scope
        factory_sources: dict[str, str] = {}
        contributor_sources: dict[str, str] = {}
        contributors: list[Contributor] = []
        protected: set[str] = set()
        options: dict[str, Any] = {}
        priorities: dict[str, int] = {}
        owns_instructions = False
        for item in factories:
            entry = item if isinstance(item, FactorySource) else FactorySource(item, f"factory {item.id!r}")
            fid = entry.factory.id
            _check_id("factory", fid, entry.source)
            if fid in factory_sources:
                raise RegistryError(f"duplicate factory id {fid!r}: from {factory_sources[fid]} and {entry.source}")
            factory_sources[fid] = entry.source
            contributor = _create(entry, scope)
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
            # ``is True``: only a real ``True`` grants authority, whatever a package's value is.
            is_protected = entry.may_protect and contributor.protected is True
            if is_protected:
                protected.add(cid)
                owns_instructions |= contributor.owns_client_instructions is True
            # No options: one shared empty view, so the collector makes one request for all such contributors.
            empty = isinstance(entry.options, Mapping) and not entry.options
            options[cid] = _NO_OPTIONS if empty else entry.options
            priorities[cid] = _priority(contributor, entry)
        self._contributors = tuple(contributors)
        self._sources = dict(contributor_sources)
        self._protected = frozenset(protected)
        self._options = options
        self._priorities = priorities
        self._owns_instructions = owns_instructions
        self._frozen = True

    @property
    def scope(self) -> Scope:
        """The scope every contributor here serves."""
        return self._scope

    @property
    def contributors(self) -> tuple[Contributor, ...]:
        """The contributors, in registration order."""
        return self._contributors

    def is_protected(self, contributor_id: str) -> bool:
        """Whether the contributor is protected: it says so and its source may grant protection."""
        return contributor_id in self._protected

    def options_of(self, contributor_id: str) -> Any:
        """The contributor's own validated options (what its requests carry as ``options``)."""
        return self._options.get(contributor_id, _NO_OPTIONS)

    def priority_of(self, contributor_id: str) -> int:
        """The contributor's message-budget priority (lower is admitted first)."""
        return self._priorities.get(contributor_id, DEFAULT_PRIORITY)

    @property
    def owns_client_instructions(self) -> bool:
        """Whether a protected contributor renders the client's system/developer messages into the prompt."""
        return self._owns_instructions

    def source_of(self, contributor_id: str) -> str:
        """Where a contributor's factory came from (for error messages and traces)."""
        return self._sources[contributor_id]

    def __iter__(self) -> Iterator[Contributor]:
        return iter(self._contributors)

    def __len__(self) -> int:
        return len(self._contributors)

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_frozen", False):
            raise RegistryError(f"the contributor registry is frozen; cannot set {name!r}")
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        raise RegistryError(f"the contributor registry is frozen; cannot delete {name!r}")


# Runs whose registries one process keeps; a run evicted (idle longest) gets a new one on its next turn.
MAX_RUNS = 1024


class RunRegistries:
    """Each run's own registry of a scope, composed from the same factories (see the module docstring).

    A run is a session branch: it is found by the chain hash of the request that last used it (its head
    then), which the next request of that run contains. Each turn moves the run to its new head, so two
    branches that grew apart from one head never share it: the first to come takes it, the other gets its
    own. Called with a scope alone, it returns the registry composed at start-up (no run).
    """

    def __init__(self, factories: Iterable[FactorySource], max_runs: int = MAX_RUNS) -> None:
        self._factories = tuple(factories)
        # Composed now: a broken package (a duplicate ID, a bad priority) stops start-up, not a turn.
        self._composed = {scope: ContextContributorRegistry(scope, self._factories) for scope in SCOPES}
        self._runs: OrderedDict[tuple[str, Scope, str], ContextContributorRegistry] = OrderedDict()
        self._heads: dict[str, int] = {}  # the heads runs are kept at, and how many runs each
        self._max_runs = max_runs

    def __call__(self, scope: Scope) -> ContextContributorRegistry:
        """The registry of ``scope`` composed at start-up."""
        return self._composed[scope]

    def __len__(self) -> int:
        return len(self._runs)

    def for_run(self, scope: Scope, context_id: str, chain: Iterable[str]) -> ContextContributorRegistry:
        """The registry of the run whose request has ``chain`` (chain hashes, newest first): the one kept at
        the nearest of them, else a new one; kept at the request's head (the first) from now on."""
        found: ContextContributorRegistry | None = None
        head: str | None = None
        for chain_hash in chain:
            head = chain_hash if head is None else head
            if chain_hash in self._heads:
                found = self._runs.pop((context_id, scope, chain_hash), None)
                if found is not None:
                    self._forget(chain_hash)
                    break
        if found is None:
            found = ContextContributorRegistry(scope, self._factories)
        if head is not None:
            self._keep((context_id, scope, head), found)
        return found

    def _keep(self, key: tuple[str, Scope, str], registry: ContextContributorRegistry) -> None:
        if key in self._runs:  # an identical request: the same point of the same branch
            self._forget(key[2])
        self._runs[key] = registry
        self._heads[key[2]] = self._heads.get(key[2], 0) + 1
        while len(self._runs) > self._max_runs:
            (_, _, evicted), _ = self._runs.popitem(last=False)
            self._forget(evicted)

    def _forget(self, head: str) -> None:
        left = self._heads[head] - 1
        if left:
            self._heads[head] = left
        else:
            del self._heads[head]


Registries = Callable[[Scope], ContextContributorRegistry] | RunRegistries


def _create(entry: FactorySource, scope: Scope) -> Contributor | None:
    """The factory's contributor for ``scope`` (``None``: it stays out). Declared ``Contributor | None`` and
    checked: a subclass whose ``create`` broke its declared type is an error naming the source."""
    created: object = entry.factory.create(scope)
    if created is None or isinstance(created, Contributor):
        return created
    raise RegistryError(f"factory {entry.factory.id!r} from {entry.source} created {created!r}, not a Contributor")


def _priority(contributor: Contributor, entry: FactorySource) -> int:
    """The declared priority; a package's is held at or below ``THIRD_PARTY_MIN_PRIORITY`` so it can
    never rank above the proxy's plan projection and skill notice."""
    declared: object = contributor.priority  # declared ``int``, checked: a package's annotations are promises
    if not isinstance(declared, int) or isinstance(declared, bool):
        raise RegistryError(f"contributor {contributor.id!r} from {entry.source}: priority must be an integer")
    return declared if entry.may_protect else max(declared, THIRD_PARTY_MIN_PRIORITY)


def _check_id(kind: str, value: object, source: str) -> None:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise RegistryError(f"{kind} id {value!r} from {source} must match {ID_PATTERN}")
