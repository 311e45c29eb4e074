"""Skills: a catalog of selected skills in the system prompt, bodies only through ``read_skill``.

Progressive disclosure: the stable prompt lists each selected skill's name and description, never a
body. A body enters the context once, as the result of the proxy-owned ``read_skill(name)`` tool this
package offers (unless the client declares its own tool of that name), headed by its revision, a
content hash. The ``skills`` run-state channel (declared here, beside the header it parses) keeps a
reference per skill read (name, revision, call ID, whether the body is still visible); when compaction
has removed or previewed that result, this contributor adds a ``data_only`` message telling the model
the instruction is no longer in context, so it calls ``read_skill`` again.

One :class:`SkillShelf` per process serves the catalog and ``read_skill`` alike, so they always agree:
it reloads a folder whose files changed and keeps every revision it has loaded. A session is pinned to
the revision it first read (the store's durable skill reference, and the body kept with the session),
so a skill edited mid-run is a new revision for new sessions while a running one keeps reading its own.

A skills folder has the Agent Skills layout: ``<folder>/<skill>/SKILL.md``, YAML front matter with
``name`` and ``description``, then the body. A bad file is skipped with a diagnostic.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from contributors.base import BuiltinContributor, ContributorOptions, options_for
from contributors.projection import run_state
from proxy.context.previews import is_preview
from proxy.context.state import tool_results
from proxy.context.types import (
    ContextMessage,
    ContributionRequest,
    ContributorFactory,
    ContributorOutput,
    DeclaredCall,
    Diagnostic,
    ProxyTool,
    Scope,
    Section,
    StateChannel,
    ToolContext,
)

SLOT = 40
# The unavailability notice is admitted into the message budget before every list, like the plan.
PRIORITY = 10
SKILLS = "skills"  # the run-state channel
READ_SKILL = "read_skill"
SKILL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_DESCRIPTION = 1024
UNAVAILABLE = "instruction no longer in context, call read_skill again"
# The header ``read_skill`` puts on a body, and the pattern the ``skills`` channel reads it back with.
SKILL_HEADER = re.compile(r'\s*<skill name="(?P<name>[^"]+)" revision="(?P<revision>[^"]+)">')
# A read_skill answer that points back at a body still in context instead of repeating it: it is not a
# reference of its own (the earlier result stays the one whose visibility counts).
SKILL_ALREADY_LOADED = "Skill already in context:"
READ_SKILL_SCHEMA: Mapping[str, Any] = {
    "type": "function",
    "function": {
        "name": READ_SKILL,
        "description": "Load the full instructions of a skill from the skill catalog by its name.",
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string", "description": "The skill's name, as in the catalog."}},
            "required": ["name"],
            "additionalProperties": False,
        },
    },
}


class SkillsOptions(ContributorOptions):
    """``contributors: {skills: {...}}``."""

    folder: str | None = Field(
        None,
        min_length=1,
        description="the skills folder (<folder>/<skill>/SKILL.md); enables the catalog section and read_skill",
    )
    select: list[str] | None = Field(None, description="skill names to offer (default: all in the folder)")


@dataclass(frozen=True)
class SkillBody:
    """A skill's body and its revision (the first 12 hex digits of the SKILL.md file's SHA-256)."""

    name: str
    body: str
    revision: str


@dataclass(frozen=True)
class _Skill:
    name: str
    description: str
    body: SkillBody


class SkillLibrary:
    """The skills of one folder, loaded once; ``diagnostics`` says which files were skipped and why."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.diagnostics: list[str] = []
        self._skills: dict[str, _Skill] = {}
        if not self.folder.is_dir():
            self.diagnostics.append(f"skills folder {str(self.folder)!r} does not exist")
            return
        for path in sorted(self.folder.glob("*/SKILL.md")):
            skill = self._load(path)
            if skill is None:
                continue
            if skill.name in self._skills:
                self.diagnostics.append(f"{path}: duplicate skill name {skill.name!r}, skipped")
                continue
            self._skills[skill.name] = skill

    def _load(self, path: Path) -> _Skill | None:
        try:
            raw = path.read_bytes()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.diagnostics.append(f"{path}: unreadable ({exc}), skipped")
            return None
        match = re.match(r"---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|$)", text, re.DOTALL)
        if match is None:
            self.diagnostics.append(f"{path}: no YAML front matter between '---' lines, skipped")
            return None
        try:
            meta = yaml.safe_load(match.group(1))
        except yaml.YAMLError as exc:
            self.diagnostics.append(f"{path}: invalid YAML front matter ({exc}), skipped")
            return None
        name = meta.get("name") if isinstance(meta, dict) else None
        description = meta.get("description") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not SKILL_NAME.fullmatch(name):
            self.diagnostics.append(f"{path}: 'name' must match {SKILL_NAME.pattern}, got {name!r}; skipped")
            return None
        if not isinstance(description, str) or not description.strip():
            self.diagnostics.append(f"{path}: 'description' must be a non-empty string; skipped")
            return None
        description = " ".join(description.split())[:MAX_DESCRIPTION]
        revision = hashlib.sha256(raw).hexdigest()[:12]
        return _Skill(name, description, SkillBody(name, text[match.end() :].strip("\n"), revision))

    def names(self) -> list[str]:
        """The skill names, sorted."""
        return sorted(self._skills)

    def catalog(self, select: Collection[str] | None = None) -> list[tuple[str, str]]:
        """``(name, description)`` of the selected skills (all when ``select`` is None), sorted by name."""
        return [(n, self._skills[n].description) for n in self.names() if select is None or n in select]

    def read(self, name: str) -> SkillBody:
        """The body of skill ``name``; KeyError naming the available skills when there is none."""
        skill = self._skills.get(name)
        if skill is None:
            raise KeyError(f"unknown skill {name!r}; available: {', '.join(self.names()) or 'none'}")
        return skill.body


def render_skill(skill: SkillBody) -> str:
    """A body as ``read_skill`` returns it: headed by its name and revision (read back by ``SKILL_HEADER``)."""
    return f'<skill name="{skill.name}" revision="{skill.revision}">\n{skill.body}\n</skill>'


class SkillShelf:
    """The process's skills: one library per folder, reloaded when a SKILL.md file changed, and every
    revision loaded so far, so a session pinned to an older revision can still read it."""

    def __init__(self) -> None:
        self._libraries: dict[str, tuple[tuple[Any, ...], SkillLibrary]] = {}
        self._revisions: dict[tuple[str, str], SkillBody] = {}

    def library(self, folder: str) -> SkillLibrary:
        """The library of ``folder`` as its files are now. Raises OSError when the folder cannot be read."""
        root = Path(folder)
        paths = sorted(root.glob("*/SKILL.md"))
        key = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in paths)
        known = self._libraries.get(folder)
        if known is None or known[0] != key:
            library = SkillLibrary(root)
            for name in library.names():
                body = library.read(name)
                self._revisions[(name, body.revision)] = body
            known = (key, library)
            self._libraries[folder] = known
        return known[1]

    def revision(self, name: str, revision: str) -> SkillBody | None:
        """Skill ``name`` at ``revision``, if this process has loaded it."""
        return self._revisions.get((name, revision))


class SkillsChannel:
    """The ``skills`` channel: one reference per skill read through ``read_skill`` (the latest read last)."""

    name = SKILLS

    def initial(self) -> Any:
        """No skill read yet."""
        return []

    def observe(self, value: Any, call: DeclaredCall, result: str | None, diagnose: Callable[[str], None]) -> Any:
        """A successful ``read_skill`` result is a reference at the revision its header states."""
        if result is None or call.name != READ_SKILL or result.startswith(SKILL_ALREADY_LOADED):
            return value
        header = SKILL_HEADER.match(result)
        asked = call.arguments.get("name") if isinstance(call.arguments, Mapping) else None
        name = header.group("name") if header else asked
        if not isinstance(name, str) or not name:
            return value
        revision = header.group("revision") if header else None
        reference = {"name": name, "revision": revision, "tool_call_id": call.call_id, "visible": True}
        return [*(ref for ref in value if ref["name"] != name), reference]

    def judge(self, value: Any, visible: Sequence[Mapping[str, Any]]) -> Any:
        """Each reference's ``visible``: its result is in ``visible`` and not compacted to a preview."""
        if not value:
            return []  # no skill read yet (nearly every turn): nothing to look for in the visible history
        bodies = {cid for cid, (_, text) in tool_results(visible).items() if not is_preview(text)}
        return [{**ref, "visible": ref["tool_call_id"] in bodies} for ref in value]


class ReadSkill:
    """The proxy-owned ``read_skill``: a skill body once, headed with its revision; a repeat read while
    the body is still in context gets a pointer instead, so a body never appears twice in one request.

    A session reads the revision it first read (recorded through its ``ToolSession``), whatever the
    folder holds now. Failures are texts starting ``Error:`` (the run state ignores them).
    """

    name = READ_SKILL
    schema = READ_SKILL_SCHEMA
    needs_references = False

    def __init__(self, shelf: SkillShelf, folder: str, select: Collection[str] | None) -> None:
        self._shelf = shelf
        self._folder = folder
        self._select = select

    def _offered_names(self) -> list[str]:
        try:
            library = self._shelf.library(self._folder)
        except OSError:
            return []
        return [n for n in library.names() if self._select is None or n in self._select]

    def offered(self, context: ToolContext) -> bool:
        """Offered while the folder holds a selected skill."""
        return bool(self._offered_names())

    async def run(self, context: ToolContext, arguments: str) -> str:
        """The body, a pointer to the body already in context, or an ``Error:`` text."""
        name = _argument(arguments, "name")
        offered = self._offered_names()
        if name is None:
            return f'Error: read_skill takes {{"name": "<skill>"}}; available: {", ".join(offered) or "none"}'
        session = context.session
        pinned = (await session.revisions()).get(name) if session is not None else None
        skill = await self._pinned(context, name, pinned) if pinned else None
        if skill is None and name in offered:
            skill = self._shelf.library(self._folder).read(name)
        if skill is None:
            return f"Error: unknown skill {name!r}; available: {', '.join(offered) or 'none'}"
        loaded = {ref["name"]: ref["revision"] for ref in context.state.get(SKILLS) or () if ref.get("visible")}
        if loaded.get(name) == skill.revision:
            return (
                f"{SKILL_ALREADY_LOADED} {name!r} revision {skill.revision} is in your earlier read_skill "
                "result above; follow it from there."
            )
        if session is not None and pinned is None:
            await session.record_revision(name, skill.revision)
            await session.put(_body_key(name, skill.revision), skill.body)
        return render_skill(skill)

    async def _pinned(self, context: ToolContext, name: str, revision: str) -> SkillBody | None:
        """Skill ``name`` at the session's ``revision``: from this process, else the copy the session kept."""
        kept = self._shelf.revision(name, revision)
        if kept is None and context.session is not None:
            body = await context.session.get(_body_key(name, revision))
            kept = SkillBody(name, body, revision) if isinstance(body, str) else None
        return kept


def _body_key(name: str, revision: str) -> str:
    return f"skill:{name}:{revision}"


def _argument(arguments: str, key: str) -> str | None:
    """The non-empty string ``key`` of a JSON object of arguments, else ``None``."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return None
    value = parsed.get(key) if isinstance(parsed, Mapping) else None
    return value if isinstance(value, str) and value else None


class Skills(BuiltinContributor):
    """The skill catalog section and the unavailability notice."""

    id = "skills"
    priority = PRIORITY
    Options = SkillsOptions

    def __init__(self, shelf: SkillShelf) -> None:
        self._shelf = shelf

    async def contribute(self, request: ContributionRequest) -> ContributorOutput:
        """The catalog section (when a folder is configured) and the notice for skills out of context."""
        options = options_for(request, SkillsOptions)
        sections: tuple[Section, ...] = ()
        diagnostics: tuple[Diagnostic, ...] = ()
        if options.folder:
            library = self._shelf.library(options.folder)
            diagnostics = tuple(Diagnostic("warning", "skill_skipped", d) for d in library.diagnostics)
            catalog = library.catalog(options.select)
            if catalog:
                sections = (Section("skills.catalog", render_catalog(catalog), slot=SLOT, title="Skills"),)
        notice = unavailable_notice(run_state(request, SkillsChannel()).get(SKILLS) or ())
        messages = (ContextMessage("skills.unavailable", notice),) if notice else ()
        return ContributorOutput(sections=sections, messages=messages, diagnostics=diagnostics)


class SkillsFactory(ContributorFactory):
    """The skills factory: one shelf per process, shared by every scope's contributor and ``read_skill``."""

    id = Skills.id
    options_model = SkillsOptions

    def __init__(self) -> None:
        self.shelf = SkillShelf()

    def create(self, scope: Scope) -> BuiltinContributor | None:
        """The skills contributor of ``scope``, on the process's shelf."""
        return Skills(self.shelf)

    def tools(self, options: Any) -> Sequence[ProxyTool]:
        """``read_skill`` when a folder is configured."""
        if not isinstance(options, SkillsOptions) or not options.folder:
            return ()
        return (ReadSkill(self.shelf, options.folder, options.select),)

    def channels(self, options: Any) -> Sequence[StateChannel]:
        """The ``skills`` channel."""
        return (SkillsChannel(),)


def render_catalog(catalog: list[tuple[str, str]]) -> str:
    """The catalog text: how to load a skill, then ``- name: description`` lines."""
    lines = ["Skills are instructions you load when a task needs them: call read_skill(name) before relying on one."]
    lines += [f"- {name}: {description}" for name, description in catalog]
    return "\n".join(lines)


def unavailable_notice(references: Any) -> str:
    """The data message for skill references whose body is no longer visible, ``""`` when none."""
    gone = [r for r in references if isinstance(r, Mapping) and not r.get("visible")]
    if not gone:
        return ""
    lines = [f"Run state: skills read earlier whose {UNAVAILABLE}:"]
    lines += [f"- {r.get('name')} (revision {r.get('revision') or 'unknown'})" for r in gone]
    return "\n".join(lines)


def factory() -> SkillsFactory:
    """The entry point: a new factory (and shelf) for each composition of the registry."""
    return SkillsFactory()
