"""Run contract: metadata, then header, then operator profile; protected and never truncated."""

from __future__ import annotations

import pytest

from proxy.context.budget import apply_context_budget
from proxy.context.estimators import ConservativeTokenEstimator

NONCE = "0123456789abcdef"  # a framing nonce (a session's is 16 hex digits)


def contract_text(collection) -> str | None:
    return next((s.text for s in collection.sections if s.id == "run_contract"), None)


async def test_metadata_wins_over_header_and_profile(collect) -> None:
    collection = await collect(
        metadata={"run_contract": {"goal": "fit", "budget": 3}},
        headers={"X-Run-Contract": "header contract"},
        options={"run_contract": {"profile": "operator default"}},
    )
    text = contract_text(collection)
    assert text == '(from the metadata.run_contract)\n{\n  "budget": 3,\n  "goal": "fit"\n}'
    assert next(s for s in collection.sections if s.id == "run_contract").protected


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"headers": {"x-run-contract": "only read data"}}, "(from the x-run-contract header)\nonly read data"),
        ({"options": {"run_contract": {"profile": "default terms"}}}, "(from the operator profile)\ndefault terms"),
        ({"metadata": {"run_contract": "plain text"}}, "(from the metadata.run_contract)\nplain text"),
        ({}, None),
    ],
)
async def test_sources(collect, fields, expected) -> None:
    assert contract_text(await collect(**fields)) == expected


async def test_a_long_contract_is_admitted_whole_while_optional_sections_give_way(collect) -> None:
    contract = "\n".join(f"clause {i}: keep every raw measurement" for i in range(60))
    tools = [{"type": "function", "function": {"name": f"tool_{i}"}} for i in range(200)]
    collection = await collect(metadata={"run_contract": contract}, tools=tools)
    estimator = ConservativeTokenEstimator()
    protected_cost = sum(estimator.count_text(s.text) + 40 for s in collection.sections if s.protected)
    admitted = apply_context_budget(collection, protected_cost, 500, estimator, nonce=NONCE)
    texts = {s.id: s.text for s in admitted.sections}
    assert texts["run_contract"].endswith(contract)
    assert texts.get("capabilities", "") != next(s.text for s in collection.sections if s.id == "capabilities")
