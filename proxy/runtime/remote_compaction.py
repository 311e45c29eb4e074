"""Remote compaction for Codex: the proxy's own checkpoint of the history, written on request.

Codex (provider named "OpenAI") asks the server to compact: an ordinary ``/v1/responses`` request whose
input ends with ``{"type": "compaction_trigger"}`` (older versions: ``POST /v1/responses/compact``).
It then drops every tool call and output from its history, keeps its developer/user messages and sends
back the one ``compaction`` item it got. So the checkpoint covers the whole conversation but the
instructions (not only the finished steps before the latest, as the assembler's compactor would): the
latest step is gone from Codex's history too. It is written by the same summarizer (model, prompt,
validator) as the assembler's checkpoints; a previous proxy checkpoint in the input is merged.

When the summarizer fails (the provider errs, or no attempt gives a usable checkpoint), the answer is
still a checkpoint: a deterministic one, the latest steps listed mechanically (call, arguments, the
start of each result) within the same budget, like the assembler's own fallback to trimming. Refusing
instead would end Codex's turn (it cannot continue without its one compaction item), and the history
it would retry with only grows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.context.checkpoint import (
    SECTIONS,
    Checkpoint,
    build_summary_request,
    is_checkpoint_message,
    validate_checkpoint,
)
from proxy.context.estimators import ConservativeTokenEstimator
from proxy.kernel.config import ModelRoute
from proxy.kernel.errors import ProxyError
from proxy.provider.base import ProviderBackend
from proxy.runtime.session_identity import SessionIdentity
from proxy.runtime.summarizer import ModelSummarizer

ATTEMPTS = 2  # the default of SCIENCE_AGENT_SUMMARY_MAX_ATTEMPTS, which the turn service passes
RESULT_CHARS = 240  # how much of each tool result the deterministic checkpoint keeps


@dataclass(frozen=True)
class CompactionRequest:
    """A client's request to compact its history (``TurnService.compact``)."""

    identity: SessionIdentity
    route: ModelRoute
    messages: list[dict[str, Any]]  # the history as canonical chat messages
    previous: Checkpoint | None  # the latest proxy checkpoint the client sent back, merged into the new one
    kind: str  # ``compaction_trigger`` or ``responses/compact``: what the client sent
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CompactionResult:
    """What the client is answered: the token naming the new checkpoint, and its size in tokens (for usage)."""

    token: str
    checkpoint_tokens: int


@dataclass
class Compaction:
    """A written checkpoint and how it came about, for the trace."""

    checkpoint: Checkpoint
    summary_request: list[dict[str, Any]]
    source_messages: int
    calls: list[dict[str, Any]] = field(default_factory=list)  # the summarizer calls, as traced
    rejections: list[str] = field(default_factory=list)  # why each attempt was not used
    fallback: str | None = None  # set when the checkpoint is the deterministic one


async def write_checkpoint(
    backend: ProviderBackend,
    route: ModelRoute,
    messages: Sequence[Mapping[str, Any]],
    previous: Checkpoint | None,
    covers_hash: str,
    max_tokens: int,
    nonce: str,
    input_limit: int,
    attempts: int = ATTEMPTS,
) -> Compaction:
    """The checkpoint of ``messages`` (the conversation's instructions excluded): the model's, or the
    deterministic one when the summarizer fails. The summarizer's request is kept within ``input_limit``;
    an unusable checkpoint is asked for again, ``attempts`` times in all."""
    source = [
        (message, None)
        for message in messages
        if message.get("role") not in ("system", "developer") and not is_checkpoint_message(message, nonce)
    ]
    request = _bounded_request(source, previous, max_tokens, input_limit)
    covered = len(source) + (previous.covered_messages if previous is not None else 0)
    summarizer = ModelSummarizer(backend, route)
    outcome = Compaction(Checkpoint("", covers_hash, covered), request, len(source), summarizer.calls)
    for _ in range(attempts):
        try:
            report = validate_checkpoint(await summarizer.summarize(request))
        except ProxyError as exc:  # the call itself failed: another attempt would most likely fail alike
            outcome.rejections.append(f"summarizer call failed: {exc.message}")
            break
        if report.valid:
            outcome.checkpoint = Checkpoint(report.text, covers_hash, covered)
            return outcome
        outcome.rejections.append("; ".join(report.issues))
    outcome.fallback = outcome.rejections[-1]
    outcome.checkpoint = Checkpoint(deterministic_checkpoint(source, previous, max_tokens), covers_hash, covered)
    return outcome


@dataclass(frozen=True)
class RemoteCompaction:
    """A remote compaction as its trace and the observers see it (``CallRecord.compaction``): no turn was
    assembled; the summarizer answered."""

    outcome: Compaction
    kind: str  # ``compaction_trigger`` or ``responses/compact``
    summary_model: str  # the summary route's model name
    tokens_before: int  # the history's estimated size
    checkpoint_tokens: int  # the checkpoint message's estimated size


def _bounded_request(
    source: Sequence[tuple[Mapping[str, Any], str | None]], previous: Checkpoint | None, max_tokens: int, limit: int
) -> list[dict[str, Any]]:
    """The summary request, within ``limit``: long tool results cut to their head and tail first, then the
    oldest messages left out (Codex resends its whole history, which may be far larger than the window)."""
    request = build_summary_request(source, previous, max_tokens=max_tokens)
    if summary_tokens(request) <= limit:
        return request
    cut: list[tuple[Mapping[str, Any], str | None]] = [
        (_cut_result(m), ref) if m.get("role") == "tool" else (m, ref) for m, ref in source
    ]
    while True:
        request = build_summary_request(cut, previous, max_tokens=max_tokens)
        if summary_tokens(request) <= limit or len(cut) <= 1:
            return request
        cut = cut[max(1, len(cut) // 8) :]


def _cut_result(message: Mapping[str, Any]) -> dict[str, Any]:
    text = _text(message.get("content"))
    if len(text) <= 2 * RESULT_CHARS * 4:
        return dict(message)
    head, tail = text[: RESULT_CHARS * 4], text[-RESULT_CHARS * 4 :]
    return {**message, "content": f"{head}\n[... {len(text) - len(head) - len(tail)} characters left out ...]\n{tail}"}


def deterministic_checkpoint(
    source: Sequence[tuple[Mapping[str, Any], str | None]], previous: Checkpoint | None, max_tokens: int
) -> str:
    """A checkpoint without a model: the previous one's evidence, then the latest steps that fit ``max_tokens``."""
    estimator = ConservativeTokenEstimator()
    results = {m.get("tool_call_id"): _text(m.get("content")) for m, _ in source if m.get("role") == "tool"}
    steps: list[str] = []
    for message, _ in source:
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            result = " ".join(results.get(call.get("id"), "(no result)").split())[:RESULT_CHARS]
            steps.append(f"- {function.get('name')}({_short(function.get('arguments'))}) -> {result}")
    users = [_text(m.get("content")) for m, _ in source if m.get("role") == "user"]
    header = {
        "completed_work": "- The summarizer was unavailable; the latest steps are listed mechanically under Evidence.",
        "pending_conditions": f"- The latest request: {users[-1][:400]}" if users else "- (none)",
        "next_step": "- Continue the task from the latest step listed under Evidence.",
    }
    if previous is not None:
        header["decisions"] = "- An earlier checkpoint follows:\n" + previous.text
    kept: list[str] = []
    budget = max_tokens - estimator.count_text("\n".join(header.values())) - 100
    for line in reversed(steps):
        budget -= estimator.count_text(line)
        if budget < 0:
            break
        kept.insert(0, line)
    if len(kept) < len(steps):
        kept.insert(0, f"- ({len(steps) - len(kept)} earlier steps left out)")
    sections = {**header, "evidence": "\n".join(kept) or "- (none)"}
    return "\n".join(f"## {title}\n{sections.get(key, '- (none)')}" for key, title in SECTIONS)


def summary_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """The estimated size of ``messages``, for the trace."""
    estimator = ConservativeTokenEstimator()
    return sum(estimator.count_message(message) for message in messages)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return "" if content is None else json.dumps(content)


def _short(arguments: Any) -> str:
    text = " ".join(str(arguments or "").split())
    return text if len(text) <= 200 else text[:200] + "..."
