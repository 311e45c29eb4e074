"""The renderer: same sections, same bytes, whatever order they arrive in."""

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.context.renderer import DeterministicSystemPromptRenderer, render_section
from proxy.context.types import Section

RENDERER = DeterministicSystemPromptRenderer()

sections = st.lists(
    st.builds(
        Section,
        id=st.from_regex(r"[a-z]{1,8}(\.[a-z]{1,5})?", fullmatch=True),
        text=st.text(max_size=80),
        slot=st.integers(0, 5),
        order=st.integers(-3, 3),
        protected=st.booleans(),
        title=st.sampled_from(["", "Identity", "治理 Governance"]),
    ),
    max_size=12,
    unique_by=lambda s: s.id,
)


@settings(max_examples=50, deadline=None)
@given(sections, st.randoms(use_true_random=False))
def test_same_sections_same_bytes_in_any_order(items: list[Section], random: object) -> None:
    shuffled = list(items)
    random.shuffle(shuffled)  # type: ignore[attr-defined]
    first, second = RENDERER.render(items), RENDERER.render(shuffled)
    assert first.text.encode() == second.text.encode()
    assert first.section_ids == second.section_ids
    assert sorted(first.section_ids) == sorted(s.id for s in items)


def test_order_headers_and_ids() -> None:
    items = [
        Section("plan.catalog", "steps", slot=20),
        Section("identity", "I am a research agent.\n", slot=0, protected=True, title="Identity"),
        Section("governance.b", "rule b", slot=10, order=2),
        Section("governance.a", "rule a", slot=10, order=1),
    ]
    rendered = RENDERER.render(items)
    assert rendered.section_ids == ("identity", "governance.a", "governance.b", "plan.catalog")
    assert rendered.text == (
        "## Identity\nI am a research agent.\n\n"
        "## governance.a\nrule a\n\n## governance.b\nrule b\n\n## plan.catalog\nsteps"
    )


def test_empty_section_renders_header_only_and_no_sections_render_empty() -> None:
    assert render_section(Section("x", "\n")) == "## x"
    rendered = RENDERER.render([])
    assert rendered.text == "" and rendered.section_ids == ()
