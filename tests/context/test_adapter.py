"""The adapter: a factory of the protocol form is seen through the declared bases, adapted once, and the
registry checks an adapted object's values with the same messages as before."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

import proxy.context
from proxy.context.adapter import ProtocolContributor, ProtocolFactory, adapt_contributor, adapt_factory
from proxy.context.collector import collect_detailed
from proxy.context.registry import (
    ContextContributorRegistry,
    FactorySource,
    OptionsInvalid,
    RegistryError,
    configure,
    proxy_tools,
    state_channels,
)
from proxy.context.types import (
    DEFAULT_PRIORITY,
    ContributionRequest,
    Contributor,
    ContributorFactory,
    ContributorOutput,
    Scope,
)

OUTPUT = {"attachments": [{"id": "plain.data", "source": "lims", "content": "x"}]}


class Plain:
    """A contributor of the protocol form with no optional member at all (not even ``protected``)."""

    id = "plain"
    scopes = ("main",)

    async def contribute(self, request: Any) -> dict[str, Any]:
        return OUTPUT


class PlainFactory:
    """A factory of the protocol form with ``id`` and ``create`` only."""

    def __init__(self, contributor: Any = None, fid: str = "plain") -> None:
        self.id = fid
        self.contributor = contributor if contributor is not None else Plain()

    def create(self, scope: str) -> Any:
        return self.contributor if scope == "main" else None


class Full:
    """A contributor of the protocol form declaring every optional member, none of them a default."""

    def __init__(self, **members: Any) -> None:
        self.id = "full"
        self.scopes = ("main",)
        self.protected = True
        self.priority = 7
        self.owns_client_instructions = True
        self.runs_inline = True
        self.__dict__.update(members)

    async def contribute(self, request: Any) -> dict[str, Any]:
        return {}


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    site: str = "lab"


class Tool:
    name = "lab_lookup"
    schema: dict[str, Any] = {"type": "function", "function": {"name": "lab_lookup"}}  # noqa: RUF012
    needs_references = False

    def offered(self, context: Any) -> bool:
        return True

    async def run(self, context: Any, arguments: str) -> str:
        return "ok"


class Channel:
    name = "lab"

    def initial(self) -> Any:
        return None

    def observe(self, value: Any, call: Any, result: Any, diagnose: Any) -> Any:
        return value

    def judge(self, value: Any, visible: Any) -> Any:
        return value


class FullFactory(PlainFactory):
    """A factory of the protocol form declaring every optional member."""

    options_model = Options

    def __init__(self, contributor: Any = None) -> None:
        super().__init__(contributor if contributor is not None else Full(), "full")
        self.validated: list[Any] = []

    def validate_options(self, raw: Any) -> None:
        self.validated.append(raw)

    def tools(self, options: Any) -> list[Tool]:
        return [Tool()]

    def channels(self, options: Any) -> Any:
        return iter([Channel()])  # any iterable, as the registry always accepted


def test_a_factory_without_optional_members_gets_the_declared_defaults() -> None:
    factory = adapt_factory(PlainFactory())
    assert isinstance(factory, ProtocolFactory) and factory.id == "plain"
    assert factory.options_model is None
    assert factory.validate_options({"anything": 1}) is None
    assert factory.tools({}) == () and factory.channels({}) == ()
    contributor = factory.create("main")
    assert isinstance(contributor, ProtocolContributor) and contributor.id == "plain"
    assert contributor.scopes == ("main",)
    assert contributor.protected is False and contributor.priority == DEFAULT_PRIORITY
    assert contributor.owns_client_instructions is False and contributor.runs_inline is False
    assert factory.create("reviewer") is None


def test_a_factory_with_every_optional_member_is_forwarded() -> None:
    wrapped = FullFactory()
    factory = adapt_factory(wrapped)
    assert factory.options_model is Options
    factory.validate_options({"site": "b2"})
    assert wrapped.validated == [{"site": "b2"}]
    assert [t.name for t in factory.tools({})] == ["lab_lookup"]
    assert [c.name for c in factory.channels({})] == ["lab"]
    contributor = factory.create("main")
    assert contributor is not None and contributor.id == "full"
    assert contributor.protected is True and contributor.priority == 7
    assert contributor.owns_client_instructions is True and contributor.runs_inline is True


async def test_the_output_is_handed_on_unchanged() -> None:
    """The collector validates the raw output and traces it as returned: the adapter must not convert it."""
    contributor = adapt_contributor(Plain())
    assert await contributor.contribute(ContributionRequest(scope="main", context_id="ctx")) is OUTPUT


class Declared(Contributor):
    id = "declared"
    scopes = ("main",)

    async def contribute(self, request: ContributionRequest) -> ContributorOutput:
        return ContributorOutput()


class DeclaredFactory(ContributorFactory):
    id = "declared"

    def __init__(self, contributor: Any = None) -> None:
        self.contributor = contributor if contributor is not None else Declared()

    def create(self, scope: Scope) -> Contributor | None:
        return self.contributor  # type: ignore[no-any-return]


def test_the_declared_forms_are_never_wrapped() -> None:
    factory = DeclaredFactory()
    assert adapt_factory(factory) is factory
    contributor = Declared()
    assert adapt_contributor(contributor) is contributor
    # A factory of the protocol form that creates a declared contributor: that one is taken as it is.
    assert adapt_factory(PlainFactory(contributor)).create("main") is contributor
    adapted = adapt_factory(PlainFactory())
    assert adapt_factory(adapted) is adapted


def test_a_factory_source_adapts_once() -> None:
    wrapped = PlainFactory()
    source = FactorySource(wrapped, "pkg")
    assert isinstance(source.factory, ProtocolFactory) and source.factory.wrapped is wrapped
    assert dataclasses.replace(source, options={"a": 1}).factory is source.factory
    # Sources of one factory compare equal, as before adaptation; the created contributors too.
    assert FactorySource(wrapped, "pkg") == source != FactorySource(PlainFactory(), "pkg")
    assert source.factory.create("main") == ProtocolFactory(wrapped).create("main")
    assert adapt_contributor(Plain()) != adapt_contributor(Plain())
    (configured,) = configure([source], {})
    assert configured.factory is source.factory
    registry = ContextContributorRegistry("main", [wrapped])  # a bare factory: adapted on the way in
    assert all(isinstance(c, Contributor) for c in registry) and [c.id for c in registry] == ["plain"]


async def test_a_registry_of_adapted_factories_composes_and_collects_as_before() -> None:
    registry = ContextContributorRegistry("main", [PlainFactory(), FullFactory()])
    assert [c.id for c in registry] == ["plain", "full"]
    assert registry.is_protected("full") and registry.owns_client_instructions
    assert registry.priority_of("plain") == DEFAULT_PRIORITY and registry.priority_of("full") == 7
    collection = await collect_detailed(registry, ContributionRequest(scope="main", context_id="ctx"))
    assert [(r.contributor_id, r.status) for r in collection.runs] == [("plain", "ok"), ("full", "ok")]
    assert collection.runs[0].raw_output == OUTPUT and [a.id for a in collection.attachments] == ["plain.data"]


@pytest.mark.parametrize("value", [1, "yes", None])
def test_only_a_real_true_grants_protection_or_the_client_instructions(value: Any) -> None:
    contributor = Full(protected=value, owns_client_instructions=value)
    registry = ContextContributorRegistry("main", [FullFactory(contributor)])
    assert not registry.is_protected("full") and not registry.owns_client_instructions


@pytest.mark.parametrize("value", ["1", 1.5, True, None])
def test_a_non_integer_priority_is_refused_naming_the_source(value: Any) -> None:
    source = FactorySource(FullFactory(Full(priority=value)), "entry point 'full' (lab-pkg)")
    with pytest.raises(RegistryError, match=r"contributor 'full' from entry point 'full' \(lab-pkg\): priority must"):
        ContextContributorRegistry("main", [source])


def test_a_declared_subclass_that_breaks_its_types_is_refused_too() -> None:
    """The registry checks values, not only mypy: a subclass that silenced mypy gets the same errors."""

    class Loud(Declared):
        priority = "high"  # type: ignore[assignment]

    with pytest.raises(RegistryError, match=r"contributor 'declared' from factory 'declared': priority must"):
        ContextContributorRegistry("main", [DeclaredFactory(Loud())])
    with pytest.raises(RegistryError, match=r"factory 'declared' from factory 'declared' created <.*Plain.*>, not a"):
        ContextContributorRegistry("main", [DeclaredFactory(Plain())])


def test_options_tools_and_channels_of_an_adapted_factory_are_checked_as_before() -> None:
    (typed,) = configure([FactorySource(FullFactory(), "full")], {"full": {"site": "b2"}})
    assert typed.options == Options(site="b2") and typed.factory.wrapped.validated == []  # type: ignore[attr-defined]
    with pytest.raises(OptionsInvalid, match=r"contributors\.full\.sit: Extra inputs are not permitted"):
        configure([FactorySource(FullFactory(), "full")], {"full": {"sit": "b2"}})

    class HandChecked(PlainFactory):
        options_model = "not a model"  # ignored, as it always was: the hand-written check runs instead

        def validate_options(self, raw: Any) -> None:
            if "site" in raw:
                raise ValueError("contributors.plain.site is not an option")

    (plain,) = configure([FactorySource(HandChecked(), "plain")], {"plain": {"depth": 2}})
    assert dict(plain.options) == {"depth": 2}
    with pytest.raises(OptionsInvalid, match=r"^contributors\.plain\.site is not an option$"):
        configure([FactorySource(HandChecked(), "plain")], {"plain": {"site": "b2"}})

    assert [t.name for t in proxy_tools([FactorySource(FullFactory(), "full")])] == ["lab_lookup"]
    assert [c.name for c in state_channels([FactorySource(FullFactory(), "full")])] == ["lab"]

    class Broken(PlainFactory):
        def tools(self, options: Any) -> Sequence[Any]:
            return ["not a tool"]

        def channels(self, options: Any) -> Sequence[Any]:
            return [42]

    with pytest.raises(RegistryError, match=r"^pkg offers 'not a tool', which is not a ProxyTool$"):
        proxy_tools([FactorySource(Broken(), "pkg")])
    with pytest.raises(RegistryError, match=r"^pkg declares 42, which is not a StateChannel$"):
        state_channels([FactorySource(Broken(), "pkg")])


MEMBERS = {"id", "create", "options_model", "validate_options", "tools", "channels"} | {
    "scopes",
    "contribute",
    "protected",
    "priority",
    "owns_client_instructions",
    "runs_inline",
}


def _lookups(code: str) -> list[str]:
    """``getattr``/``hasattr`` calls in ``code`` that name a member of the contributor contracts."""
    return [
        f"line {node.lineno}: {node.args[1].value}"
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and len(node.args) > 1
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value in MEMBERS
    ]


def test_the_registry_and_the_collector_look_up_no_member_by_name() -> None:
    """The contract is declared: only the adapter reads a plugin's members by name."""
    folder = Path(proxy.context.__file__).parent
    for name in ("registry.py", "collector.py"):
        assert _lookups((folder / name).read_text(encoding="utf-8")) == [], name
    # The scan finds what the registry used to do.
    assert _lookups('model = getattr(source.factory, "options_model", None)') == ["line 1: options_model"]
