"""The registry: composed from factories, filtered by scope, unique IDs, frozen; entry-point discovery."""

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from proxy.context.registry import (
    ENTRY_POINT_GROUP,
    ContextContributorRegistry,
    FactorySource,
    RegistryError,
    RunRegistries,
    discover_factories,
)
from proxy.context.types import ContributionRequest, ContributorOutput, Scope


@dataclass
class Contributor:
    id: str
    scopes: frozenset[Scope] = frozenset({"main", "subagent", "reviewer"})
    protected: bool = False

    async def contribute(self, request: ContributionRequest) -> ContributorOutput:
        return ContributorOutput()


@dataclass
class Factory:
    id: str
    contributor_id: str = ""
    scopes: frozenset[Scope] = frozenset({"main", "subagent", "reviewer"})
    created: list[Scope] = field(default_factory=list)

    def create(self, scope: Scope) -> Contributor | None:
        self.created.append(scope)
        if scope == "reviewer" and self.id == "main-only":
            return None
        return Contributor(self.contributor_id or self.id, self.scopes)


def test_composes_in_order_and_filters_by_scope() -> None:
    factories = [Factory("identity"), Factory("plan", scopes=frozenset({"main"})), Factory("main-only")]
    reviewer = ContextContributorRegistry("reviewer", factories)
    assert [c.id for c in reviewer] == ["identity"]
    main = ContextContributorRegistry("main", factories)
    assert [c.id for c in main] == ["identity", "plan", "main-only"]
    assert len(main) == 3 and main.scope == "main"


def test_duplicate_factory_id_names_both_sources() -> None:
    factories = [FactorySource(Factory("plan"), "builtin plan"), FactorySource(Factory("plan"), "package acme-plan")]
    with pytest.raises(RegistryError, match=r"duplicate factory id 'plan'.*builtin plan.*package acme-plan"):
        ContextContributorRegistry("main", factories)


def test_duplicate_contributor_id_names_both_sources() -> None:
    factories = [Factory("a", contributor_id="same"), Factory("b", contributor_id="same")]
    with pytest.raises(RegistryError, match=r"duplicate contributor id 'same'.*factory 'a'.*factory 'b'"):
        ContextContributorRegistry("main", factories)


def test_malformed_ids_and_scope_are_rejected() -> None:
    with pytest.raises(RegistryError, match="factory id"):
        ContextContributorRegistry("main", [Factory("has space")])
    with pytest.raises(RegistryError, match="unknown scope"):
        ContextContributorRegistry("admin", [])  # type: ignore[arg-type]


def test_frozen_after_composition() -> None:
    registry = ContextContributorRegistry("main", [Factory("identity")])
    with pytest.raises(RegistryError, match="frozen"):
        registry._contributors = ()
    with pytest.raises(RegistryError, match="frozen"):
        registry.extra = 1  # type: ignore[attr-defined]
    with pytest.raises(RegistryError, match="frozen"):
        del registry._contributors
    assert isinstance(registry.contributors, tuple)
    assert [c.id for c in registry] == ["identity"]


def install_fake_distribution(root: Path, dist: str, entries: dict[str, str], module: str, code: str) -> None:
    (root / f"{module}.py").write_text(textwrap.dedent(code))
    info = root / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "\n".join(f"{name} = {target}" for name, target in entries.items())
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}\n")


FAKE_MODULE = """
from dataclasses import dataclass

@dataclass
class C:
    id: str
    scopes: frozenset = frozenset({"main"})
    protected: bool = False

    async def contribute(self, request):
        return {"attachments": [{"id": self.id + ".data", "source": "acme", "trust": "untrusted_data", "content": "x"}]}

class Factory:
    def __init__(self, name="acme"):
        self.id = name

    def create(self, scope):
        return C(self.id)

instance = Factory("acme-instance")
"""


def test_discovers_entry_points_with_allow_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_distribution(
        tmp_path,
        "acme_context",
        {"acme": "acme_ctx:Factory", "acme-instance": "acme_ctx:instance"},
        "acme_ctx",
        FAKE_MODULE,
    )
    install_fake_distribution(tmp_path, "other_pkg", {"other": "other_ctx:Factory"}, "other_ctx", FAKE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    everything = discover_factories(None)  # the built-in contributors are installed too
    fakes = [s for s in everything if "acme_context" in s.source or "other_pkg" in s.source]
    assert [s.factory.id for s in fakes] == ["acme", "acme-instance", "acme"]
    by_dist = discover_factories({"acme_context"})
    assert [s.factory.id for s in by_dist] == ["acme", "acme-instance"]
    assert "acme_context" in by_dist[0].source
    by_name = discover_factories({"acme-instance"})
    assert [s.factory.id for s in by_name] == ["acme-instance"]
    assert discover_factories(set()) == []
    # Two packages registering the same factory id: the registry refuses and names both.
    with pytest.raises(RegistryError, match=r"duplicate factory id 'acme'.*'acme'.*'other'"):
        ContextContributorRegistry("main", everything)


def test_entry_point_that_is_not_a_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_distribution(tmp_path, "bad_pkg", {"bad": "bad_ctx:thing"}, "bad_ctx", "def thing():\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RegistryError, match="not a ContextContributorFactory"):
        discover_factories({"bad"})


@dataclass
class Declaring(Contributor):
    priority: int = 100
    owns_client_instructions: bool = False


@dataclass
class DeclaringFactory:
    id: str
    contributor: Declaring

    def create(self, scope: Scope) -> Declaring:
        return self.contributor


def test_a_third_party_priority_is_held_below_the_built_in_projections() -> None:
    """A package declaring priority 0 is admitted no earlier than THIRD_PARTY_MIN_PRIORITY."""
    from proxy.context.types import THIRD_PARTY_MIN_PRIORITY

    own = FactorySource(DeclaringFactory("own", Declaring("own", priority=5)), "builtin")
    third = FactorySource(DeclaringFactory("pkg", Declaring("pkg", priority=0)), "pkg (dist)", may_protect=False)
    registry = ContextContributorRegistry("main", [own, third])
    assert registry.priority_of("own") == 5
    assert registry.priority_of("pkg") == THIRD_PARTY_MIN_PRIORITY > 10  # the plan and skill notice are 10
    with pytest.raises(RegistryError, match="priority must be an integer"):
        ContextContributorRegistry("main", [FactorySource(DeclaringFactory("x", Declaring("x", priority="1")), "x")])


def test_owning_the_client_instructions_is_declared_and_needs_protection() -> None:
    """The assembler no longer matches the id "identity": a protected contributor declares it."""
    renamed = Declaring("persona", protected=True, owns_client_instructions=True)
    assert ContextContributorRegistry("main", [DeclaringFactory("persona", renamed)]).owns_client_instructions
    unprotected = Declaring("identity", owns_client_instructions=True)
    assert not ContextContributorRegistry("main", [DeclaringFactory("identity", unprotected)]).owns_client_instructions
    package = FactorySource(DeclaringFactory("pkg", renamed), "pkg (dist)", may_protect=False)
    assert not ContextContributorRegistry("main", [package]).owns_client_instructions


@dataclass
class Tool:
    name: str
    schema: dict = field(default_factory=dict)
    needs_references: bool = False

    def offered(self, context: object) -> bool:
        return True

    async def run(self, context: object, arguments: str) -> str:
        return "ok"


@dataclass
class ToolFactory:
    id: str
    offers: list = field(default_factory=list)

    def create(self, scope: Scope) -> None:
        return None

    def tools(self, options: object) -> list:
        return self.offers


def test_contributed_tools_are_checked_and_named_once() -> None:
    from proxy.context.registry import proxy_tools

    a = FactorySource(ToolFactory("a", [Tool("lookup")]), "entry point 'a' (dist-a)")
    assert [t.name for t in proxy_tools([a])] == ["lookup"]
    b = FactorySource(ToolFactory("b", [Tool("lookup")]), "entry point 'b' (dist-b)")
    with pytest.raises(RegistryError, match=r"duplicate tool 'lookup': from entry point 'a' \(dist-a\) and entry"):
        proxy_tools([a, b])
    with pytest.raises(RegistryError, match="the proxy's own"):
        proxy_tools([FactorySource(ToolFactory("c", [Tool("read_tool_output")]), "c")])
    with pytest.raises(RegistryError, match="not a ProxyTool"):
        proxy_tools([FactorySource(ToolFactory("d", ["not a tool"]), "d")])


def test_options_are_validated_once_and_each_factory_gets_its_own() -> None:
    from pydantic import BaseModel, ConfigDict, Field

    from proxy.context.registry import OptionsInvalid, configure

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        limit: int = Field(3, gt=0)

    @dataclass
    class Typed(Factory):
        options_model: type = Options

    sources = configure([FactorySource(Typed("a"), "a"), FactorySource(Factory("b"), "b")], {"a": {"limit": 7}})
    registry = ContextContributorRegistry("main", sources)
    assert registry.options_of("a") == Options(limit=7) and dict(registry.options_of("b")) == {}
    with pytest.raises(OptionsInvalid, match=r"contributors\.a\.limit: Input should be greater than 0 \(got 0\)"):
        configure([FactorySource(Typed("a"), "a")], {"a": {"limit": 0}})
    with pytest.raises(OptionsInvalid, match=r"contributors\.a\.lmit: Extra inputs are not permitted"):
        configure([FactorySource(Typed("a"), "a")], {"a": {"lmit": 1}})
    with pytest.raises(OptionsInvalid, match=r"contributors\.c names no installed contributor"):
        configure([FactorySource(Typed("a"), "a")], {"c": {}})


def _run_registries(max_runs: int = 1024) -> tuple[RunRegistries, Factory]:
    factory = Factory("notes")
    return RunRegistries([FactorySource(factory, "test")], max_runs=max_runs), factory


def _instance(runs: RunRegistries, context_id: str, chain: list[str], scope: Scope = "main") -> object:
    return runs.for_run(scope, context_id, reversed(chain)).contributors[0]


def test_each_run_gets_its_own_instances_and_keeps_them_while_it_goes_on() -> None:
    runs, factory = _run_registries()
    assert len(factory.created) == 3  # composed once per scope at start-up, to check the packages
    a1 = _instance(runs, "session-a", ["a1"])
    b1 = _instance(runs, "session-b", ["b1"])
    assert a1 is not b1  # two sessions
    assert _instance(runs, "session-a", ["a1", "a2", "a3"]) is a1  # the run went on: its own instance
    assert _instance(runs, "session-b", ["b1", "b2", "b3"]) is b1
    assert _instance(runs, "session-a", ["a1", "a2", "a3", "a4", "a5"]) is a1
    assert _instance(runs, "session-a", ["a1", "a2", "a3"], scope="subagent") is not a1  # another scope
    assert all(runs("main").contributors[0] is not run for run in (a1, b1))  # the start-up one serves no run
    assert len(factory.created) == 3 + 3  # one per run and scope, created on its first turn


def test_two_branches_grown_from_one_head_never_share_an_instance() -> None:
    runs, _ = _run_registries()
    opening = _instance(runs, "s", ["h1"])
    left = _instance(runs, "s", ["h1", "left2", "left3"])
    right = _instance(runs, "s", ["h1", "right2", "right3"])
    assert left is opening and right is not left  # the first to go on takes it; the other gets its own
    assert _instance(runs, "s", ["h1", "left2", "left3", "left4", "left5"]) is left
    assert _instance(runs, "s", ["h1", "right2", "right3", "right4", "right5"]) is right
    other = _instance(runs, "other-session", ["h1", "left2", "left3", "left4", "left5"])
    assert other is not left and other is not right


def test_runs_are_bounded_the_least_recently_used_going_first() -> None:
    runs, _ = _run_registries(max_runs=2)
    a = _instance(runs, "a", ["a1"])
    b = _instance(runs, "b", ["b1"])
    assert _instance(runs, "a", ["a1", "a2", "a3"]) is a  # a used last: b is the idlest
    c = _instance(runs, "c", ["c1"])
    assert len(runs) == 2
    assert _instance(runs, "a", ["a1", "a2", "a3", "a4", "a5"]) is a
    assert _instance(runs, "b", ["b1", "b2", "b3"]) is not b  # evicted: a new instance, nothing else lost
    assert c is not a
