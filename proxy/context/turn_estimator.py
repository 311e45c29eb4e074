"""The per-turn counting memo: one turn's stages count the same messages (and their shallow copies)
many times; ``TurnEstimator`` counts each once, over any ``TokenEstimator`` (usually the shared
``CachingEstimator`` of ``estimators.py``), and ``counts_of`` counts a whole sequence in one pass.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from proxy.context.estimators import CachingEstimator
from proxy.context.types import PrefixTokenEstimator, TokenEstimator
from proxy.kernel.canonical import HistoryEntry


class TurnEstimator:
    """Memoizes counts for one turn: the compactor, the window, the validator, the trace's size of the
    client's request and the calibration sample count the same messages (often as shallow copies), and
    even a cache hit costs building its key. Make one per turn (``TokenCalibrator.accounting_with``),
    never share it between turns.

    A message is found first by its own ``id`` (the same dict object again), then, for a shallow copy, by
    the ``id`` of its content (or, without content, of its tool calls), which the copy shares, checked
    against the message found there: same keys in the same order, the very same values. The memo holds
    what it keyed, so an ``id`` is never reused while it lives. Messages are not changed in place while
    a turn counts them (every stage copies what it rewrites); a dict whose ``content`` was replaced since
    it was counted is counted again.

    ``name_messages`` tells it the chain hash of each history message: with an inner estimator that can
    count by chain hash (``PrefixTokenEstimator``), the unchanged prefix of a resent history is then
    looked up by that name rather than by a digest of its content.

    ``factor`` scales every count (rounded up per message, like ``ScaledEstimator``): the memo keeps the
    base counts, so the calibration sample of the same turn reads them unscaled (``unscaled``).
    """

    def __init__(self, inner: TokenEstimator, factor: float = 1.0) -> None:
        self.inner = inner
        self.factor = factor
        # The shared cache first: a protocol's isinstance walks its members (tens of microseconds a turn).
        counts_by_name = type(inner) is CachingEstimator or isinstance(inner, PrefixTokenEstimator)
        self._prefix: PrefixTokenEstimator | None = inner if counts_by_name else None  # type: ignore[assignment]
        # The shared cache's own lookup of named messages' counts, used when naming (``None``: another counter).
        self._known_at = inner.known_counts_at if isinstance(inner, CachingEstimator) else None
        self._by_object: dict[int, tuple[Mapping[str, Any], Any, int]] = {}  # id -> (message, content, count)
        self._by_anchor: dict[int, tuple[Mapping[str, Any], int]] = {}  # id of content -> (message, count)
        self._named: dict[int, tuple[Mapping[str, Any], str]] = {}  # id -> (message, chain hash)
        self._named_by_anchor: dict[int, tuple[Mapping[str, Any], str]] = {}  # id of content -> (message, hash)
        self._last_named: tuple[tuple[Mapping[str, Any], ...], list[str]] = ((), [])
        # Named messages, as named, where the shared cache knew some (memoized by their counts, not named
        # one by one): every batch, for a memoized message rewritten in place since (``_name_of_known``),
        # and those not yet put into the two maps above (``_index``).
        self._known_batches: list[_Batch] = []
        self._unindexed: list[_Batch] = []
        # ids of the tools' functions -> (the tools, their base count): see ``count_tools``
        self._tools: dict[tuple[int, ...], tuple[tuple[Mapping[str, Any], ...], int]] = {}
        # The client's own tools (``name_tools``) and, once made, the shared cache's key of them
        self._client_tools: tuple[Mapping[str, Any], ...] = ()
        self._client_tools_key: bytes | None = None
        # ids of a counted message sequence -> (the messages, their contents, base counts): see ``base_counts``
        self._sequences: dict[tuple[int, ...], _CountedSequence] = {}
        # base counts of a sequence -> its scaled counts: see ``counts``
        self._scaled_sequences: dict[tuple[int, ...], tuple[int, ...]] = {}

    def name_history(self, entries: Sequence[HistoryEntry]) -> None:
        """Count these messages (and their shallow copies) by their chain hashes from now on."""
        self.name_messages([entry.message for entry in entries], [entry.chain_hash for entry in entries])

    def name_messages(self, messages: Sequence[Mapping[str, Any]], chain_hashes: Sequence[str]) -> None:
        """Count ``messages[i]`` (and its shallow copies) by ``chain_hashes[i]`` from now on."""
        if self._prefix is None:
            return
        # The assembly names its history again after the calibration named the client's messages: without
        # proxy steps these are the very same messages and hashes, already named (one C-speed comparison).
        last_messages, last_hashes = self._last_named
        hashes = list(chain_hashes)
        same = len(last_messages) == len(messages) and all(map(operator.is_, last_messages, messages))
        if same and last_hashes == hashes:
            return
        named_messages = tuple(messages)
        self._last_named = (named_messages, hashes)
        if len(hashes) != len(messages):
            raise ValueError("one chain hash per message")
        # In C-speed passes (map, list.count, list.index) rather than a loop body per message: a resent
        # history is thousands of messages, nearly all of them already counted by the shared cache.
        ids = list(map(id, messages))
        contents = _contents(messages)
        known: list[int | None] = self._known_at(hashes) if self._known_at is not None else [None] * len(hashes)
        missing = known.count(None)
        new = _nones(known, missing)
        if new:  # the others' names, to count them by when asked
            named = [(messages[k], hashes[k]) for k in new]
            self._named.update(zip([ids[k] for k in new], named, strict=True))
            anchors = [_anchor_of(messages[k], contents[k]) for k in new]
            self._named_by_anchor.update(zip(map(id, anchors), named, strict=True))
        if missing < len(known):
            # A message the shared cache already counted (the resent prefix: nearly all) is memoized as if
            # counted: a count of it, or of a shallow copy (by its anchor), finds it here. Kept as the
            # batch it came in and indexed only when counting needs it message by message (``_index``):
            # a warm turn counts its history as whole sequences, and the few messages it counts alone
            # are looked for in the batch at C speed.
            batch = _Batch(named_messages, ids, contents, known, hashes)
            self._known_batches.append(batch)
            self._unindexed.append(batch)
        # A warm turn's history is all known but what it adds: counting those few now lets every stage that
        # counts this very sequence (the compactor, the trace's size of the request) find it whole. Many
        # unknown messages (a first request), or a few very long ones (a 31 MB message took seconds of
        # tiktoken), are left to the stages, which count a large history off the loop.
        if missing <= _COUNTED_WHEN_NAMED and sum(_text_chars(contents[k]) for k in new) < _COUNTED_CHARS_WHEN_NAMED:
            counts = list(known)
            for k in new:
                counts[k] = self.base_count_message(messages[k])
            self._remember_sequence(tuple(ids), named_messages, tuple(contents), tuple(counts))  # type: ignore[arg-type]

    def count_text(self, text: str) -> int:
        """Passed through (scaled): texts are few per turn."""
        return self._scaled(self.inner.count_text(text))

    def count_message(self, message: Mapping[str, Any]) -> int:
        """The inner count, once per distinct message content, scaled."""
        return self._scaled(self.base_count_message(message))

    def count_message_named(self, message: Mapping[str, Any], name: str) -> int:
        """``count_message`` of a message that ``name`` names as a chain hash names a history message
        (equal names, equal canonical messages): counted by that name by an inner estimator that can."""
        seen = self._object_entry(message)
        if seen is None or seen[0] is not message or seen[1] is not message.get("content"):
            self._named[id(message)] = (message, name)
        return self.count_message(message)

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """The inner count, once per turn for a list of the same tools (or their shallow copies), scaled."""
        return self._scaled(self.base_count_tools(tools))

    def base_count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """The inner count of ``tools``, memoized: the passes, the validator, the trace's sizes and the
        calibration sample all count the turn's tools, mostly as shallow copies of one list."""
        key = tuple(id(tool.get("function", tool)) for tool in tools)
        seen = self._tools.get(key)
        if seen is not None and len(seen[0]) == len(tools) and all(map(_same_fields, seen[0], tools)):
            return seen[1]
        count = self._count_tools(tools)
        self._tools[key] = (tuple(tools), count)  # holds the tools: their ids stay theirs
        return count

    def name_tools(self, tools: Sequence[Mapping[str, Any]]) -> None:
        """The client's own tools, as its request holds them: a list that starts with them (or their shallow
        copies) is counted by their key in the shared cache and a key of the rest, so the client's schemas
        (30 KB for an agent's two dozen tools) are digested once a turn, not once for the client's list (the
        trace's and the metrics' client tokens) and again for the assembly's (the same tools, then the proxy's)."""
        self._client_tools, self._client_tools_key = tuple(tools), None

    def _count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        client, cache = self._client_tools, self.inner
        # Counted whole without the shared cache, or where the list does not start with the client's tools
        # (some withheld, say).
        if (
            not client
            or not isinstance(cache, CachingEstimator)
            or len(tools) < len(client)
            or not all(map(_same_fields, client, tools))
        ):
            return cache.count_tools(tools)
        if self._client_tools_key is None:
            self._client_tools_key = cache.tools_key(client)
        key = self._client_tools_key
        if len(tools) > len(client):
            key = cache.tools_key_after(key, tools[len(client) :])
        return cache.count_tools_by(key, tools)

    def counts(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """``count_message`` of each of ``messages``, in one pass (see ``base_counts``)."""
        base = self.base_counts(messages)
        factor = self.factor
        if factor == 1.0:
            return base
        # Several stages count the same sequence: its scaled counts are made once, found by its base counts
        # (a tuple hashed and compared at C speed, where scaling is a multiplication and a ceil per message).
        key = tuple(base)
        scaled = self._scaled_sequences.get(key)
        if scaled is None:
            scaled = tuple([math.ceil(count * factor) for count in base])
            if len(self._scaled_sequences) >= _SEQUENCES_PER_TURN:
                self._scaled_sequences.pop(next(iter(self._scaled_sequences)))
            self._scaled_sequences[key] = scaled
        return list(scaled)

    def base_counts(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """``base_count_message`` of each of ``messages``, memoized for the sequence as a whole.

        Several stages count one sequence of the same message objects (the validator the composed input,
        then the calibration sample what was sent): the second time it is recognized in C-speed passes
        (the ids, and each message's content still the one counted) instead of one lookup per message.
        A sequence that holds one counted before as a run (the composed input: the system prompt, then
        the history the compactor and the window counted) takes that run's counts whole too.
        """
        key = tuple(map(id, messages))
        contents = tuple(_contents(messages))
        seen = self._sequences.get(key)
        if seen is not None and all(map(operator.is_, seen[1], contents)):
            return list(seen[2])
        run = self._counted_run(key, contents)
        if run is None:
            out = self._count_each(messages, contents)
        else:
            start, stop, counts = run
            out = [
                *self._count_each(messages[:start], contents[:start]),
                *counts,
                *self._count_each(messages[stop:], contents[stop:]),
            ]
        self._remember_sequence(key, tuple(messages), contents, tuple(out))
        return out

    def _counted_run(self, key: tuple[int, ...], contents: tuple[Any, ...]) -> tuple[int, int, tuple[int, ...]] | None:
        """The longest sequence counted before that ``key`` holds as a run, its contents unchanged:
        (where it starts, where it stops, its counts); found by its first message's id, compared at C speed."""
        for known_key, (_, known_contents, counts) in sorted(self._sequences.items(), key=lambda i: -len(i[0])):
            if not known_key or len(known_key) >= len(key):
                continue
            try:
                start = key.index(known_key[0])
            except ValueError:
                continue
            stop = start + len(known_key)
            if key[start:stop] == known_key and all(map(operator.is_, known_contents, contents[start:stop])):
                return start, stop, counts
        return None

    def _count_each(self, messages: Sequence[Mapping[str, Any]], contents: Sequence[Any]) -> list[int]:
        """``base_count_message`` of each of ``messages`` (``contents``: theirs), its two cheap answers inlined
        (a call per message is most of their cost): the very message counted before, or a shallow copy of
        one (the composer's, nearly all)."""
        if self._unindexed and len(messages) > _LOOKED_FOR_ONE_BY_ONE:
            self._index()
        by_object, by_anchor, count = self._by_object, self._by_anchor, self.base_count_message
        out: list[int] = []
        for message, content in zip(messages, contents, strict=True):
            known = by_object.get(id(message))
            if known is not None and known[0] is message and known[1] is content:
                out.append(known[2])
                continue
            anchor = content if content is not None else message.get("tool_calls")
            original = by_anchor.get(id(anchor)) if anchor is not None else None
            if original is not None and _same_fields(original[0], message):
                by_object[id(message)] = (message, content, original[1])
                out.append(original[1])
                continue
            out.append(count(message))
        return out

    def _remember_sequence(
        self,
        key: tuple[int, ...],
        messages: tuple[Mapping[str, Any], ...],
        contents: tuple[Any, ...],
        counts: tuple[int, ...],
    ) -> None:
        if len(self._sequences) >= _SEQUENCES_PER_TURN:
            self._sequences.pop(next(iter(self._sequences)))
        self._sequences[key] = (messages, contents, counts)  # holds the messages: their ids stay theirs

    def has_counted(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        """Whether this very sequence of messages is counted already (its next count is a memo hit)."""
        seen = self._sequences.get(tuple(map(id, messages)))
        return seen is not None and all(map(operator.is_, seen[1], _contents(messages)))

    def unscaled(self) -> TokenEstimator:
        """This memo's base counts (what calibration compares with the provider's figure)."""
        return _Unscaled(self)

    def base_count_message(self, message: Mapping[str, Any]) -> int:
        """The inner estimator's count of ``message``, memoized."""
        seen = self._object_entry(message)
        content = message.get("content")
        if seen is not None and seen[0] is message and seen[1] is content:
            return seen[2]
        tokens = self._count_new(message, rewritten=seen is not None and seen[0] is message)
        self._by_object[id(message)] = (message, content, tokens)
        anchor = _anchor(message)
        if anchor is not None:
            self._by_anchor.setdefault(id(anchor), (message, tokens))
        return tokens

    def _count_new(self, message: Mapping[str, Any], rewritten: bool = False) -> int:
        """A message this memo has not seen as this object: a named one, a copy, or one to count;
        ``rewritten``: one it memoized, whose content was replaced in place since."""
        prefix = self._prefix
        named = self._named.get(id(message))
        if named is None and rewritten:
            named = self._name_of_known(message)
        if named is not None and named[0] is message and prefix is not None:
            return prefix.count_message_at(named[1], message)
        anchor = _anchor(message)
        if anchor is not None:
            known = self._anchor_entry(anchor)
            if known is not None and _same_fields(known[0], message):
                return known[1]
            original = self._named_by_anchor.get(id(anchor))
            if original is not None and prefix is not None and _same_fields(original[0], message):
                return prefix.count_message_at(original[1], message)
        return self.inner.count_message(message)

    def _name_of_known(self, message: Mapping[str, Any]) -> tuple[Mapping[str, Any], str] | None:
        """The chain hash a memoized message was named by (no stage rewrites one in place: this is the
        rare way, a search of what was named rather than a map kept for every message of every turn)."""
        for batch in self._known_batches:
            with contextlib.suppress(ValueError):
                k = batch.ids.index(id(message))
                if batch.messages[k] is message:
                    return message, batch.hashes[k]
        return None

    def _object_entry(self, message: Mapping[str, Any]) -> tuple[Mapping[str, Any], Any, int] | None:
        """What the memo holds for this very message object: (message, content, count), or ``None``."""
        seen = self._by_object.get(id(message))
        if seen is not None or not self._unindexed:
            return seen
        key = id(message)
        for batch in self._unindexed:
            with contextlib.suppress(ValueError):
                k = batch.ids.index(key)  # its first place: a message named twice has the same count there
                count = batch.counts[k]
                if batch.messages[k] is message and count is not None:
                    return message, batch.contents[k], count
        return None

    def _anchor_entry(self, anchor: Any) -> tuple[Mapping[str, Any], int] | None:
        """The first memoized message whose content (or, without content, whose tool calls) is ``anchor``:
        (message, count), or ``None``. A string is looked for among the batches' contents (equal strings
        first, at C speed, then the very object); any other anchor indexes the batches."""
        known = self._by_anchor.get(id(anchor))
        if known is not None or not self._unindexed:
            return known
        if type(anchor) is not str:
            self._index()
            return self._by_anchor.get(id(anchor))
        for batch in self._unindexed:
            contents, start = batch.contents, 0
            # Counted first, so that ``index`` always finds: one that finds nothing raises a ValueError whose
            # message holds the repr of what it looked for, and a system prompt is 80 KB (0.4 ms a turn).
            for _ in range(contents.count(anchor)):
                k = contents.index(anchor, start)
                count = batch.counts[k]
                if contents[k] is anchor and count is not None:
                    return batch.messages[k], count
                start = k + 1
        return None

    def _index(self) -> None:
        """Put the named batches' counted messages into the maps a count looks in message by message (in
        place: a caller may hold them; what the maps held already stays, as with ``dict.setdefault``)."""
        for batch in self._unindexed:
            counted = [k for k, count in enumerate(batch.counts) if count is not None]
            messages = [batch.messages[k] for k in counted]
            contents = [batch.contents[k] for k in counted]
            counts = [count for count in batch.counts if count is not None]
            ids = [batch.ids[k] for k in counted]
            objects = dict(zip(ids, zip(messages, contents, counts, strict=True), strict=True))
            objects.update(self._by_object)
            self._by_object.update(objects)
            # The first copy counted keeps its anchor: reversed, so the first is written last. A message with
            # neither content nor calls has no anchor (None): the map gets a key for None, which no lookup asks for.
            anchors = list(map(id, map(_anchor_of, messages, contents)))
            first = dict(zip(reversed(anchors), zip(reversed(messages), reversed(counts), strict=True), strict=True))
            first.update(self._by_anchor)
            self._by_anchor.update(first)
        self._unindexed.clear()

    def _scaled(self, count: int) -> int:
        return count if self.factor == 1.0 else math.ceil(count * self.factor)


_SEQUENCES_PER_TURN = 8  # a turn counts a handful of whole sequences (history, window, composed input)
_LOOKED_FOR_ONE_BY_ONE = 8  # a longer sequence counted message by message indexes the named batches first


@dataclass(frozen=True, slots=True)
class _Batch:
    """Messages named at once (``name_messages``), with their contents, ids, chain hashes and the counts
    the shared cache knew (``None``: counted by name when asked). Holds the messages: their ids stay theirs."""

    messages: tuple[Mapping[str, Any], ...]
    ids: list[int]
    contents: list[Any]
    counts: list[int | None]
    hashes: list[str]


def _nones(values: list[Any], how_many: int) -> list[int]:
    """The indices of the first ``how_many`` ``None`` in ``values``, found at C speed (``list.index``)."""
    out: list[int] = []
    at = -1
    for _ in range(how_many):
        at = values.index(None, at + 1)
        out.append(at)
    return out


def _anchor_of(message: Mapping[str, Any], content: Any) -> Any:
    """``_anchor`` of a message whose content is ``content`` (read already)."""
    return content if content is not None else message.get("tool_calls")


_COUNTED_WHEN_NAMED = 64  # new messages of a named history counted at once (a turn adds a few)
_COUNTED_CHARS_WHEN_NAMED = 500_000  # ... and their text, at most (the compactor's OFFLOAD_CHARS)
_CountedSequence: TypeAlias = tuple[tuple[Mapping[str, Any], ...], tuple[Any, ...], tuple[int, ...]]
_CONTENT = itertools.repeat("content")


def _contents(messages: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Each message's ``content``, in one C-speed pass: ``dict.get`` mapped over the messages (a third of
    what ``operator.methodcaller`` costs, which looks the method up for each); a mapping that is not a
    dict is asked one by one."""
    try:
        return list(map(dict.get, messages, _CONTENT))  # type: ignore[arg-type]
    except TypeError:
        return [message.get("content") for message in messages]


def _text_chars(content: Any) -> int:
    """A rough size of a message's ``content``: its string, or its text parts', where counting spends its time."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        texts = (part.get("text") for part in content if isinstance(part, Mapping))
        return sum(len(text) for text in texts if isinstance(text, str))
    return 0


def counts_of(estimator: TokenEstimator, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """``estimator.count_message`` of each message: in one memoized pass for a turn's counter (``TurnEstimator``
    or its ``unscaled`` view), one call per message for any other."""
    if isinstance(estimator, TurnEstimator | _Unscaled):
        return estimator.counts(messages)  # a list of its own: the memo keeps a tuple
    return [estimator.count_message(message) for message in messages]


def count_named(estimator: TokenEstimator, message: Mapping[str, Any], name: str) -> int:
    """``estimator.count_message(message)``, by ``name`` (see ``TurnEstimator.count_message_named``) where the
    estimator counts by name."""
    if isinstance(estimator, TurnEstimator):
        return estimator.count_message_named(message, name)
    if isinstance(estimator, PrefixTokenEstimator):
        return estimator.count_message_at(name, message)
    return estimator.count_message(message)


def _anchor(message: Mapping[str, Any]) -> Any:
    """The value a shallow copy of ``message`` is found by: its content, else its tool calls (``None``:
    neither, found by object only)."""
    return _anchor_of(message, message.get("content"))


def _same_fields(known: Mapping[str, Any], message: Mapping[str, Any]) -> bool:
    """Whether ``message`` has ``known``'s keys, in order, with the very same value objects (a shallow copy)."""
    return tuple(known) == tuple(message) and all(map(operator.is_, known.values(), message.values()))


class _Unscaled:
    """A ``TurnEstimator``'s base counts, through the ``TokenEstimator`` protocol."""

    def __init__(self, turn: TurnEstimator) -> None:
        self._turn = turn

    def count_text(self, text: str) -> int:
        return self._turn.inner.count_text(text)

    def count_message(self, message: Mapping[str, Any]) -> int:
        return self._turn.base_count_message(message)

    def counts(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        return self._turn.base_counts(messages)

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        return self._turn.base_count_tools(tools)
