"""Budget admission: which sections, contributor messages and attachments fit, and how much of them.

Protected sections are admitted first and never cut; if they alone exceed the prompt budget the
assembly fails rather than weaken authority. Other sections follow by (slot, order, id): whole if they
fit, else truncated with a visible marker, else dropped; every cut is a diagnostic. Contributor messages,
then attachments, draw on their own budget by their contributor's declared priority (lower first; ties
in collection order), so a long artifact list cannot push the plan out; what is admitted is sent in
collection order, which keeps the request prefix stable whatever was cut.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from proxy.context.collector import Collection
from proxy.context.hidden import hidden_message
from proxy.context.renderer import SEPARATOR, render_section, section_sort_key
from proxy.context.shortfall import ContextDoesNotFit, Shortfall
from proxy.context.types import DEFAULT_PRIORITY, Attachment, ContextMessage, Diagnostic, Section, TokenEstimator

# Below this many tokens a truncated piece says too little to be worth its marker: drop it instead.
MIN_TRUNCATED_TOKENS = 24
T = TypeVar("T", Section, ContextMessage, Attachment)
M = TypeVar("M", ContextMessage, Attachment)


def truncation_marker(item_id: str, kept_chars: int, total_chars: int) -> str:
    """The visible note appended to a cut piece, so the model knows it sees only the head."""
    return f"\n[truncated by the context budget: {item_id}, {kept_chars} of {total_chars} characters kept]"


@dataclass(frozen=True)
class BudgetResult:
    """What was admitted, in render/send order, and what it costs."""

    sections: tuple[Section, ...]
    messages: tuple[ContextMessage, ...]
    attachments: tuple[Attachment, ...]
    diagnostics: tuple[Diagnostic, ...]
    prompt_tokens: int
    message_tokens: int


def apply_context_budget(
    collection: Collection,
    prompt_budget_tokens: int,
    message_budget_tokens: int,
    estimator: TokenEstimator,
    *,
    nonce: str,
) -> BudgetResult:
    """Admit the collection's sections within ``prompt_budget_tokens`` and its contributor messages and
    attachments within ``message_budget_tokens`` (costed as the hidden messages they become under the
    session's framing ``nonce``). Raises ``ContextDoesNotFit`` (an ``AssemblyFailed``) when protected
    sections alone do not fit."""
    for name, value in (
        ("prompt_budget_tokens", prompt_budget_tokens),
        ("message_budget_tokens", message_budget_tokens),
    ):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    diagnostics: list[Diagnostic] = []
    sep = estimator.count_text(SEPARATOR)

    def section_cost(section: Section) -> int:
        return estimator.count_text(render_section(section)) + sep

    protected = sorted((s for s in collection.sections if s.protected), key=section_sort_key)
    costs = {s.id: section_cost(s) for s in protected}
    used = sum(costs.values())
    if used > prompt_budget_tokens:
        sizes = ", ".join(f"{s.id} ({costs[s.id]} tokens)" for s in protected)
        raise ContextDoesNotFit(
            f"protected sections need {used} tokens, over the prompt budget of {prompt_budget_tokens}: {sizes}",
            Shortfall("prompt_budget", used, prompt_budget_tokens),
        )
    admitted = list(protected)
    others = sorted((s for s in collection.sections if not s.protected), key=section_sort_key)
    used += _admit(others, prompt_budget_tokens - used, section_cost, _with_text, admitted, diagnostics, "section")

    def message_cost(item: ContextMessage | Attachment) -> int:
        return estimator.count_message(hidden_message(item, nonce=nonce))

    def by_priority(items: tuple[M, ...]) -> list[M]:
        return sorted(items, key=lambda item: collection.priorities.get(item.id, DEFAULT_PRIORITY))  # stable

    messages: list[ContextMessage] = []
    spent = _admit(
        by_priority(collection.messages),
        message_budget_tokens,
        message_cost,
        _with_content,
        messages,
        diagnostics,
        "message",
    )
    attachments: list[Attachment] = []
    spent += _admit(
        by_priority(collection.attachments),
        message_budget_tokens - spent,
        message_cost,
        _with_content,
        attachments,
        diagnostics,
        "attachment",
    )
    return BudgetResult(
        tuple(sorted(admitted, key=section_sort_key)),
        _in_collection_order(messages, collection.messages),
        _in_collection_order(attachments, collection.attachments),
        tuple(diagnostics),
        used,
        spent,
    )


def _in_collection_order(admitted: list[M], collected: tuple[M, ...]) -> tuple[M, ...]:
    position = {item.id: i for i, item in enumerate(collected)}
    return tuple(sorted(admitted, key=lambda item: position[item.id]))


def _with_text(section: Section, text: str) -> Section:
    return dataclasses.replace(section, text=text)


def _with_content(item: M, content: str) -> M:
    return dataclasses.replace(item, content=content)


def _body(item: Section | ContextMessage | Attachment) -> str:
    return item.text if isinstance(item, Section) else item.content


def _admit(
    items: list[T],
    budget: int,
    cost: Callable[[T], int],
    with_body: Callable[[T, str], T],
    out: list[T],
    diagnostics: list[Diagnostic],
    kind: str,
) -> int:
    """Admit ``items`` in order into ``out``; returns the tokens spent. Cuts are noted in ``diagnostics``."""
    spent = 0
    for item in items:
        left = budget - spent
        whole = cost(item)
        if whole <= left:
            out.append(item)
            spent += whole
            continue
        cut = _truncate(item, left, cost, with_body) if left >= MIN_TRUNCATED_TOKENS else None
        if cut is None:
            diagnostics.append(
                Diagnostic(
                    "warning",
                    f"{kind}_dropped",
                    f"{kind} {item.id!r} ({whole} tokens) dropped: {left} left",
                    item.source,
                )
            )
            continue
        cut_item, cut_cost = cut
        out.append(cut_item)
        spent += cut_cost
        diagnostics.append(
            Diagnostic(
                "warning",
                f"{kind}_truncated",
                f"{kind} {item.id!r} truncated from {whole} to {cut_cost} tokens",
                item.source,
            )
        )
    return spent


def _truncate(item: T, left: int, cost: Callable[[T], int], with_body: Callable[[T, str], T]) -> tuple[T, int] | None:
    """The longest head of ``item`` (plus marker) whose cost fits ``left``, by binary search on length."""
    body = _body(item)

    def cut_at(n: int) -> T:
        return with_body(item, body[:n] + truncation_marker(item.id, n, len(body)))

    lo, hi = 0, len(body)  # invariant: cut_at(lo) fits or lo == 0; cut_at(hi + 1) does not fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(cut_at(mid)) <= left:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0:
        return None
    best = cut_at(lo)
    return best, cost(best)
