"""Skills: catalog only in the prompt, body once through read_skill, notice when it left the context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contributors.skills import READ_SKILL_SCHEMA, UNAVAILABLE, SkillLibrary
from proxy.context.previews import render_preview
from proxy.context.state import StateConfig, derive_state, with_visibility

BODY = "Fit with least squares.\nReport residuals.\nSECRET-BODY-MARKER"


def write(folder: Path, name: str, text: str) -> Path:
    (folder / name).mkdir(parents=True, exist_ok=True)
    path = folder / name / "SKILL.md"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write(tmp_path, "fitting", f"---\nname: fitting\ndescription: Curve fitting\n  with residuals.\n---\n{BODY}\n")
    write(tmp_path, "plotting", "---\nname: plotting\ndescription: Publication plots.\n---\nUse matplotlib.\n")
    write(tmp_path, "broken-yaml", "---\nname: [unclosed\n---\nbody\n")
    write(tmp_path, "no-front", "just a body\n")
    write(tmp_path, "no-desc", "---\nname: nodesc\n---\nbody\n")
    write(tmp_path, "zz-dupe", "---\nname: plotting\ndescription: again\n---\nother\n")
    (tmp_path / "binary").mkdir()
    (tmp_path / "binary" / "SKILL.md").write_bytes(b"\xff\xfe\x00")
    return tmp_path


def test_library_loads_good_skills_and_skips_bad_ones_with_diagnostics(folder: Path) -> None:
    library = SkillLibrary(folder)
    assert library.catalog() == [("fitting", "Curve fitting with residuals."), ("plotting", "Publication plots.")]
    assert len(library.diagnostics) == 5
    joined = "\n".join(library.diagnostics)
    for fault in ("invalid YAML", "no YAML front matter", "'description'", "duplicate skill name", "unreadable"):
        assert fault in joined
    assert SkillLibrary(folder / "missing").catalog() == []


def test_revision_is_a_content_hash(folder: Path) -> None:
    before = SkillLibrary(folder).read("fitting")
    assert before.body == BODY and len(before.revision) == 12
    write(folder, "fitting", f"---\nname: fitting\ndescription: Curve fitting.\n---\n{BODY} v2\n")
    assert SkillLibrary(folder).read("fitting").revision != before.revision


def test_read_skill_returns_the_body_with_its_revision_header(folder: Path) -> None:
    library = SkillLibrary(folder)
    revision = library.read("fitting").revision
    text = library.run_read_skill('{"name": "fitting"}')
    assert text == f'<skill name="fitting" revision="{revision}">\n{BODY}\n</skill>'
    assert READ_SKILL_SCHEMA["function"]["name"] == "read_skill"


def test_unknown_or_unselected_skill_is_an_error_listing_available_ones(folder: Path) -> None:
    library = SkillLibrary(folder)
    assert library.run_read_skill({"name": "astro"}) == "Error: unknown skill 'astro'; available: fitting, plotting"
    assert library.run_read_skill({"name": "plotting"}, select=["fitting"]).startswith("Error: unknown skill")
    assert library.run_read_skill({}).startswith("Error:")
    with pytest.raises(KeyError, match="available: fitting, plotting"):
        library.read("astro")


def test_a_visible_body_is_not_sent_twice(folder: Path) -> None:
    library = SkillLibrary(folder)
    revision = library.read("fitting").revision
    again = library.run_read_skill({"name": "fitting"}, loaded={"fitting": revision})
    assert BODY not in again and revision in again
    assert BODY in library.run_read_skill({"name": "fitting"}, loaded={"fitting": "older"})


def read_history(library: SkillLibrary) -> list[dict[str, Any]]:
    call = {"id": "s1", "type": "function", "function": {"name": "read_skill", "arguments": '{"name": "fitting"}'}}
    return [
        {"role": "user", "content": "fit the curve"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "s1", "content": library.run_read_skill({"name": "fitting"})},
    ]


async def test_catalog_in_a_section_and_never_a_body(collect, folder: Path) -> None:
    history = read_history(SkillLibrary(folder))
    collection = await collect(history=history, options={"skills": {"folder": str(folder)}})
    (section,) = [s for s in collection.sections if s.id == "skills.catalog"]
    assert "- fitting: Curve fitting with residuals." in section.text and "read_skill(name)" in section.text
    assert all("SECRET-BODY-MARKER" not in s.text for s in collection.sections)
    assert all("SECRET-BODY-MARKER" not in m.content for m in collection.messages)
    assert not [m for m in collection.messages if m.id == "skills.unavailable"]
    assert any(d.code == "skill_skipped" for d in collection.diagnostics)


async def test_select_limits_the_catalog(collect, folder: Path) -> None:
    collection = await collect(options={"skills": {"folder": str(folder), "select": ["plotting"]}})
    (section,) = [s for s in collection.sections if s.id == "skills.catalog"]
    assert "plotting" in section.text and "fitting" not in section.text


async def test_notice_when_the_read_skill_result_is_no_longer_visible(collect, folder: Path) -> None:
    library = SkillLibrary(folder)
    history = read_history(library)
    revision = library.read("fitting").revision
    compacted = [history[0], {"role": "assistant", "content": "checkpoint: fitting in progress"}]
    # The assembler's state: derived from canonical history, visibility judged against this call's history.
    state = with_visibility(derive_state(history), compacted, StateConfig())
    collection = await collect(history=compacted, state=state, options={"skills": {"folder": str(folder)}})
    (notice,) = [m for m in collection.messages if m.id == "skills.unavailable"]
    assert UNAVAILABLE in notice.content and f"fitting (revision {revision})" in notice.content
    assert "SECRET-BODY-MARKER" not in notice.content


async def test_notice_when_the_result_became_a_preview(collect, folder: Path) -> None:
    library = SkillLibrary(folder)
    history = read_history(library)
    long_body = library.run_read_skill({"name": "fitting"}) + "\n" + "\n".join(f"detail {i}" for i in range(200))
    history[2] = {**history[2], "content": long_body}
    preview = render_preview(long_body, "to_s1")
    assert preview is not None
    previewed = [*history[:2], {**history[2], "content": preview}]
    collection = await collect(
        history=previewed, state=with_visibility(derive_state(history), previewed, StateConfig())
    )
    assert [m.id for m in collection.messages] == ["skills.unavailable"]


def test_bad_options_name_the_key() -> None:
    from contributors.skills import factory

    with pytest.raises(ValueError, match=r"contributors\.skills\.select"):
        factory.validate_options({"select": "fitting"})
