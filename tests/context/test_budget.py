"""Budget admission: protected first and whole, the rest by slot and order, cuts always visible."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.context.budget import apply_context_budget, truncation_marker
from proxy.context.collector import Collection
from proxy.context.estimators import ConservativeTokenEstimator
from proxy.context.hidden import hidden_message
from proxy.context.renderer import SEPARATOR, render_section
from proxy.context.shortfall import ContextDoesNotFit, Shortfall
from proxy.context.types import Attachment, ContextMessage, Section
from proxy.kernel.errors import AssemblyFailed

NONCE = "0123456789abcdef"  # a framing nonce (a session's is 16 hex digits)

EST = ConservativeTokenEstimator()


def collection(sections=(), messages=(), attachments=()) -> Collection:  # type: ignore[no-untyped-def]
    return Collection("main", (), tuple(sections), tuple(messages), tuple(attachments), ())


def cost(section: Section) -> int:
    return EST.count_text(render_section(section)) + EST.count_text(SEPARATOR)


def test_everything_fits_in_render_order() -> None:
    items = [Section("b", "bee", slot=2), Section("a", "ay", slot=1), Section("id", "me", slot=9, protected=True)]
    result = apply_context_budget(collection(items), 10_000, 10_000, EST, nonce=NONCE)
    assert [s.id for s in result.sections] == ["a", "b", "id"]
    assert result.diagnostics == ()
    assert result.prompt_tokens == sum(cost(s) for s in items)


def test_protected_over_budget_fails_naming_them_and_sizes() -> None:
    identity = Section("identity", "x " * 400, protected=True)
    governance = Section("governance", "y " * 10, protected=True)
    with pytest.raises(AssemblyFailed, match=r"identity \(\d+ tokens\).*|governance \(\d+ tokens\)") as info:
        apply_context_budget(collection([identity, governance]), 100, 100, EST, nonce=NONCE)
    assert f"identity ({cost(identity)} tokens)" in info.value.message
    assert f"governance ({cost(governance)} tokens)" in info.value.message
    # What the pipeline explains it with: the protected sections' cost and the prompt budget.
    assert isinstance(info.value, ContextDoesNotFit)
    assert info.value.shortfall == Shortfall("prompt_budget", cost(identity) + cost(governance), 100)


def test_lower_priority_sections_are_truncated_then_dropped() -> None:
    identity = Section("identity", "I am the agent.", slot=0, protected=True)
    early = Section("early", "alpha beta gamma " * 200, slot=10)
    late = Section("late", "delta " * 200, slot=20)
    budget = cost(identity) + 120
    result = apply_context_budget(collection([late, early, identity]), budget, 100, EST, nonce=NONCE)
    ids = [s.id for s in result.sections]
    assert ids == ["identity", "early"]
    cut = result.sections[1]
    assert cut.text.startswith("alpha beta") and "[truncated by the context budget: early" in cut.text
    assert result.prompt_tokens <= budget
    assert {d.code for d in result.diagnostics} == {"section_truncated", "section_dropped"}


def test_small_later_section_still_fits_after_a_drop() -> None:
    big = Section("big", "word " * 500, slot=1)
    small = Section("small", "ok", slot=2)
    result = apply_context_budget(collection([big, small]), cost(small) + 10, 100, EST, nonce=NONCE)
    assert [s.id for s in result.sections] == ["small"]
    assert [d.code for d in result.diagnostics] == ["section_dropped"]


def test_messages_and_attachments_have_their_own_bound() -> None:
    messages = [ContextMessage("plan.state", "step 1", "plan")]
    attachments = [
        Attachment("web.a", "page " * 500, "untrusted_data", "web"),
        Attachment("web.b", "tiny", source="web"),
    ]
    first = EST.count_message(hidden_message(messages[0], nonce=NONCE))
    result = apply_context_budget(collection([], messages, attachments), 50, first + 150, EST, nonce=NONCE)
    assert [m.id for m in result.messages] == ["plan.state"]
    # The earlier attachment is cut to what is left; the later one then no longer fits.
    assert [a.id for a in result.attachments] == ["web.a"]
    assert [d.code for d in result.diagnostics] == ["attachment_truncated", "attachment_dropped"]
    assert "[truncated by the context budget: web.a" in result.attachments[0].content
    assert result.message_tokens <= first + 150
    spent = sum(EST.count_message(hidden_message(x, nonce=NONCE)) for x in (*result.messages, *result.attachments))
    assert spent == result.message_tokens


def test_budgets_must_be_positive() -> None:
    with pytest.raises(ValueError, match="prompt_budget_tokens"):
        apply_context_budget(collection(), 0, 1, EST, nonce=NONCE)


def test_marker_names_the_cut() -> None:
    assert truncation_marker("x", 3, 10) == "\n[truncated by the context budget: x, 3 of 10 characters kept]"


section_lists = st.lists(
    st.builds(
        Section,
        id=st.uuids().map(lambda u: u.hex[:12]),
        text=st.text(st.sampled_from("ab 研究\n"), max_size=400),
        slot=st.integers(0, 3),
        order=st.integers(0, 3),
        protected=st.booleans(),
    ),
    max_size=10,
)


@settings(max_examples=50, deadline=None)
@given(section_lists, st.integers(1, 800))
def test_never_cuts_a_protected_section_and_never_exceeds(sections: list[Section], budget: int) -> None:
    protected_cost = sum(cost(s) for s in sections if s.protected)
    if protected_cost > budget:
        with pytest.raises(AssemblyFailed):
            apply_context_budget(collection(sections), budget, 10, EST, nonce=NONCE)
        return
    result = apply_context_budget(collection(sections), budget, 10, EST, nonce=NONCE)
    admitted = {s.id: s for s in result.sections}
    for section in sections:
        if section.protected:
            assert admitted[section.id] == section  # whole, unchanged
    assert result.prompt_tokens == sum(cost(s) for s in result.sections) <= budget
    for section in result.sections:
        original = next(s for s in sections if s.id == section.id)
        assert section.text == original.text or "[truncated by the context budget" in section.text


def test_messages_are_admitted_by_priority_and_sent_in_collection_order() -> None:
    """A long list collected first cannot push out a message whose contributor ranks before it."""
    long_list = ContextMessage("artifact.state", "figure saved. " * 400, "artifact")
    plan = ContextMessage("plan.state", "1. [in_progress] write up", "plan")
    tail = ContextMessage("review.state", "accepted", "review")
    base = collection(messages=[long_list, plan, tail])
    ranked = Collection(
        *[getattr(base, f) for f in ("scope", "runs", "sections", "messages", "attachments")],
        (),
        {
            "artifact.state": 60,
            "plan.state": 10,
            "review.state": 40,
        },
    )
    budget = 300
    unranked = apply_context_budget(base, 100, budget, EST, nonce=NONCE)
    assert "plan.state" not in [m.id for m in unranked.messages]  # collection order: the list took it all
    admitted = apply_context_budget(ranked, 100, budget, EST, nonce=NONCE)
    assert [m.id for m in admitted.messages] == ["artifact.state", "plan.state", "review.state"]  # send order
    assert admitted.messages[1] == plan and admitted.messages[2] == tail  # whole
    assert "[truncated by the context budget" in admitted.messages[0].content
