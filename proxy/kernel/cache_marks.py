"""Where Anthropic prompt-cache breakpoints go: the proxy's after the stable part, the client's where they
survive, never more than Anthropic's four.

Anthropic caches a prompt's prefix up to a ``cache_control`` mark (a breakpoint) and refuses a request with
more than four. The proxy marks the end of what stays byte-stable between its compactions: the system
prompt (after the tools, which come first) and the latest checkpoint. The client's own marks stay where the
blocks they were on survive; its marks on the system prompt, whose blocks became the prompt's sections,
are the proxy's system mark. When that makes more than four, the client's oldest message marks go first
(agents move their newest marks along the conversation each turn: the older ones matter least), then its
marks on tools. Both the chat path (``proxy/runtime/calls.py``) and native passage
(``proxy/ingress/messages/native.py``) place marks by this rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_BREAKPOINTS = 4
CACHE_MARK = "cache_control"
EPHEMERAL = {"type": "ephemeral"}


@dataclass(frozen=True)
class Mark:
    """A marked block in prompt order: whose mark it is, and whether it sits on a tool definition."""

    proxy: bool
    tool: bool = False


def kept(marks: Sequence[Mark], limit: int = MAX_BREAKPOINTS) -> list[bool]:
    """For each mark (in prompt order), whether it stays: the proxy's always, then the client's on messages
    from the newest back, then the client's on tools, up to ``limit`` in all."""
    keep = [mark.proxy for mark in marks]
    room = limit - sum(keep)
    client = [index for index, mark in enumerate(marks) if not mark.proxy]
    order = [i for i in reversed(client) if not marks[i].tool] + [i for i in reversed(client) if marks[i].tool]
    for index in order[: max(0, room)]:
        keep[index] = True
    return keep
