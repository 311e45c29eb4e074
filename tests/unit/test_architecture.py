"""The layers of docs/architecture.md, checked against the import graph of the code.

The table there says which modules form each layer and which layers each may import. Every module of
``proxy/`` and ``contributors/`` must be in exactly one layer, the layers must be acyclic, no layer may
take in the whole package, and every import (at module level, inside a function, under
``TYPE_CHECKING``) must stay within its layer or go to a layer it names. A copy of the package with one
forbidden import injected shows the check fails.
"""

from __future__ import annotations

import ast
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import proxy

REPO = Path(proxy.__file__).resolve().parent.parent
ARCHITECTURE = REPO / "docs" / "architecture.md"
PACKAGES = ("proxy", "contributors")


@dataclass(frozen=True)
class Layer:
    """A row of the table: its name, the paths of its modules, the layers it may import."""

    name: str
    paths: tuple[str, ...]
    may_import: frozenset[str]

    def holds(self, path: str) -> bool:
        """Whether the module at ``path`` (relative to the repository) belongs to this layer."""
        return any(path == own or (own.endswith("/") and path.startswith(own)) for own in self.paths)


def layers(text: str) -> list[Layer]:
    """The layer table of the architecture page."""
    section = text.split("## Layers and who may import whom", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]  # after the header row
    found = []
    for row in rows:
        name, modules, may = (cell.strip() for cell in row.strip().strip("|").split("|"))
        paths = tuple(re.findall(r"`([^`]+)`", modules))
        allowed = frozenset() if may == "nothing of ours" else frozenset(part.strip() for part in may.split(","))
        found.append(Layer(name, paths, allowed))
    return found


def modules(root: Path) -> list[str]:
    """Every Python module of our packages under ``root``, as paths relative to it."""
    return sorted(str(path.relative_to(root)) for package in PACKAGES for path in (root / package).rglob("*.py"))


def imports(root: Path, path: str) -> list[str]:
    """The modules of ours ``path`` imports, wherever in it the import statement is."""
    tree = ast.parse((root / path).read_text(encoding="utf-8"), path)
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import; the layer check reads absolute ones"
            base = node.module or ""
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return [name for name in names if name.split(".")[0] in PACKAGES]


def module_path(root: Path, name: str) -> str | None:
    """The file a dotted module name is (a package's ``__init__.py``); ``None`` for a name that is not a
    module (an attribute imported with ``from``)."""
    base = root / Path(*name.split("."))
    if base.with_suffix(".py").is_file():
        return str(base.with_suffix(".py").relative_to(root))
    if (base / "__init__.py").is_file():
        return str((base / "__init__.py").relative_to(root))
    return None


def violations(root: Path, table: list[Layer]) -> list[str]:
    """What breaks the table in the code under ``root``: unplaced or doubly placed modules, forbidden imports."""
    problems: list[str] = []
    placed: dict[str, Layer] = {}
    for path in modules(root):
        homes = [layer for layer in table if layer.holds(path)]
        if len(homes) != 1:
            problems.append(f"{path} is in {len(homes)} layers ({', '.join(h.name for h in homes) or 'none'})")
            continue
        placed[path] = homes[0]
    for path, layer in placed.items():
        for name in imports(root, path):
            target = module_path(root, name)
            if target is None or target not in placed:
                continue
            other = placed[target]
            if other is not layer and other.name not in layer.may_import:
                problems.append(f"{path} ({layer.name}) imports {name} ({other.name})")
    return sorted(set(problems))


def cycle(table: list[Layer]) -> list[str] | None:
    """A cycle among the layers' permitted imports, if there is one."""
    edges = {layer.name: layer.may_import for layer in table}
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> list[str] | None:
        state[name] = 1
        for nxt in sorted(edges.get(name, ())):
            if state.get(nxt) == 1:
                return [*trail, name, nxt]
            if nxt not in state and (found := visit(nxt, [*trail, name])):
                return found
        state[name] = 2
        return None

    for name in edges:
        if name not in state and (found := visit(name, [])):
            return found
    return None


TABLE = layers(ARCHITECTURE.read_text(encoding="utf-8"))


def test_the_table_names_known_layers_and_no_cycle() -> None:
    names = [layer.name for layer in TABLE]
    assert len(names) == len(set(names)) >= 10
    for layer in TABLE:
        assert layer.may_import <= set(names), f"{layer.name} names an unknown layer"
        assert layer.name not in layer.may_import
    assert cycle(TABLE) is None


def test_no_layer_is_a_catch_all() -> None:
    """Each layer is a few packages or named modules: none takes in a whole top-level package."""
    for layer in TABLE:
        assert not {"proxy/", "contributors/proxy/"} & set(layer.paths), layer.name
        assert not any(path.endswith("/*.py") for path in layer.paths), layer.name
    assert not any(layer.name in {"util", "utils", "common", "misc", "helpers", "shared"} for layer in TABLE)


def test_every_module_is_in_one_layer_and_imports_only_what_its_layer_may() -> None:
    assert len(modules(REPO)) > 100  # the scan really walked both packages
    assert violations(REPO, TABLE) == []


def test_an_injected_forbidden_import_fails_the_check(tmp_path: Path) -> None:
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    assert violations(tmp_path, TABLE) == []  # the copy is clean, as the repository is
    budget = tmp_path / "proxy" / "context" / "budget.py"
    budget.write_text(budget.read_text(encoding="utf-8") + "\n\ndef _late() -> None:\n    import proxy.app\n")
    assert violations(tmp_path, TABLE) == ["proxy/context/budget.py (context) imports proxy.app (app)"]
    stray = tmp_path / "proxy" / "helpers.py"
    stray.write_text('"""A module no layer names."""\n')
    assert "proxy/helpers.py is in 0 layers (none)" in violations(tmp_path, TABLE)
