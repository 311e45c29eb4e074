"""docs/settings.md documents exactly the options the built-in contributors' models declare."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from proxy.context.registry import OWN_DISTRIBUTION, discover_factories

SETTINGS = Path(__file__).parents[2] / "docs" / "settings.md"


def documented() -> set[tuple[str, str]]:
    """(contributor, option) of every row of the built-ins' options table."""
    text = SETTINGS.read_text(encoding="utf-8")
    table = text.split("### `contributors:` options of the built-in contributors", 1)[1]
    rows: set[tuple[str, str]] = set()
    owner = ""
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or cells[0] in ("contributor", "---"):
            if rows and not line.startswith("|"):
                break
            continue
        found = re.match(r"`([a-z_]+)`", cells[0])
        owner = found.group(1) if found else owner
        option = re.match(r"`([a-z_]+)`", cells[2])
        if option:
            rows.add((owner, option.group(1)))
    return rows


def declared() -> set[tuple[str, str]]:
    """(contributor, field) of every built-in factory's options model."""
    fields: set[tuple[str, str]] = set()
    for source in discover_factories():
        model = getattr(source.factory, "options_model", None)
        assert source.source.endswith(f"({OWN_DISTRIBUTION})") and isinstance(model, type)
        assert issubclass(model, BaseModel) and model.model_config.get("extra") == "forbid"
        fields |= {(source.factory.id, name) for name in model.model_fields}
    return fields


def test_every_option_field_is_documented_and_every_documented_option_exists() -> None:
    assert declared() == documented()


def test_every_option_field_has_a_description() -> None:
    for source in discover_factories():
        model = source.factory.options_model
        for name, info in model.model_fields.items():
            assert info.description, f"contributors.{source.factory.id}.{name} has no description"
