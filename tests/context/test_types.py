"""The declared contracts: mypy checks a third-party subclass of the bases against them.

mypy runs through its API on a small package module that imports the public ``proxy.context.types``
(of this checkout: ``mypy_path`` points at it), with the repository's strictness. Each line expected to
fail carries ``# error: <code>``; the test compares those with what mypy reports.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from mypy import api

import proxy.context.types

ROOT = Path(proxy.context.types.__file__).parents[2]
REPORTED = re.compile(r"^plugin\.py:(\d+): error: .*\[([a-z-]+)\]$")

WRONG = """
from typing import Any

from proxy.context.types import ContributionRequest, Contributor, ContributorFactory, ContributorOutput, Scope


class Loud(Contributor):
    id = "loud"
    scopes = ("main",)
    priority = "high"  # error: assignment
    runs_inline = 1.0  # error: assignment

    async def contribute(self, request: ContributionRequest) -> ContributorOutput:
        return ContributorOutput()


class Sloppy(ContributorFactory):
    id = "sloppy"
    options_model = dict  # error: assignment

    def create(self, scope: Scope) -> Contributor | None:
        return Loud()

    def tools(self) -> int:  # error: override
        return 1

    def channels(self, options: Any) -> list[str]:  # error: override
        return []


class Forgetful(ContributorFactory):
    id = "forgetful"


Forgetful()  # error: abstract
"""

RIGHT = """
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import BaseModel

from proxy.context.types import (
    ContextContributorFactory,
    ContributionRequest,
    Contributor,
    ContributorFactory,
    ContributorOutput,
    ProxyTool,
    Scope,
    StateChannel,
)


class Options(BaseModel):
    site: str = "lab"


class Inventory(Contributor):
    id = "inventory"
    scopes: ClassVar[frozenset[Scope]] = frozenset({"main"})
    priority = 60
    runs_inline: bool

    def __init__(self, inline: bool) -> None:
        self.runs_inline = inline

    @property
    def protected(self) -> bool:
        return False

    async def contribute(self, request: ContributionRequest) -> ContributorOutput:
        return ContributorOutput()


class Factory(ContributorFactory):
    id = "inventory"
    options_model = Options

    def create(self, scope: Scope) -> Inventory | None:
        return Inventory(inline=True) if scope == "main" else None

    def tools(self, options: Any) -> Sequence[ProxyTool]:
        return ()

    def channels(self, options: Any) -> Sequence[StateChannel]:
        return ()


accepted: ContextContributorFactory = Factory()  # the protocol names still accept the bases
"""


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the module's runs: the second checks only the snippet (a cold run takes seconds)."""
    return tmp_path_factory.mktemp("mypy-cache")


def run_mypy(tmp_path: Path, cache: Path, code: str) -> tuple[str, int]:
    (tmp_path / "plugin.py").write_text(textwrap.dedent(code))
    config = tmp_path / "mypy.ini"
    config.write_text(f"[mypy]\nstrict = True\nwarn_unreachable = True\nmypy_path = {ROOT}\n")
    out, err, status = api.run(["--config-file", str(config), "--cache-dir", str(cache), str(tmp_path / "plugin.py")])
    assert err == "", err
    return out, status


def test_mypy_reports_a_wrongly_typed_optional_member_and_a_missing_required_one(
    tmp_path: Path, mypy_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out, status = run_mypy(tmp_path, mypy_cache, WRONG)
    lines = textwrap.dedent(WRONG).splitlines()
    expected = {(n, line.rsplit("# error: ", 1)[1]) for n, line in enumerate(lines, 1) if "# error: " in line}
    reported = {(int(m[1]), m[2]) for m in map(REPORTED.match, out.splitlines()) if m}
    assert reported == expected, out
    assert status == 1
    assert 'base class "Contributor" defined the type as "int"' in out  # priority = "high"


def test_mypy_passes_a_correct_subclass(tmp_path: Path, mypy_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    out, status = run_mypy(tmp_path, mypy_cache, RIGHT)
    assert (status, out.strip()) == (0, "Success: no issues found in 1 source file")
