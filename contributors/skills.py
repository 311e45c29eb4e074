"""Skills: a catalog of selected skills in the system prompt, bodies only through ``read_skill``.

Progressive disclosure: the stable prompt lists each selected skill's name and description, never a
body. A body enters the context once, as the result of the proxy-owned ``read_skill(name)`` tool
(unless the client declares its own tool of that name), headed by its revision, a content hash. The run
state keeps a durable reference (name, revision, call ID); when compaction has removed or previewed that
result, this contributor adds a ``data_only`` message telling the model the instruction is no longer
in context, so it calls ``read_skill`` again.

A skills folder has the Agent Skills layout: ``<folder>/<skill>/SKILL.md``, YAML front matter with
``name`` and ``description``, then the body. A bad file is skipped with a diagnostic.

Options (``contributors: {skills: {...}}``):
    folder: str, the skills folder (no folder: no catalog; unavailability notices still work).
    select: list of skill names to offer (default: all in the folder).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from contributors.base import BuiltinContributor, Factory, OptionsError, names_option, text_option
from contributors.projection import run_state
from proxy.context.state import SKILL_ALREADY_LOADED, SKILLS
from proxy.context.types import ContextMessage, ContributionRequest, ContributorOutput, Diagnostic, Section

SLOT = 40
READ_SKILL = "read_skill"
SKILL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_DESCRIPTION = 1024
UNAVAILABLE = "instruction no longer in context, call read_skill again"
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

    def run_read_skill(
        self,
        arguments: str | Mapping[str, Any],
        loaded: Mapping[str, str] | None = None,
        select: Collection[str] | None = None,
    ) -> str:
        """Run the proxy-owned ``read_skill``: the body headed ``<skill name=".." revision="..">``.

        ``loaded`` maps skill names whose body is still visible to their revision: asking again for
        the same revision gets a pointer to the earlier result, so a body never appears twice in one
        request. Failures are texts starting ``Error:`` (the run state ignores them).
        """
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = {}
        name = arguments.get("name") if isinstance(arguments, Mapping) else None
        offered = [n for n in self.names() if select is None or n in select]
        if not isinstance(name, str) or not name:
            return f'Error: read_skill takes {{"name": "<skill>"}}; available: {", ".join(offered) or "none"}'
        if name not in offered:
            return f"Error: unknown skill {name!r}; available: {', '.join(offered) or 'none'}"
        skill = self.read(name)
        if (loaded or {}).get(name) == skill.revision:
            return (
                f"{SKILL_ALREADY_LOADED} {name!r} revision {skill.revision} is in your earlier read_skill "
                "result above; follow it from there."
            )
        return f'<skill name="{name}" revision="{skill.revision}">\n{skill.body}\n</skill>'


class Skills(BuiltinContributor):
    """The skill catalog section and the unavailability notice."""

    id = "skills"
    option_keys: ClassVar[frozenset[str]] = frozenset({"folder", "select"})

    def __init__(self) -> None:
        # A run reuses its library while the folder's files are unchanged (same paths, sizes, mtimes).
        self._library: tuple[tuple[Any, ...], SkillLibrary] | None = None

    @classmethod
    def check_options(cls, raw: Mapping[str, Any]) -> None:
        """``folder``: string; ``select``: list of names."""
        text_option(raw, cls.id, "folder")
        names_option(raw, cls.id, "select")

    def library(self, folder: str) -> SkillLibrary:
        """The library of ``folder``, reloaded when a SKILL.md file changed."""
        root = Path(folder)
        try:
            key = (folder, *((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(root.glob("*/SKILL.md"))))
        except OSError as exc:
            raise OptionsError(f"contributors.skills.folder {folder!r}: {exc}") from exc
        if self._library is None or self._library[0] != key:
            self._library = (key, SkillLibrary(root))
        return self._library[1]

    async def contribute(self, request: ContributionRequest) -> ContributorOutput:
        """The catalog section (when a folder is configured) and the notice for skills out of context."""
        options = self.options(request)
        folder = text_option(options, self.id, "folder")
        sections: tuple[Section, ...] = ()
        diagnostics: tuple[Diagnostic, ...] = ()
        if folder:
            library = self.library(folder)
            diagnostics = tuple(Diagnostic("warning", "skill_skipped", d) for d in library.diagnostics)
            catalog = library.catalog(names_option(options, self.id, "select"))
            if catalog:
                sections = (Section("skills.catalog", render_catalog(catalog), slot=SLOT, title="Skills"),)
        notice = unavailable_notice(run_state(request, SKILLS).get(SKILLS) or ())
        messages = (ContextMessage("skills.unavailable", notice),) if notice else ()
        return ContributorOutput(sections=sections, messages=messages, diagnostics=diagnostics)


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


factory = Factory(Skills)
