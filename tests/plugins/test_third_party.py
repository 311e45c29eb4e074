"""A third-party package registers through the entry point, and cannot overstep.

The package in ``sample_contributor_pkg/`` is installed the way pip would leave it: a ``*.dist-info``
folder with ``entry_points.txt`` on ``sys.path``, found by the real ``importlib.metadata``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from proxy.context.budget import apply_context_budget
from proxy.context.collector import collect_detailed
from proxy.context.estimators import ConservativeTokenEstimator
from proxy.context.registry import ContextContributorRegistry, RegistryError, discover_factories
from proxy.context.types import ContributionRequest

NONCE = "0123456789abcdef"  # a framing nonce (a session's is 16 hex digits)

PACKAGE = Path(__file__).parent / "sample_contributor_pkg"
BUILTINS = {"identity", "governance", "run_contract", "capabilities", "skills"}


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Install the sample package (its entry points, read from its pyproject) into a temp site dir."""
    project = tomllib.loads(PACKAGE.joinpath("pyproject.toml").read_text())["project"]
    points = project["entry-points"]["science_context.contributors"]
    dist = tmp_path / "sample_contributor_pkg-0.1.0.dist-info"
    dist.mkdir()
    dist.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: sample-contributor-pkg\nVersion: 0.1.0\n")
    lines = "".join(f"{name} = {value}\n" for name, value in points.items())
    dist.joinpath("entry_points.txt").write_text(f"[science_context.contributors]\n{lines}")
    monkeypatch.syspath_prepend(str(PACKAGE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return dist


def request() -> ContributionRequest:
    return ContributionRequest(scope="main", context_id="ctx", history=[{"role": "system", "content": "You are Ada."}])


def load(*names: str) -> list:
    return discover_factories(allow=BUILTINS | set(names))


def test_the_package_is_discovered_with_its_distribution_named(installed: Path) -> None:
    found = {f.factory.id: f.source for f in discover_factories(allow={"sample"})}
    assert found == {"sample": "entry point 'sample' (sample-contributor-pkg)"}
    assert "sample" not in {f.factory.id for f in discover_factories(allow={"identity"})}  # allow-list holds


async def test_its_contributor_runs_in_its_scope_only(installed: Path) -> None:
    main = ContextContributorRegistry("main", load("sample"))
    reviewer = ContextContributorRegistry("reviewer", load("sample"))
    assert "sample" in [c.id for c in main] and "sample" not in [c.id for c in reviewer]
    collection = await collect_detailed(main, request())
    assert [a.id for a in collection.attachments] == ["sample.notes"]
    assert collection.attachments[0].trust == "untrusted_data"


async def test_its_output_is_cut_by_the_budget_while_protected_sections_stay_whole(installed: Path) -> None:
    collection = await collect_detailed(ContextContributorRegistry("main", load("sample")), request())
    admitted = apply_context_budget(collection, 400, 300, ConservativeTokenEstimator(), nonce=NONCE)
    protected = {s.id: s.text for s in collection.sections if s.protected}
    assert {s.id: s.text for s in admitted.sections if s.protected} == protected
    banner = next((s for s in admitted.sections if s.id == "sample.banner"), None)
    assert banner is None or "[truncated by the context budget" in banner.text
    kept = [a for a in admitted.attachments if a.id == "sample.notes"]
    assert not kept or len(kept[0].content) < len(collection.attachments[0].content)
    cuts = {d.code.split("_")[0] for d in admitted.diagnostics if d.source == "sample"}
    assert cuts == {"section", "attachment"}


@pytest.mark.parametrize(
    ("name", "fault"),
    [
        ("sample_forger", "role 'assistant' with tool_calls"),
        ("sample_tool_result", "with tool_call_id"),
        ("sample_protect", "claims protection"),
        ("sample_self_protected", "claims protection"),  # declaring itself protected grants nothing
    ],
)
async def test_it_cannot_forge_calls_results_or_protection(installed: Path, name: str, fault: str) -> None:
    collection = await collect_detailed(ContextContributorRegistry("main", load(name)), request())
    (run,) = [r for r in collection.runs if r.contributor_id == name]
    assert run.status == "invalid" and fault in run.error
    assert not [m for m in collection.messages if m.source == name]
    assert not [s for s in collection.sections if s.source == name]
    assert "identity" in [s.id for s in collection.sections]  # the built-ins are unaffected


async def test_a_package_declaring_itself_protected_is_not_and_cannot_fail_the_turn(installed: Path) -> None:
    registry = ContextContributorRegistry("main", load("sample_self_protected"))
    assert not registry.is_protected("sample_self_protected")
    assert registry.is_protected("identity")  # the proxy's own protected contributors keep it
    collection = await collect_detailed(registry, request())  # its invalid output does not raise
    (run,) = [r for r in collection.runs if r.contributor_id == "sample_self_protected"]
    assert run.status == "invalid" and not run.protected


async def test_it_cannot_change_the_request_or_the_frozen_registry(installed: Path) -> None:
    registry = ContextContributorRegistry("main", load("sample_meddler"))
    collection = await collect_detailed(registry, request())
    (run,) = [r for r in collection.runs if r.contributor_id == "sample_meddler"]
    assert run.status == "error" and "TypeError" in run.error
    with pytest.raises(RegistryError, match="frozen"):
        registry._contributors = ()
    before = [c.id for c in registry]
    assert "sample" not in before
    ContextContributorRegistry("main", load("sample"))  # a new run may load more; this one is unchanged
    assert [c.id for c in registry] == before


def test_a_duplicate_id_is_refused_naming_both_sources(installed: Path) -> None:
    with pytest.raises(RegistryError) as error:
        ContextContributorRegistry("main", discover_factories(allow={"identity", "sample_identity"}))
    message = str(error.value)
    assert "duplicate factory id 'identity'" in message
    assert "entry point 'identity' (science-context-proxy)" in message
    assert "entry point 'sample_identity' (sample-contributor-pkg)" in message
