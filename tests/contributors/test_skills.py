"""Skills: catalog only in the prompt, body once through read_skill, notice when it left the context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contributors.skills import READ_SKILL_SCHEMA, UNAVAILABLE, ReadSkill, SkillLibrary, SkillShelf, render_skill
from proxy.context.previews import render_preview
from proxy.context.registry import FactorySource, OptionsInvalid, configure
from proxy.context.state import with_visibility
from proxy.context.types import ToolContext
from tests.builtin_state import builtin_config, derive_state

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


class MemorySession:
    """A session's durable tool records in memory (the store's ``StoreToolSession`` is tested over HTTP)."""

    def __init__(self) -> None:
        self.refs: list[tuple[str, str]] = []
        self.values: dict[str, Any] = {}

    async def revisions(self) -> dict[str, str]:
        first: dict[str, str] = {}
        for name, revision in self.refs:
            first.setdefault(name, revision)
        return first

    async def record_revision(self, name: str, revision: str) -> None:
        self.refs.append((name, revision))

    async def get(self, key: str) -> Any:
        return self.values.get(key)

    async def put(self, key: str, value: Any) -> None:
        self.values[key] = value


async def read(
    tool: ReadSkill,
    arguments: str,
    state: dict[str, Any] | None = None,
    session: MemorySession | None = None,
) -> str:
    context = ToolContext("ctx", [], [], state or {}, session)
    return await tool.run(context, arguments)


async def test_read_skill_returns_the_body_with_its_revision_header(folder: Path) -> None:
    tool = ReadSkill(SkillShelf(), str(folder), None)
    revision = SkillLibrary(folder).read("fitting").revision
    text = await read(tool, '{"name": "fitting"}')
    assert text == f'<skill name="fitting" revision="{revision}">\n{BODY}\n</skill>'
    assert READ_SKILL_SCHEMA["function"]["name"] == "read_skill"


async def test_unknown_or_unselected_skill_is_an_error_listing_available_ones(folder: Path) -> None:
    tool = ReadSkill(SkillShelf(), str(folder), None)
    assert await read(tool, '{"name": "astro"}') == "Error: unknown skill 'astro'; available: fitting, plotting"
    selected = ReadSkill(SkillShelf(), str(folder), ["fitting"])
    assert (await read(selected, '{"name": "plotting"}')).startswith("Error: unknown skill")
    assert (await read(tool, "{}")).startswith("Error:")
    with pytest.raises(KeyError, match="available: fitting, plotting"):
        SkillLibrary(folder).read("astro")


async def test_a_visible_body_is_not_sent_twice(folder: Path) -> None:
    tool = ReadSkill(SkillShelf(), str(folder), None)
    revision = SkillLibrary(folder).read("fitting").revision
    loaded = {"skills": [{"name": "fitting", "revision": revision, "tool_call_id": "s1", "visible": True}]}
    again = await read(tool, '{"name": "fitting"}', state=loaded)
    assert BODY not in again and revision in again
    older = {"skills": [{**loaded["skills"][0], "revision": "older"}]}
    assert BODY in await read(tool, '{"name": "fitting"}', state=older)


async def test_the_catalog_and_read_skill_agree_after_a_file_changes(collect, folder: Path) -> None:
    """One shelf per process: the catalog and read_skill see the same revision of the folder."""
    (factory,) = [s for s in configure([FactorySource(skills_factory(), "test")], {"skills": {"folder": str(folder)}})]
    (tool,) = factory.factory.tools(factory.options)
    before = await read(tool, '{"name": "fitting"}')
    write(folder, "fitting", "---\nname: fitting\ndescription: Curve fitting v2.\n---\nNEW-BODY\n")
    section = await factory.factory.create("main").contribute(_request(factory.options))
    assert "Curve fitting v2." in section.sections[0].text
    after = await read(tool, '{"name": "fitting"}')
    assert "NEW-BODY" in after and after != before


async def test_a_session_keeps_reading_the_revision_it_first_read(folder: Path) -> None:
    shelf = SkillShelf()
    tool = ReadSkill(shelf, str(folder), None)
    session, other = MemorySession(), MemorySession()
    first = await read(tool, '{"name": "fitting"}', session=session)
    original = SkillLibrary(folder).read("fitting")
    assert first == render_skill(original) and session.refs == [("fitting", original.revision)]
    write(folder, "fitting", "---\nname: fitting\ndescription: Curve fitting.\n---\nNEW-BODY\n")
    assert await read(tool, '{"name": "fitting"}', session=session) == first  # pinned to its revision
    assert "NEW-BODY" in await read(tool, '{"name": "fitting"}', session=other)  # a new session: new revision
    # A restarted proxy (a new shelf) has only the new file: the session's kept copy serves the old one.
    restarted = ReadSkill(SkillShelf(), str(folder), None)
    assert await read(restarted, '{"name": "fitting"}', session=session) == first
    (folder / "fitting" / "SKILL.md").unlink()
    assert await read(restarted, '{"name": "fitting"}', session=session) == first  # gone from the folder too


def skills_factory() -> Any:
    from contributors.skills import factory

    return factory()


def _request(options: Any) -> Any:
    from proxy.context.types import ContributionRequest

    return ContributionRequest(scope="main", context_id="ctx", options=options)


def read_history(library: SkillLibrary) -> list[dict[str, Any]]:
    body = render_skill(library.read("fitting"))
    call = {"id": "s1", "type": "function", "function": {"name": "read_skill", "arguments": '{"name": "fitting"}'}}
    return [
        {"role": "user", "content": "fit the curve"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "s1", "content": body},
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
    state = with_visibility(derive_state(history), compacted, builtin_config())
    collection = await collect(history=compacted, state=state, options={"skills": {"folder": str(folder)}})
    (notice,) = [m for m in collection.messages if m.id == "skills.unavailable"]
    assert UNAVAILABLE in notice.content and f"fitting (revision {revision})" in notice.content
    assert "SECRET-BODY-MARKER" not in notice.content


async def test_notice_when_the_result_became_a_preview(collect, folder: Path) -> None:
    library = SkillLibrary(folder)
    history = read_history(library)
    long_body = render_skill(library.read("fitting")) + "\n" + "\n".join(f"detail {i}" for i in range(200))
    history[2] = {**history[2], "content": long_body}
    preview = render_preview(long_body, "to_s1")
    assert preview is not None
    previewed = [*history[:2], {**history[2], "content": preview}]
    collection = await collect(
        history=previewed, state=with_visibility(derive_state(history), previewed, builtin_config())
    )
    assert [m.id for m in collection.messages] == ["skills.unavailable"]


def test_bad_options_name_the_key() -> None:
    with pytest.raises(OptionsInvalid, match=r"contributors\.skills\.select: Input should be a valid list"):
        configure([FactorySource(skills_factory(), "test")], {"skills": {"select": "fitting"}})
