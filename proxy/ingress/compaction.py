"""Remote compaction for Codex: the proxy's own checkpoint of the history, written on request.

Codex (provider named "OpenAI") asks the server to compact: an ordinary ``/v1/responses`` request whose
input ends with ``{"type": "compaction_trigger"}`` (older versions: ``POST /v1/responses/compact``).
It then drops every tool call and output from its history, keeps its developer/user messages and sends
back the one ``compaction`` item it got. So the checkpoint covers the whole conversation but the
instructions (not only the finished steps before the latest, as the assembler's compactor would): the
latest step is gone from Codex's history too. It is written by the same summarizer (model, prompt,
validator) as the assembler's checkpoints; a previous proxy checkpoint in the input is merged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.config import ModelRoute
from proxy.context.checkpoint import Checkpoint, build_summary_request, is_checkpoint_message, validate_checkpoint
from proxy.errors import ProviderError
from proxy.runtime.provider import ProviderBackend
from proxy.runtime.summarizer import ModelSummarizer

ATTEMPTS = 2


async def write_checkpoint(
    backend: ProviderBackend,
    route: ModelRoute,
    messages: Sequence[Mapping[str, Any]],
    previous: Checkpoint | None,
    covers_hash: str,
    max_tokens: int,
    nonce: str,
) -> tuple[Checkpoint, list[dict[str, Any]]]:
    """The checkpoint of ``messages`` (the conversation's instructions excluded) and the summarizer calls.

    Raises ``ProviderError`` when no attempt gives a usable checkpoint (Codex then shows the error).
    """
    source = [
        (message, None)
        for message in messages
        if message.get("role") not in ("system", "developer") and not is_checkpoint_message(message, nonce)
    ]
    request = build_summary_request(source, previous, max_tokens=max_tokens)
    summarizer = ModelSummarizer(backend, route)
    problems: list[str] = []
    for _ in range(ATTEMPTS):
        report = validate_checkpoint(await summarizer.summarize(request))
        if report.valid:
            covered = len(source) + (previous.covered_messages if previous is not None else 0)
            return Checkpoint(report.text, covers_hash, covered), summarizer.calls
        problems.append("; ".join(report.issues))
    raise ProviderError(
        "Compaction failed: the model did not write a usable checkpoint (" + " | ".join(problems) + ").",
        code="compaction_failed",
    )
