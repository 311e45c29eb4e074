"""Trace files read into typed per-turn and per-session summaries: the one place the report reads trace keys.

Every key the report and the inspector use is read here, through ``_pick``. Trace keys are camelCase
throughout (``proxy/runtime/trace_record.py`` names them, ``trace_schema.json`` is the contract): when
the format changes, this module is the only reader that changes.

A turn's *detail* (its rendered sections, admitted and dropped items, window, checkpoint, and the
candidate beside what was sent) is built here too, as plain JSON for the page's script. Messages and
other large values are interned in a ``Values`` table: a session's turns resend the same history, and
holding each message once keeps a page of thousands of turns small.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.context.estimators import ConservativeTokenEstimator
from proxy.kernel.usage import ModelPrices, ProviderUsage
from proxy.report.costs import passthrough_usd

__all__ = [
    "SessionSummary",
    "TraceFolder",
    "TurnSummary",
    "Values",
    "group_sessions",
    "read_trace",
    "summarize",
    "turn_detail",
]

TRACE_NAME = re.compile(r"^turn-(\d{4,})(?:-recovery-(\d+))?\.json$")
CONTEXT_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
OVERFLOW_CODE = "context_length_exceeded"
CHECKPOINT_TAG = "<checkpoint "


def _pick(record: Any, key: str, default: Any = None) -> Any:
    """``record[key]`` when ``record`` is a mapping that has it (a trace is untrusted JSON)."""
    if not isinstance(record, Mapping):
        return default
    return record.get(key, default)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class TurnSummary:
    """One model call, as the overview, the chart and the turn table need it."""

    file: str  # the trace's path under the folder, POSIX separators
    context_id: str
    turn: int
    recovery: int  # 0, or the forced retry's attempt number
    mode: str
    scope: str
    model: str
    branch_turn: int | None
    limit: int | None  # budgets.effectiveInputTokens
    client_tokens: int | None  # the client's own request: what a passthrough sends
    candidate_tokens: int | None  # the assembled candidate (dynamic and shadow)
    compaction: str | None  # the pass's reason, when one ran
    new_checkpoint: bool
    summarizer_calls: int
    provider_error: str | None  # the error's code (or type) when the provider call failed
    assembly_error: str | None
    assembly_ms: float | None
    provider_ms: float | None
    modified: float  # the file's mtime: recent activity
    usage: ProviderUsage | None = None  # the provider's usage, when it reported one
    cost_usd: float | None = None  # the call and its summarizer calls; None: unknown (see ``turn_cost``)
    prices: ModelPrices | None = None  # the route's, per token, when the cost map knew them

    @property
    def cache_share(self) -> float | None:
        """The share of its prompt tokens the provider read from its cache."""
        if self.usage is None or not self.usage.prompt_tokens:
            return None
        return self.usage.cache_read_tokens / self.usage.prompt_tokens

    @property
    def answered(self) -> bool:
        """The provider answered this call (it was sent, and not refused)."""
        sent = not self.assembly_error or self.mode == "shadow"
        return sent and not self.provider_error

    @property
    def proxy_tokens(self) -> int | None:
        """What the proxy sent (dynamic) or would have sent (shadow); the client's request in legacy;
        ``None`` when the assembly failed (nothing was sent)."""
        if self.assembly_error:
            return None
        return self.candidate_tokens if self.candidate_tokens is not None else self.client_tokens

    @property
    def size_refusal(self) -> bool:
        """The provider refused this call's input as larger than the model's window."""
        return self.provider_error == OVERFLOW_CODE

    def as_json(self) -> dict[str, Any]:
        """The turn's row for the page's embedded data."""
        return {
            "file": self.file,
            "turn": self.turn,
            "recovery": self.recovery,
            "mode": self.mode,
            "scope": self.scope,
            "branchTurn": self.branch_turn,
            "limit": self.limit,
            "clientTokens": self.client_tokens,
            "candidateTokens": self.candidate_tokens,
            "proxyTokens": self.proxy_tokens,
            "compaction": self.compaction,
            "newCheckpoint": self.new_checkpoint,
            "summarizerCalls": self.summarizer_calls,
            "providerError": self.provider_error,
            "assemblyError": self.assembly_error,
            "assemblyMs": self.assembly_ms,
            "providerMs": self.provider_ms,
            "promptTokens": self.usage.prompt_tokens if self.usage is not None else None,
            "cacheReadTokens": self.usage.cache_read_tokens if self.usage is not None else None,
            "cacheWriteTokens": self.usage.cache_write_tokens if self.usage is not None else None,
            "cacheShare": self.cache_share,
            "costUsd": self.cost_usd,
        }


def _percentile(values: Sequence[float], share: float) -> float | None:
    """Nearest-rank percentile; ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


@dataclass
class SessionSummary:
    """One context id's model calls, in call order, and the overview's totals for it."""

    context_id: str
    turns: list[TurnSummary] = field(default_factory=list)

    @property
    def modes(self) -> list[str]:
        """The modes its calls ran in, in first-seen order."""
        return list(dict.fromkeys(t.mode for t in self.turns))

    @property
    def scopes(self) -> list[str]:
        """The agent scopes its calls came from."""
        return list(dict.fromkeys(t.scope for t in self.turns))

    @property
    def models(self) -> list[str]:
        """The client model names it used."""
        return list(dict.fromkeys(t.model for t in self.turns))

    @property
    def client_tokens(self) -> int | None:
        """Tokens of the client's requests, summed over the calls that record them (``None``: none do).
        A failed assembly sent nothing in any mode: it counts on neither side."""
        known = [t.client_tokens for t in self.turns if t.client_tokens is not None and not t.assembly_error]
        return sum(known) if known else None

    @property
    def proxy_tokens(self) -> int | None:
        """Tokens the proxy sent or would have sent, over the same calls as ``client_tokens``."""
        known = [t.proxy_tokens or 0 for t in self.turns if t.client_tokens is not None and not t.assembly_error]
        return sum(known) if known else None

    @property
    def savings(self) -> float | None:
        """The share of the client's tokens the proxy saved (negative when it added some)."""
        if not self.client_tokens or self.proxy_tokens is None:
            return None
        return 1 - self.proxy_tokens / self.client_tokens

    @property
    def cache_share(self) -> float | None:
        """The share of the prompt tokens the provider billed that it read from its cache."""
        billed = [t.usage for t in self.turns if t.usage is not None]
        prompt = sum(u.prompt_tokens for u in billed)
        return sum(u.cache_read_tokens for u in billed) / prompt if prompt else None

    @property
    def unpriced_calls(self) -> int:
        """Calls whose cost nobody knows (no price for a model, or no usage from the provider)."""
        return sum(1 for t in self.turns if t.cost_usd is None)

    @property
    def known_cost_usd(self) -> float:
        """What the calls whose cost is known cost, summarizer calls included."""
        return sum(t.cost_usd for t in self.turns if t.cost_usd is not None)

    @property
    def cost_usd(self) -> float | None:
        """What the session cost, summarizer calls included; ``None`` when any call's cost is unknown."""
        return None if self.unpriced_calls else self.known_cost_usd

    @property
    def passthrough_usd(self) -> float | None:
        """What the client's own requests would have cost sent straight to the provider (``None``: unknown;
        ``proxy/report/costs.py`` says how it is estimated)."""
        return passthrough_usd(self.turns)

    @property
    def compactions(self) -> int:
        """Calls whose assembly ran a compaction pass (pressure or forced)."""
        return sum(1 for t in self.turns if t.compaction)

    @property
    def summarizer_calls(self) -> int:
        """Summarization requests made while assembling its calls."""
        return sum(t.summarizer_calls for t in self.turns)

    @property
    def size_refusals(self) -> int:
        """Calls the provider refused for size."""
        return sum(1 for t in self.turns if t.size_refusal)

    @property
    def assembly_failures(self) -> int:
        """Calls whose assembly failed (traced as ``assemblyError``)."""
        return sum(1 for t in self.turns if t.assembly_error)

    def assembly_ms(self, share: float) -> float | None:
        """The ``share`` percentile of its assembly times."""
        return _percentile([t.assembly_ms for t in self.turns if t.assembly_ms is not None], share)

    @property
    def last_activity(self) -> float:
        """The newest trace's mtime."""
        return max((t.modified for t in self.turns), default=0.0)

    def as_json(self) -> dict[str, Any]:
        """The session's overview row for the page's embedded data."""
        return {
            "contextId": self.context_id,
            "modes": self.modes,
            "scopes": self.scopes,
            "models": self.models,
            "modelCalls": len(self.turns),
            "clientTokens": self.client_tokens,
            "proxyTokens": self.proxy_tokens,
            "savings": self.savings,
            "compactions": self.compactions,
            "summarizerCalls": self.summarizer_calls,
            "sizeRefusals": self.size_refusals,
            "assemblyFailures": self.assembly_failures,
            "assemblyP50Ms": self.assembly_ms(0.5),
            "assemblyP95Ms": self.assembly_ms(0.95),
            "lastActivity": self.last_activity,
            "cacheShare": self.cache_share,
            "costUsd": self.cost_usd,
            "knownCostUsd": self.known_cost_usd,
            "unpricedCalls": self.unpriced_calls,
            "passthroughUsd": self.passthrough_usd,
        }


def read_trace(path: Path) -> dict[str, Any] | None:
    """The trace at ``path``; ``None`` when it cannot be read or is not a JSON object."""
    try:
        record = json.loads(path.read_bytes())
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON: reported as unreadable
        return None
    return record if isinstance(record, dict) else None


def summarize(record: Mapping[str, Any], file: str, modified: float) -> TurnSummary:
    """The summary of one trace record found at ``file``."""
    name = TRACE_NAME.match(file.rsplit("/", 1)[-1])
    recovery = _pick(record, "recovery")
    compaction = _pick(record, "compaction")
    error = _pick(record, "providerError")
    calls = _pick(record, "summarizerCalls")
    mode = str(_pick(record, "mode", "?"))
    client = _int(_pick(record, "clientTokens"))
    if client is None and mode in ("shadow", "legacy"):
        client = _request_tokens(_pick(record, "llmInput"))  # traces before clientTokens: what was sent
    assembly_error = _pick(record, "assemblyError")
    return TurnSummary(
        file=file,
        context_id=str(_pick(record, "contextId", "?")),
        turn=_int(_pick(record, "turn")) or (int(name.group(1)) if name else 0),
        recovery=_int(_pick(recovery, "attempt")) or (int(name.group(2)) if name and name.group(2) else 0),
        mode=mode,
        scope=str(_pick(record, "scope", "?")),
        model=str(_pick(record, "model", "?")),
        branch_turn=_int(_pick(_pick(_pick(record, "session"), "branch"), "turn")),
        limit=_int(_pick(_pick(record, "budgets"), "effectiveInputTokens")),
        client_tokens=client,
        candidate_tokens=_int(_pick(record, "estimatedTokens")),
        compaction=_pick(compaction, "reason") or None,
        new_checkpoint=bool(_pick(compaction, "newCheckpoint")),
        summarizer_calls=len(calls) if isinstance(calls, list) else 0,
        provider_error=(_pick(error, "code") or _pick(error, "type") or "error") if error else None,
        assembly_error=str(_pick(assembly_error, "message", assembly_error)) if assembly_error else None,
        assembly_ms=_number(_pick(record, "assemblyMs")),
        provider_ms=_number(_pick(record, "providerMs")),
        modified=modified,
        usage=_billing(_pick(record, "usage")),
        cost_usd=turn_cost(record, mode, bool(error), bool(assembly_error)),
        prices=_prices(_pick(_pick(record, "cost"), "prices")),
    )


def turn_cost(record: Mapping[str, Any], mode: str, failed_call: bool, failed_assembly: bool) -> float | None:
    """A call's cost with its summarizer calls' (the trace's ``cost``); ``None`` where a part is unknown.

    A trace without ``cost`` billed nothing when nothing was answered (the provider refused the call, or the
    assembly failed and dynamic sent nothing); otherwise it predates prices in traces, or its model had none
    in litellm's cost map when that meant no ``cost``: unknown, not free."""
    cost = _pick(record, "cost")
    if isinstance(cost, Mapping):
        usd, summarizer = _number(cost.get("usd")), _number(cost.get("summarizerUsd"))
        return None if usd is None or summarizer is None else usd + summarizer
    if failed_call or (failed_assembly and mode != "shadow"):
        return 0.0
    return None


def _billing(usage: Any) -> ProviderUsage | None:
    prompt = _int(_pick(usage, "promptTokens"))
    if prompt is None:
        return None
    return ProviderUsage(
        prompt,
        _int(_pick(usage, "completionTokens")) or 0,
        _int(_pick(usage, "cacheReadTokens")) or 0,
        _int(_pick(usage, "cacheWriteTokens")) or 0,
    )


def _prices(prices: Any) -> ModelPrices | None:
    given, output = _number(_pick(prices, "input")), _number(_pick(prices, "output"))
    if given is None or output is None:
        return None
    return ModelPrices(given, output, _number(_pick(prices, "cacheRead")), _number(_pick(prices, "cacheWrite")))


def _request_tokens(llm_input: Any) -> int | None:
    messages = _pick(llm_input, "messages")
    if not isinstance(messages, list):
        return None
    estimator = ConservativeTokenEstimator()
    tools = _pick(llm_input, "tools")
    total = sum(estimator.count_message(m) for m in messages if isinstance(m, dict))
    return total + (estimator.count_tools(tools) if isinstance(tools, list) and tools else 0)


def group_sessions(turns: Iterable[TurnSummary]) -> list[SessionSummary]:
    """Sessions by context id, most recently active first; each session's calls in call order."""
    sessions: dict[str, SessionSummary] = {}
    for turn in turns:
        sessions.setdefault(turn.context_id, SessionSummary(turn.context_id)).turns.append(turn)
    for session in sessions.values():
        session.turns.sort(key=lambda t: (t.turn, t.recovery, t.file))
    return sorted(sessions.values(), key=lambda s: (-s.last_activity, s.context_id))


class Values:
    """An intern table: equal values are stored once and referred to by their index."""

    def __init__(self, cap: int) -> None:
        self.cap = cap  # longest text kept of one value's strings; the rest is named, not shown
        self.items: list[Any] = []
        self._index: dict[str, int] = {}

    def add(self, value: Any) -> int:
        """The index of ``value`` (its long strings cut to ``cap``), added when new."""
        value = _capped(value, self.cap)
        key = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self.items)
            self.items.append(value)
        return index

    def recap(self, cap: int) -> None:
        """Cut every value's long strings to ``cap`` (indices stay valid; equal values may now repeat)."""
        self.cap = min(self.cap, cap)
        self.items = [_capped(item, self.cap) for item in self.items]

    def size(self) -> int:
        """The table's size as JSON, in characters."""
        return len(json.dumps(self.items, ensure_ascii=False, separators=(",", ":"), default=str))


def _capped(value: Any, cap: int) -> Any:
    if isinstance(value, str) and len(value) > cap:
        return value[:cap] + f"\n[… {len(value) - cap} more characters: the whole text is in the trace file]"
    if isinstance(value, Mapping):
        return {str(k): _capped(v, cap) for k, v in value.items()}
    if isinstance(value, list):
        return [_capped(v, cap) for v in value]
    return value


def turn_detail(record: Mapping[str, Any], values: Values) -> dict[str, Any]:
    """What the page shows for one opened turn; messages, sections and items as indices into ``values``."""
    admitted = _pick(record, "admitted") or {}
    collection = _pick(record, "collection") or {}
    rendered = _pick(record, "renderedContext") or {}
    compaction = _pick(record, "compaction") or {}
    window = _pick(rendered, "window") or {}
    candidate = _pick(rendered, "callHistory")
    sent = _pick(_pick(record, "llmInput"), "messages")
    admitted_ids = {
        (kind, _pick(item, "id")) for kind in ("sections", "messages", "attachments") for item in _items(admitted, kind)
    }
    dropped = [
        {"kind": kind, "id": _pick(item, "id"), "source": _pick(item, "source")}
        for kind in ("sections", "messages", "attachments")
        for item in _items(collection, kind)
        if (kind, _pick(item, "id")) not in admitted_ids
    ]
    checkpoint = next(
        (m for m in candidate or [] if isinstance(m, dict) and str(m.get("content") or "").startswith(CHECKPOINT_TAG)),
        None,
    )
    return {
        "sectionIds": _pick(rendered, "sectionIds") or [],
        "sections": [values.add(s) for s in _items(admitted, "sections")],
        "admitted": {kind: [values.add(i) for i in _items(admitted, kind)] for kind in ("messages", "attachments")},
        "admittedTokens": {"prompt": _pick(admitted, "promptTokens"), "messages": _pick(admitted, "messageTokens")},
        "dropped": dropped,
        "diagnostics": [
            values.add(d)
            for d in [
                *_items(collection, "diagnostics"),
                *_items(_pick(record, "cap"), "diagnostics"),
                *_items(admitted, "diagnostics"),
                *_items(window, "diagnostics"),
            ]
        ],
        "window": _pick(window, "statistics"),
        "compaction": {
            key: _pick(compaction, key)
            for key in (
                "reason",
                "tokensBefore",
                "tokensAfter",
                "thresholdTokens",
                "targetTokens",
                "compactedRefs",
                "reappliedRefs",
                "summarizedMessages",
                "attempts",
                "rejections",
                "newCheckpoint",
                "reusedCheckpoint",
                "checkpointCovers",
                "errors",
                "recovery",
            )
            if _pick(compaction, key) not in (None, [], "")
        },
        "checkpoint": values.add(checkpoint) if checkpoint is not None else None,
        "contributors": [
            {k: _pick(c, k) for k in ("id", "status", "durationMs", "error")} for c in _items(record, "contributors")
        ],
        "budgets": _pick(record, "budgets"),
        "candidate": [values.add(m) for m in candidate] if isinstance(candidate, list) else None,
        "sent": [values.add(m) for m in sent] if isinstance(sent, list) else None,
        "providerError": _pick(record, "providerError"),
        "assemblyError": _pick(record, "assemblyError"),
        "recovery": _pick(record, "recovery"),
        "ingress": _pick(record, "ingress"),
    }


def _items(record: Any, key: str) -> list[Any]:
    value = _pick(record, key)
    return value if isinstance(value, list) else []


@dataclass
class TraceFolder:
    """A trace folder read whole: every readable trace's summary, and its detail when asked for."""

    root: Path
    turns: list[TurnSummary] = field(default_factory=list)
    details: dict[str, dict[str, Any]] = field(default_factory=dict)  # by file, when read with details
    values: dict[str, Values] = field(default_factory=dict)  # by context id
    unreadable: list[str] = field(default_factory=list)

    def add(self, path: Path, with_detail: bool, cap: int) -> None:
        """Read one trace file into the folder's summaries (and details)."""
        file = path.relative_to(self.root).as_posix()
        record = read_trace(path)
        if record is None or not isinstance(record.get("contextId"), str):  # not a trace (e.g. a copied example)
            self.unreadable.append(file)
            return
        try:
            modified = path.stat().st_mtime
        except OSError:
            modified = 0.0
        summary = summarize(record, file, modified)
        self.turns.append(summary)
        if with_detail:
            table = self.values.setdefault(summary.context_id, Values(cap))
            self.details[file] = turn_detail(record, table)


def trace_files(root: Path) -> list[Path]:
    """Every trace file under ``root`` (any depth: a copied folder of examples too), in name order."""
    return _inside(root, root.rglob("turn-*.json"))


def session_files(root: Path, context_id: str) -> list[Path] | None:
    """The trace files of one session folder ``root/<context_id>``; ``None`` for an id that is not one."""
    if not CONTEXT_ID.match(context_id) or context_id in (".", ".."):
        return None
    folder = root / context_id
    if not folder.is_dir() or not folder.resolve().is_relative_to(root.resolve()):
        return None
    return _inside(root, folder.glob("turn-*.json"))


def _inside(root: Path, paths: Iterable[Path]) -> list[Path]:
    """The trace files among ``paths`` that are, links resolved, regular files under ``root``."""
    base = root.resolve()
    return sorted(p for p in paths if TRACE_NAME.match(p.name) and p.is_file() and p.resolve().is_relative_to(base))
