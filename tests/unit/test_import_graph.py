"""The proxy never imports a contributor: built-ins reach it only as plugins, like a third party."""

from __future__ import annotations

import ast
from pathlib import Path

import proxy

ROOT = Path(proxy.__file__).parent


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_nothing_in_proxy_imports_contributors() -> None:
    offenders = [
        f"{path.relative_to(ROOT.parent)}: {name}"
        for path in sorted(ROOT.rglob("*.py"))
        for name in _imports(path)
        if name == "contributors" or name.startswith("contributors.")
    ]
    assert offenders == []
    assert len(list(ROOT.rglob("*.py"))) > 50  # the scan really walked the package


def test_the_context_package_names_no_built_in_tool() -> None:
    """proxy/context/ is generic: the built-ins' tool names live with the contributors that own them."""
    built_in = ("read_skill", "find_tools", "update_plan", "write_artifact", "remember", "submit_review", "delegate")
    found = [
        f"{path.name}: {name}"
        for path in sorted((ROOT / "context").glob("*.py"))
        for name in built_in
        if f'"{name}"' in path.read_text(encoding="utf-8")
    ]
    assert found == []
