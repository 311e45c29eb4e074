"""Identity: the client's system and developer messages verbatim, plus operator text, protected."""

from __future__ import annotations

import pytest

from contributors.identity import factory
from proxy.context.budget import apply_context_budget
from proxy.context.estimators import ConservativeTokenEstimator
from proxy.context.registry import FactorySource, OptionsInvalid, configure
from proxy.kernel.errors import AssemblyFailed

NONCE = "0123456789abcdef"  # a framing nonce (a session's is 16 hex digits)

SYSTEM = "You are Ada, a careful lab assistant.\n  Keep units SI.  "


async def test_client_messages_verbatim_after_operator_text(collect) -> None:
    history = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "hi"},
        {"role": "developer", "content": [{"type": "text", "text": "Answer in English."}]},
    ]
    collection = await collect(history=history, options={"identity": {"text": "Operated by ACME."}})
    (section,) = [s for s in collection.sections if s.id == "identity"]
    assert section.protected and section.source == "identity"
    assert section.text == f"Operated by ACME.\n\n{SYSTEM}\n\nAnswer in English."
    assert "hi" not in section.text


async def test_no_identity_no_section(collect) -> None:
    collection = await collect(history=[{"role": "user", "content": "hi"}])
    assert "identity" not in [s.id for s in collection.sections]


async def test_protected_identity_is_never_cut_the_assembly_fails_instead(collect) -> None:
    history = [{"role": "system", "content": "rule " * 400}]
    collection = await collect(history=history)
    estimator = ConservativeTokenEstimator()
    admitted = apply_context_budget(collection, 5000, 500, estimator, nonce=NONCE)
    identity = {s.id: s.text for s in collection.sections}["identity"]
    assert {s.id: s.text for s in admitted.sections}["identity"] == identity
    with pytest.raises(AssemblyFailed, match="identity"):
        apply_context_budget(collection, 100, 500, estimator, nonce=NONCE)


def test_bad_option_names_the_key() -> None:
    with pytest.raises(OptionsInvalid, match=r"contributors\.identity\.text"):
        configure([FactorySource(factory, "test")], {"identity": {"text": 3}})
    with pytest.raises(OptionsInvalid, match=r"contributors\.identity\.txt: Extra inputs are not permitted"):
        configure([FactorySource(factory, "test")], {"identity": {"txt": "x"}})
