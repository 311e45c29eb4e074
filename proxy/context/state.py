"""Run state derived from canonical history, channel by channel; the channels belong to the packages.

Successful tool results update the channels at the tool-result boundary, in the order the model
*declared* the calls (the order of ``tool_calls`` in its assistant message), never in the order the
results arrived: parallel tools finish in any order, the state sequence must not depend on it. A call
without a result yet (unfinished) changes nothing but what a channel records of every call.

A result is *successful* unless its text, leading whitespace ignored, starts with ``error`` (any case),
or it is a JSON object with a truthy ``error`` key or ``"ok": false`` / ``"success": false``. That is
how tool runners (the proxy's own included) report failure in a chat transcript, which has no error
flag of its own.

This module knows no tool and no channel but ``diagnostics`` (why a call that looked like state was
ignored): each :class:`~proxy.context.types.StateChannel` is declared by the contributor package that
owns its tools and its text formats (``contributors/plan.py``, ``skills.py``, ``capabilities.py``,
``projection.py``) and handed in through :class:`StateConfig`. Every value is plain JSON data.

A session first seen mid-run is just a longer history: one pass fills every channel.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from proxy.context.types import DeclaredCall, StateChannel
from proxy.kernel.canonical import HistoryEntry, content_text
from proxy.kernel.jsonio import loads_text

RunState: TypeAlias = dict[str, Any]

DIAGNOSTICS = "diagnostics"
# The trace records this channel's ``progress`` as ``planProgress`` (trace_schema.json); the channel's
# owner, contributors/plan.py, declares it under this name.
PLAN = "plan"
_MAX_DIAGNOSTICS = 20
_MAX_LIST_ITEMS = 20


@dataclass(frozen=True)
class StateConfig:
    """The channels the loaded packages declared, in registration order."""

    channels: tuple[StateChannel, ...] = ()


def is_successful(text: str) -> bool:
    """True unless ``text`` reports a failure (see the module docstring for the rule)."""
    stripped = text.lstrip()
    if stripped[:5].lower() == "error":
        return False
    if stripped.startswith("{"):
        try:
            data = loads_text(stripped)
        except ValueError:
            return True
        if isinstance(data, dict):
            return not (data.get("error") or data.get("ok") is False or data.get("success") is False)
    return True


def declared_calls(history: Sequence[Mapping[str, Any]], start: int = 0) -> list[DeclaredCall]:
    """Every assistant tool call (of ``history[start:]``), in history order and, within a message, in
    declared order."""
    calls: list[DeclaredCall] = []
    for i in range(start, len(history)):
        message = history[i]
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or ():
            if not isinstance(call, Mapping):
                continue
            function = call.get("function")
            if not isinstance(function, Mapping):
                function = {}
            raw = function.get("arguments")
            calls.append(DeclaredCall(i, str(call.get("id", "")), str(function.get("name", "")), _parse(raw)))
    return calls


def _parse(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        return loads_text(raw) if raw.strip() else {}
    except ValueError:
        return raw


def tool_results(history: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, str]]:
    """``tool_call_id`` -> (index, text) of its first tool result."""
    found: dict[str, tuple[int, str]] = {}
    for i, message in enumerate(history):
        if message.get("role") == "tool":
            found.setdefault(str(message.get("tool_call_id", "")), (i, content_text(message.get("content"))))
    return found


def derive_state(
    history: Sequence[Mapping[str, Any]],
    config: StateConfig | None = None,
    visible: Sequence[Mapping[str, Any]] | None = None,
) -> RunState:
    """The run state of ``history`` (canonical, before compaction).

    ``visible`` is the model-visible history (after compaction) each channel judges visibility against;
    by default ``history`` itself.
    """
    config = config or StateConfig()
    folded = _fold(history, config, _Folded.initial(config), 0)
    return with_visibility(folded.run_state(), history if visible is None else visible, config)


@dataclass(frozen=True)
class _Folded:
    """The channels' values and the diagnostics after folding the calls of a history's first ``length``
    messages; ``settled`` when each of those calls found its result among them."""

    values: dict[str, Any]
    diagnostics: tuple[str, ...]
    length: int
    settled: bool

    @staticmethod
    def initial(config: StateConfig) -> _Folded:
        return _Folded({channel.name: channel.initial() for channel in config.channels}, (), 0, True)

    def run_state(self) -> RunState:
        state: RunState = dict(self.values)
        state[DIAGNOSTICS] = list(self.diagnostics[-_MAX_DIAGNOSTICS:])
        return state


def _fold(history: Sequence[Mapping[str, Any]], config: StateConfig, start: _Folded, offset: int) -> _Folded:
    """``start`` (the fold of ``history[:offset]``) carried on over the calls of ``history[offset:]``."""
    values = dict(start.values)
    diagnostics = list(start.diagnostics)
    calls = declared_calls(history, offset)
    # The results are looked for only when there are calls to fold: a resent history whose new messages
    # declare none (a user message, a text answer) is not scanned at all.
    results = tool_results(history) if calls else {}
    settled = start.settled
    for call in calls:
        found = results.get(call.call_id)
        settled = settled and found is not None and found[0] >= call.index
        text = found[1] if found is not None and found[0] >= call.index and is_successful(found[1]) else None
        for channel in config.channels:
            values[channel.name] = channel.observe(values[channel.name], call, text, diagnostics.append)
    return _Folded(values, tuple(diagnostics[-_MAX_DIAGNOSTICS:]), len(history), settled)


class RunStateMemo:
    """Per recent session, the fold of its last request's history, so a turn folds only what is new.

    Deriving the run state parses every call's arguments and folds every call through every channel, on
    every turn. A resent history whose message at ``length - 1`` has the chain hash the fold was taken
    at holds the very same first ``length`` messages (chain hashes name whole prefixes), so their fold
    is taken as it was. Only a *settled* fold is kept: each of its calls found its result among those
    messages, so no later message can change what a channel saw of them (a request's tool calls are
    answered in it; proxy-owned steps too). Values are deep-copied in and out: a channel that changed
    a value in place could not change a kept fold. At most ``max_sessions`` are kept, least recently
    used dropped first.
    """

    def __init__(self, config: StateConfig, max_sessions: int = 1024) -> None:
        self.config = config
        self.max_sessions = max_sessions
        self._last: OrderedDict[str, tuple[str, _Folded]] = OrderedDict()

    def derive(
        self,
        context_id: str,
        history: Sequence[HistoryEntry],
        visible: Sequence[Mapping[str, Any]] | None = None,
    ) -> RunState:
        """``derive_state`` of ``history`` (its messages), folding only what follows the session's last fold."""
        messages = [entry.message for entry in history]
        start, offset = _Folded.initial(self.config), 0
        kept = self._last.pop(context_id, None)
        if kept is not None:
            chain_hash, folded = kept
            if 0 < folded.length <= len(history) and history[folded.length - 1].chain_hash == chain_hash:
                start, offset = _copied(folded), folded.length
        folded = _fold(messages, self.config, start, offset)
        if folded.settled and history:
            self._last[context_id] = (history[-1].chain_hash, _copied(folded))
            while len(self._last) > self.max_sessions:
                self._last.popitem(last=False)
        return with_visibility(folded.run_state(), messages if visible is None else visible, self.config)


def _copied(folded: _Folded) -> _Folded:
    return _Folded(copy.deepcopy(folded.values), folded.diagnostics, folded.length, folded.settled)


def with_visibility(state: Mapping[str, Any], visible: Sequence[Mapping[str, Any]], config: StateConfig) -> RunState:
    """A copy of ``state`` with every channel judged against ``visible`` (plan progress, skill bodies)."""
    out = dict(state)
    for channel in config.channels:
        if channel.name in out:
            out[channel.name] = channel.judge(out[channel.name], visible)
    return out


def bounded(value: Any, chars: int) -> Any:
    """``value`` with every string cut to ``chars`` characters and every list to a few items, so that
    one large ``write_artifact`` payload cannot make the state (and each call's projection) large."""
    if isinstance(value, str):
        return value if len(value) <= chars else f"{value[:chars]}… [+{len(value) - chars} chars]"
    if isinstance(value, Mapping):
        return {str(k): bounded(v, chars) for k, v in value.items()}
    if isinstance(value, list):
        items = [bounded(v, chars) for v in value[:_MAX_LIST_ITEMS]]
        extra = len(value) - _MAX_LIST_ITEMS
        return [*items, f"… [+{extra} items]"] if extra > 0 else items
    return value
