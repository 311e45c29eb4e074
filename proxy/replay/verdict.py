"""The verdict of a replay: per session and per client turn, identical, changed or failed.

A turn is *identical* when every model call it made now got the same provider input as the recorded
call with its tag (in shadow mode: the same candidate), and the client got the same status. It is
*changed* when an input differs (with a unified diff and the proxy's token estimate before and
after), when a call is made now that the recording never made or the other way round. It is *failed*
when the proxy now refuses a request it answered then (an assembly or validation error).

Before comparing, the framing nonce of each side and the ids the proxy minted are put in common
form, and connection parameters (``api_base``, ``timeout``) are left out: they say where the input
goes, not what it is.
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from proxy.context.estimators import ConservativeTokenEstimator
from proxy.replay.replay import UNRECORDED, ReplayedCall, TurnReplay

TurnStatus = Literal["identical", "changed", "failed"]
_WHERE = frozenset({"api_base", "base_url", "api_version", "timeout", "stream_timeout", "max_retries", "num_retries"})
_NONCE = "<framing-nonce>"


@dataclass
class CallVerdict:
    """One model call of a turn, compared."""

    key: str
    index: int
    status: Literal["identical", "changed", "unrecorded", "no longer made"]
    note: str = ""
    diff: str = ""
    tokens_before: int | None = None
    tokens_after: int | None = None


@dataclass
class TurnVerdict:
    """One client request, compared."""

    session: str
    number: int  # the client turn within its session, from 1
    path: str
    status: TurnStatus
    reasons: list[str] = field(default_factory=list)
    calls: list[CallVerdict] = field(default_factory=list)
    error: str = ""

    # Summarizer calls are left out of the turn's tokens: they are what compaction costs, not what the
    # model is shown for the turn (each call still shows its own tokens).
    @property
    def tokens_before(self) -> int:
        """Estimated tokens of the turn's model inputs (its rounds and retries), as recorded."""
        return sum(c.tokens_before or 0 for c in self.calls if not c.key.startswith("summarizer"))

    @property
    def tokens_after(self) -> int:
        """Estimated tokens of the turn's model inputs (its rounds and retries), now."""
        return sum(c.tokens_after or 0 for c in self.calls if not c.key.startswith("summarizer"))


@dataclass
class Verdict:
    """Every turn of a replay, in order."""

    turns: list[TurnVerdict]

    def counts(self) -> Counter[str]:
        """How many turns are identical, changed and failed."""
        return Counter(turn.status for turn in self.turns)

    def summary(self) -> str:
        """``N identical, N changed, N failed``."""
        counts = self.counts()
        return f"{counts['identical']} identical, {counts['changed']} changed, {counts['failed']} failed"

    def exit_code(self, max_changed: int | None) -> int:
        """1 when a turn failed or more than ``max_changed`` turns changed, else 0."""
        counts = self.counts()
        if counts["failed"] or (max_changed is not None and counts["changed"] > max_changed):
            return 1
        return 0

    def sessions(self) -> dict[str, list[TurnVerdict]]:
        """The turns by session, in first-seen order."""
        grouped: dict[str, list[TurnVerdict]] = {}
        for turn in self.turns:
            grouped.setdefault(turn.session, []).append(turn)
        return grouped


def judge(replays: list[TurnReplay]) -> Verdict:
    """The verdict of every replayed request."""
    numbers: Counter[str] = Counter()
    turns = []
    for replayed in replays:
        numbers[replayed.recorded.context_id] += 1
        turns.append(judge_turn(replayed, numbers[replayed.recorded.context_id]))
    return Verdict(turns)


def judge_turn(replayed: TurnReplay, number: int) -> TurnVerdict:
    """The verdict of one replayed request."""
    recorded = replayed.recorded
    turn = TurnVerdict(recorded.context_id, number, recorded.path, "identical")
    matched = {(c.key, c.index) for c in replayed.calls}
    for call in replayed.calls:
        turn.calls.append(_judge_call(call, replayed))
    for exchange in recorded.exchanges:
        if (exchange.key, exchange.index) not in matched:
            before = _tokens(_effective(exchange.llm_input, recorded.shadow.get(f"{exchange.key}#{exchange.index}")))
            turn.calls.append(CallVerdict(exchange.key, exchange.index, "no longer made", tokens_before=before))
    unrecorded = [c for c in turn.calls if c.status == "unrecorded"]
    if replayed.status >= 400 and replayed.status != recorded.status:
        error = _error_of(replayed.answer)
        turn.error = error.get("message", "") or replayed.answer[:500]
        if unrecorded and error.get("code") == UNRECORDED:
            turn.status = "changed"
            turn.reasons.append("unrecorded call")
            return turn
        turn.status = "failed"
        turn.reasons.append(f"HTTP {replayed.status} (recorded: {recorded.status})")
        return turn
    if replayed.status != recorded.status:
        turn.reasons.append(f"HTTP {replayed.status} (recorded: {recorded.status})")
    changed = [c for c in turn.calls if c.status != "identical"]
    for compared in changed:
        note = f" ({compared.note})" if compared.note else ""
        turn.reasons.append(f"{compared.key} #{compared.index}: {compared.status}{note}")
    if turn.reasons:
        turn.status = "changed"
    return turn


def _judge_call(call: ReplayedCall, replayed: TurnReplay) -> CallVerdict:
    recorded = replayed.recorded
    after_input = _effective(call.llm_input, call.candidate)
    after = _normalized(after_input, {replayed.nonce: _NONCE} if replayed.nonce else {})
    tokens_after = _tokens(after_input)
    if call.recorded is None:
        return CallVerdict(
            call.key,
            call.index,
            "unrecorded",
            note=f"answered by the {call.stand_in}" if call.stand_in == "scripted summarizer" else "",
            diff=_diff("", after, call),
            tokens_after=tokens_after,
        )
    before_input = _effective(call.recorded.llm_input, recorded.shadow.get(f"{call.key}#{call.index}"))
    replacements = dict(replayed.id_map)
    if recorded.nonce:
        replacements[recorded.nonce] = _NONCE
    before = _normalized(before_input, replacements)
    tokens_before = _tokens(before_input)
    if before == after:
        return CallVerdict(call.key, call.index, "identical", tokens_before=tokens_before, tokens_after=tokens_after)
    return CallVerdict(
        call.key,
        call.index,
        "changed",
        diff=_diff(before, after, call),
        tokens_before=tokens_before,
        tokens_after=tokens_after,
    )


def _effective(llm_input: dict[str, Any], candidate: dict[str, Any] | None) -> dict[str, Any]:
    """What the proxy chose: the shadow candidate where one was recorded, else what it sent."""
    return candidate if candidate is not None else llm_input


def _normalized(llm_input: dict[str, Any], replacements: dict[str, str]) -> str:
    text = json.dumps({k: v for k, v in llm_input.items() if k not in _WHERE}, ensure_ascii=False, indent=1)
    for old, new in replacements.items():
        text = text.replace(old, new)
    return text


def _diff(before: str, after: str, call: ReplayedCall) -> str:
    name = f"{call.key} #{call.index}"
    lines = difflib.unified_diff(
        before.splitlines(), after.splitlines(), f"recorded {name}", f"replayed {name}", n=2, lineterm=""
    )
    return "\n".join(lines)


def _tokens(llm_input: dict[str, Any]) -> int:
    """The proxy's own (conservative) estimate of a provider input's size."""
    estimator = ConservativeTokenEstimator()
    messages = [m for m in llm_input.get("messages") or [] if isinstance(m, dict)]
    return sum(estimator.count_message(m) for m in messages) + estimator.count_tools(llm_input.get("tools") or [])


def _error_of(answer: str) -> dict[str, Any]:
    try:
        body = json.loads(answer)
    except ValueError:
        return {}
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return error
    return {"message": str(error)} if error else {}
