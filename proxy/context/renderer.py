"""The deterministic system-prompt renderer: the same sections always give the same bytes.

A stable prompt keeps the provider's prompt cache hitting across turns, so nothing here may depend on
time, dict order of the caller, or anything but the sections themselves.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from proxy.context.types import Section

SEPARATOR = "\n\n"


@dataclass(frozen=True)
class RenderedPrompt:
    """The system prompt text and the IDs of the sections in it, in render order."""

    text: str
    section_ids: tuple[str, ...]


def section_sort_key(section: Section) -> tuple[int, int, str, str]:
    """Render (and admission) order: slot, then order, then ID (and text, so even duplicates are stable)."""
    return (section.slot, section.order, section.id, section.text)


def render_section(section: Section) -> str:
    """One section with its stable header: ``## <title or id>`` then the text, trailing space trimmed."""
    header = f"## {section.title or section.id}"
    body = section.text.strip("\n")
    return f"{header}\n{body}" if body else header


class DeterministicSystemPromptRenderer:
    """Renders admitted sections sorted by (slot, order, id), separated by a blank line."""

    def render(self, sections: Iterable[Section]) -> RenderedPrompt:
        """The prompt for ``sections``; input order does not matter."""
        ordered = sorted(sections, key=section_sort_key)
        return RenderedPrompt(SEPARATOR.join(render_section(s) for s in ordered), tuple(s.id for s in ordered))
