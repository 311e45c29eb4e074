"""The context package is generic: it names no built-in contributor's tool (that nothing in ``proxy/``
imports ``contributors/`` at all is the layer rule of tests/unit/test_architecture.py)."""

from __future__ import annotations

from pathlib import Path

import proxy

ROOT = Path(proxy.__file__).parent


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
