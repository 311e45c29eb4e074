"""Governance: the authority rule always, the operator's policy after it, protected."""

from __future__ import annotations

import pytest

from contributors.governance import AUTHORITY_RULE, factory
from proxy.context.registry import FactorySource, OptionsInvalid, configure


async def test_authority_rule_always_present_and_protected(collect) -> None:
    collection = await collect(scope="reviewer")
    (section,) = [s for s in collection.sections if s.id == "governance"]
    assert section.protected
    assert section.text == AUTHORITY_RULE
    for phrase in ("data_only", "system", "governance", "permission", "run-contract"):
        assert phrase in section.text


async def test_operator_policy_follows_the_rule(collect) -> None:
    collection = await collect(options={"governance": {"policy": "Never delete raw data."}})
    (section,) = [s for s in collection.sections if s.id == "governance"]
    assert section.text == f"{AUTHORITY_RULE}\n\nNever delete raw data."


def test_policy_must_be_text() -> None:
    with pytest.raises(OptionsInvalid, match=r"contributors\.governance\.policy"):
        configure([FactorySource(factory, "test")], {"governance": {"policy": ["a"]}})
