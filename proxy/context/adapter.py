"""The path for factories written to the protocol form: adapted once to the declared bases.

A package need not import the proxy: a plain class with ``id`` and ``create``, and any of the optional
members (``ContextContributorFactory``, docs/contributors.md), is a factory. The registry adapts such an
object once, when it is discovered or handed in, into a :class:`ProtocolFactory`, a ``ContributorFactory``
that forwards to it; each contributor it creates becomes a :class:`ProtocolContributor` the same way. From
then on the registry and the collector see the declared types only.

An optional member the object lacks takes the base's default; one it has is forwarded as it is, and the
registry checks the value at composition exactly as it checks a subclass's (a non-integer ``priority``, a
tool that is not a ``ProxyTool``...): the checks stay where the source of the factory is known, so their
messages name it. A ``ContributorFactory`` or ``Contributor`` is never wrapped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from proxy.context.types import (
    DEFAULT_PRIORITY,
    ContextContributor,
    ContextContributorFactory,
    ContributionRequest,
    Contributor,
    ContributorFactory,
    ContributorOutput,
    ProxyTool,
    Scope,
    StateChannel,
)

_T = TypeVar("_T")


def adapt_factory(factory: ContributorFactory | ContextContributorFactory) -> ContributorFactory:
    """``factory`` as a ``ContributorFactory``: itself when it is one, else a :class:`ProtocolFactory`."""
    return factory if isinstance(factory, ContributorFactory) else ProtocolFactory(factory)


def adapt_contributor(contributor: Contributor | ContextContributor) -> Contributor:
    """``contributor`` as a ``Contributor``: itself when it is one, else a :class:`ProtocolContributor`."""
    return contributor if isinstance(contributor, Contributor) else ProtocolContributor(contributor)


def _declared(obj: object, name: str, default: _T) -> _T:
    """``obj``'s optional member ``name``, or ``default`` when it has none. Not checked here: the registry
    checks what it relies on, for an adapted object and a subclass alike."""
    value: _T = getattr(obj, name, default)
    return value


class ProtocolFactory(ContributorFactory):
    """A factory written to the protocol form, seen as a ``ContributorFactory``: every member forwards to it."""

    def __init__(self, wrapped: ContextContributorFactory) -> None:
        self.wrapped = wrapped

    @property
    def id(self) -> str:
        """The wrapped factory's ``id``."""
        return self.wrapped.id

    def create(self, scope: Scope) -> Contributor | None:
        """The wrapped factory's contributor for ``scope``, adapted; ``None`` when it stays out."""
        created = self.wrapped.create(scope)
        return None if created is None else adapt_contributor(created)

    @property
    def options_model(self) -> type[BaseModel] | None:
        """The wrapped factory's ``options_model``, ``None`` when it has none."""
        model: type[BaseModel] | None = _declared(self.wrapped, "options_model", None)
        return model

    def validate_options(self, raw: Mapping[str, Any]) -> None:
        """The wrapped factory's ``validate_options(raw)``, when it has one."""
        validate: Callable[[Mapping[str, Any]], object] | None = _declared(self.wrapped, "validate_options", None)
        if validate is not None:
            validate(raw)

    def tools(self, options: Any) -> Sequence[ProxyTool]:
        """The wrapped factory's ``tools(options)`` (any iterable, read once), none when it has no ``tools``."""
        offer: Callable[[Any], Iterable[ProxyTool]] | None = _declared(self.wrapped, "tools", None)
        return tuple(offer(options)) if offer is not None else ()

    def channels(self, options: Any) -> Sequence[StateChannel]:
        """The wrapped factory's ``channels(options)`` (any iterable, read once), none when it has no ``channels``."""
        declare: Callable[[Any], Iterable[StateChannel]] | None = _declared(self.wrapped, "channels", None)
        return tuple(declare(options)) if declare is not None else ()

    def __repr__(self) -> str:
        return f"ProtocolFactory({self.wrapped!r})"

    # Equal when the wrapped objects are: a FactorySource compares as it did before adaptation.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProtocolFactory) and bool(self.wrapped == other.wrapped)

    def __hash__(self) -> int:
        return hash(self.wrapped)


class ProtocolContributor(Contributor):
    """A contributor written to the protocol form, seen as a ``Contributor``: every member forwards to it."""

    def __init__(self, wrapped: ContextContributor) -> None:
        self.wrapped = wrapped

    @property
    def id(self) -> str:
        """The wrapped contributor's ``id``."""
        return self.wrapped.id

    @property
    def scopes(self) -> frozenset[Scope] | Sequence[Scope]:
        """The wrapped contributor's ``scopes``."""
        return self.wrapped.scopes

    @property
    def protected(self) -> bool:
        """The wrapped contributor's ``protected``, ``False`` when it has none."""
        return _declared(self.wrapped, "protected", False)

    @property
    def priority(self) -> int:
        """The wrapped contributor's ``priority``, ``DEFAULT_PRIORITY`` when it has none."""
        return _declared(self.wrapped, "priority", DEFAULT_PRIORITY)

    @property
    def owns_client_instructions(self) -> bool:
        """The wrapped contributor's ``owns_client_instructions``, ``False`` when it has none."""
        return _declared(self.wrapped, "owns_client_instructions", False)

    @property
    def runs_inline(self) -> bool:
        """The wrapped contributor's ``runs_inline``, ``False`` when it has none."""
        return _declared(self.wrapped, "runs_inline", False)

    async def contribute(self, request: ContributionRequest) -> ContributorOutput | Mapping[str, Any]:
        """The wrapped contributor's output, unchanged (the collector validates it and traces it raw)."""
        return await self.wrapped.contribute(request)

    def __repr__(self) -> str:
        return f"ProtocolContributor({self.wrapped!r})"

    # Equal when the wrapped objects are: a FactorySource compares as it did before adaptation.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProtocolContributor) and bool(self.wrapped == other.wrapped)

    def __hash__(self) -> int:
        return hash(self.wrapped)
