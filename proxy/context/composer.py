"""``DefaultContextMessageComposer``: the final message list for one model call.

Order: the system message (rendered prompt), the windowed history (task anchor verbatim, checkpoint,
kept suffix), then the call-local hidden user messages for contributor messages and attachments. The
hidden messages go last so that the system prompt and the history prefix stay byte-stable across
turns and the provider's prompt cache keeps hitting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.context.hidden import hidden_message
from proxy.context.types import Attachment, ContextMessage


@dataclass(frozen=True)
class ComposedContext:
    """The composed messages; ``hidden_indices`` are the positions of contributor-made messages."""

    messages: tuple[dict[str, Any], ...]
    hidden_indices: tuple[int, ...]
    section_ids: tuple[str, ...]


class DefaultContextMessageComposer:
    """System prompt + windowed history + hidden contributor messages, in that order."""

    def hidden_messages(
        self, messages: Sequence[ContextMessage], attachments: Sequence[Attachment], *, nonce: str
    ) -> list[dict[str, Any]]:
        """The hidden user messages for admitted contributor messages and attachments, under the
        session's framing ``nonce`` (useful to cost them before the window runs)."""
        return [hidden_message(m, nonce=nonce) for m in messages] + [
            hidden_message(a, nonce=nonce) for a in attachments
        ]

    def compose(
        self,
        system_prompt: str,
        history: Sequence[dict[str, Any]],
        messages: Sequence[ContextMessage] = (),
        attachments: Sequence[Attachment] = (),
        *,
        nonce: str,
        section_ids: Sequence[str] = (),
    ) -> ComposedContext:
        """Compose one call's messages; an empty ``system_prompt`` adds no system message.

        The history's messages are passed on as they are, not copied: no stage changes a message in place,
        and the provider adapter copies what it hands to litellm, which may (``runtime/provider.py``). A copy
        here was a thousand dicts a turn at 1,000 messages, and then a lookup per copy to count it."""
        out: list[dict[str, Any]] = []
        if system_prompt:
            out.append({"role": "system", "content": system_prompt})
        out.extend(history)
        start = len(out)
        out.extend(self.hidden_messages(messages, attachments, nonce=nonce))
        return ComposedContext(tuple(out), tuple(range(start, len(out))), tuple(section_ids))
