"""Atomic units of a chat history: what may be kept or dropped only as a whole.

An assistant message with tool calls and the tool results right after it form one unit; every other
message is a unit of its own. The same split serves the message-count cap and the token window, so
neither can separate a call from its results.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

UnitKind: TypeAlias = Literal["message", "tool_step", "orphan_result", "pinned"]
PINNED_ROLES = frozenset({"system", "developer"})
RESULT_ROLES = frozenset({"tool", "function"})


@dataclass(slots=True)
class Unit:
    """Messages ``[start, stop)`` of a history that stand or fall together.

    ``missing`` lists the call IDs of a tool step that have no result in the unit: such a step is
    unfinished and is never dropped. Treat it as immutable; it is not frozen because a turn splits a
    history of thousands of messages several times, and a frozen dataclass takes five times as long to
    make.
    """

    start: int
    stop: int
    kind: UnitKind
    missing: tuple[str, ...] = ()

    @property
    def unfinished(self) -> bool:
        """True for a tool step with calls that have no result."""
        return bool(self.missing)

    def __len__(self) -> int:
        return self.stop - self.start


def call_ids(message: Mapping[str, Any]) -> list[str]:
    """The IDs of an assistant message's tool calls (a legacy ``function_call`` counts as one call)."""
    calls = message.get("tool_calls") or ()
    # ``type(...) is dict`` first: an ABC isinstance check per call costs more than the rest of the walk.
    ids = [str(call.get("id", "")) for call in calls if type(call) is dict or isinstance(call, Mapping)]
    if not ids and message.get("function_call"):
        ids = ["function_call"]
    return ids


def split_units(history: Sequence[Mapping[str, Any]]) -> list[Unit]:
    """Split ``history`` into units, in order; together they cover every message exactly once."""
    units: list[Unit] = []
    add = units.append
    i, n = 0, len(history)
    # One pass, a lookup or two per message: a turn splits its whole history several times.
    while i < n:
        message = history[i]
        role = message.get("role")
        ids = call_ids(message) if role == "assistant" else None
        if ids:
            pending = ids
            j = i + 1
            # Results belong to the step only while they answer its calls, right after it.
            while j < n:
                result = history[j]
                result_role = result.get("role")
                if result_role == "tool":
                    result_id = str(result.get("tool_call_id", ""))
                elif result_role == "function":
                    result_id = "function_call"
                else:
                    break
                if result_id not in pending:
                    break
                pending.remove(result_id)
                j += 1
            add(Unit(i, j, "tool_step", tuple(pending)))
            i = j
            continue
        add(Unit(i, i + 1, _KINDS.get(role, "message")))
        i += 1
    return units


_KINDS: dict[Any, UnitKind] = {"tool": "orphan_result", "function": "orphan_result"}
_KINDS.update(dict.fromkeys(PINNED_ROLES, "pinned"))


class SplitMemo:
    """``split_units`` of histories named by their chain hashes, carried over from a prefix split before.

    A resent history is split again on every turn, though only its end changed. A history whose prefix
    of ``k`` messages was split before (found by the chain hash of its ``k``-th message, walking back from
    the end: a turn adds a few) keeps that prefix's units but the last, and is split again from there:
    the last unit may grow (results arriving for its calls), the earlier ones were each closed by a
    message inside the prefix. Equal chain hashes mean equal canonical messages, and the split reads only
    their roles and call ids. At most ``max_units`` units are kept in all, the least recently used
    history's first; a history's prefix is forgotten when the history is remembered. Thread-safe (a large
    history is compacted on a worker thread)."""

    DEFAULT_MAX_UNITS = 100_000  # about 8 MB: a hundred sessions of 1,000 messages
    TAIL_SEARCH = 64  # how far back from the end a split prefix is looked for

    def __init__(self, max_units: int = DEFAULT_MAX_UNITS) -> None:
        self.max_units = max_units
        self._splits: OrderedDict[str, tuple[int, tuple[Unit, ...]]] = OrderedDict()  # last hash -> (length, units)
        self._units = 0
        self._lock = threading.Lock()

    def split(self, history: Sequence[Mapping[str, Any]], chain_hashes: Sequence[str]) -> list[Unit]:
        """``split_units(history)``; ``chain_hashes`` name ``history``'s prefixes."""
        if len(chain_hashes) != len(history):
            raise ValueError("one chain hash per message")
        units: list[Unit] | None = None
        for k in range(len(history) - 1, max(-1, len(history) - 1 - self.TAIL_SEARCH), -1):
            with self._lock:
                known = self._splits.get(chain_hashes[k])
                if known is not None and known[0] == k + 1:
                    self._forget(chain_hashes[k])
            if known is not None and known[0] == k + 1:
                prefix = known[1]
                start = prefix[-1].start if prefix else 0
                rest = split_units(history[start:])
                units = [*prefix[:-1], *(Unit(u.start + start, u.stop + start, u.kind, u.missing) for u in rest)]
                break
        if units is None:
            units = split_units(history)
        if history and len(units) <= self.max_units:
            with self._lock:
                self._forget(chain_hashes[-1])
                self._splits[chain_hashes[-1]] = (len(history), tuple(units))
                self._units += len(units)
                while self._units > self.max_units:
                    _, (_, evicted) = self._splits.popitem(last=False)
                    self._units -= len(evicted)
        return units

    def _forget(self, last: str) -> None:
        forgotten = self._splits.pop(last, None)
        if forgotten is not None:
            self._units -= len(forgotten[1])


def anchor_unit(history: Sequence[Mapping[str, Any]], units: Sequence[Unit]) -> int | None:
    """Index (into ``units``) of the task anchor: the unit holding the first user message."""
    for k, unit in enumerate(units):
        if unit.kind == "message" and history[unit.start].get("role") == "user":
            return k
    return None


def anchor_stop(history: Sequence[Mapping[str, Any]]) -> int:
    """Where the task anchor's unit ends (0 without one), without splitting ``history``: a user message is
    always a unit of its own, so the anchor unit is exactly the first user message."""
    return next((i + 1 for i, message in enumerate(history) if message.get("role") == "user"), 0)


def latest_step_start(history: Sequence[Mapping[str, Any]], units: Sequence[Unit]) -> int:
    """Index (into ``units``) where the latest step begins: the last unit that starts with an assistant
    message, so the step keeps its call/result structure and whatever the client sent after it; with no
    assistant message, the last unit."""
    for k in range(len(units) - 1, -1, -1):
        if history[units[k].start].get("role") == "assistant":
            return k
    return max(len(units) - 1, 0)
