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
from typing import Any, TypeAlias

from proxy.canonical import HistoryEntry
from proxy.context.estimators import CachingEstimator
from proxy.context.types import PrefixTokenEstimator, TokenEstimator


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
        self._prefix = inner if isinstance(inner, PrefixTokenEstimator) else None
        # The shared cache's own lookup of named messages' counts, used when naming (``None``: another counter).
        self._known_at = inner.known_counts_at if isinstance(inner, CachingEstimator) else None
        self._by_object: dict[int, tuple[Mapping[str, Any], Any, int]] = {}  # id -> (message, content, count)
        self._by_anchor: dict[int, tuple[Mapping[str, Any], int]] = {}  # id of content -> (message, count)
        self._named: dict[int, tuple[Mapping[str, Any], str]] = {}  # id -> (message, chain hash)
        self._named_by_anchor: dict[int, tuple[Mapping[str, Any], str]] = {}  # id of content -> (message, hash)
        self._last_named: tuple[tuple[Mapping[str, Any], ...], list[str]] = ((), [])
        # Named messages the shared cache knew (memoized, not named one by one): (messages, ids, hashes)
        self._known_names: list[tuple[tuple[Mapping[str, Any], ...], list[int], list[str]]] = []
        # ids of the tools' functions -> (the tools, their base count): see ``count_tools``
        self._tools: dict[tuple[int, ...], tuple[tuple[Mapping[str, Any], ...], int]] = {}
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
        # In C-speed passes (map, zip, dict.update) rather than a loop body per message: a resent history
        # is thousands of messages, nearly all of them already counted by the shared cache. A message
        # with neither content nor calls has no anchor (None): the anchor maps get a key for None, which
        # no lookup asks for (see ``_anchor``).
        ids = list(map(id, messages))
        contents = _contents(messages)
        anchors = [c if c is not None else m.get("tool_calls") for m, c in zip(messages, contents, strict=True)]
        anchor_ids = list(map(id, anchors))
        # A message the shared cache already counted (the resent prefix: nearly all) is memoized here and
        # now, as if counted: the turn's first count of it is then a memo hit, for it and for its shallow
        # copies (by its anchor). Only the others need their names, to be counted by them when asked: a
        # known message's name would only ever find the count it is memoized with.
        known: list[int | None] = self._known_at(hashes) if self._known_at is not None else [None] * len(hashes)
        c_known = [tokens for tokens in known if tokens is not None]  # only what is counted is memoized
        if len(c_known) < len(known):  # some messages are new
            kept = [k for k, tokens in enumerate(known) if tokens is not None]
            c_ids, c_messages = [ids[k] for k in kept], [messages[k] for k in kept]
            c_contents, c_anchors = [contents[k] for k in kept], [anchor_ids[k] for k in kept]
            new = [k for k, tokens in enumerate(known) if tokens is None]
            named = [(messages[k], hashes[k]) for k in new]
            self._named.update(zip([ids[k] for k in new], named, strict=True))
            self._named_by_anchor.update(zip([anchor_ids[k] for k in new], named, strict=True))
        else:
            c_ids, c_messages, c_contents, c_anchors = ids, list(messages), contents, anchor_ids
        if c_known:  # their names, for a memoized message rewritten in place since (``_name_of_known``)
            self._known_names.append((named_messages, ids, hashes))
        self._by_object.update(zip(c_ids, zip(c_messages, c_contents, c_known, strict=True), strict=True))
        # The first copy counted keeps its anchor (setdefault's rule): reversed, so the first is written last.
        first = dict(zip(reversed(c_anchors), zip(reversed(c_messages), reversed(c_known), strict=True), strict=True))
        first.update(self._by_anchor)
        self._by_anchor = first
        # A warm turn's history is all known but what it adds: counting those few now lets every stage that
        # counts this very sequence (the compactor, the trace's size of the request) find it whole. Many
        # unknown messages (a first request) are left to the stages, which count a large history off the loop.
        unknown = [index for index, tokens in enumerate(known) if tokens is None]
        if len(unknown) <= _COUNTED_WHEN_NAMED:
            counts = [
                self.base_count_message(messages[i]) if tokens is None else tokens for i, tokens in enumerate(known)
            ]
            self._remember_sequence(tuple(ids), tuple(messages), tuple(contents), tuple(counts))

    def count_text(self, text: str) -> int:
        """Passed through (scaled): texts are few per turn."""
        return self._scaled(self.inner.count_text(text))

    def count_message(self, message: Mapping[str, Any]) -> int:
        """The inner count, once per distinct message content, scaled."""
        return self._scaled(self.base_count_message(message))

    def count_message_named(self, message: Mapping[str, Any], name: str) -> int:
        """``count_message`` of a message that ``name`` names as a chain hash names a history message
        (equal names, equal canonical messages): counted by that name by an inner estimator that can."""
        seen = self._by_object.get(id(message))
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
        count = self.inner.count_tools(tools)
        self._tools[key] = (tuple(tools), count)  # holds the tools: their ids stay theirs
        return count

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
        seen = self._by_object.get(id(message))
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
            known = self._by_anchor.get(id(anchor))
            if known is not None and _same_fields(known[0], message):
                return known[1]
            original = self._named_by_anchor.get(id(anchor))
            if original is not None and prefix is not None and _same_fields(original[0], message):
                return prefix.count_message_at(original[1], message)
        return self.inner.count_message(message)

    def _name_of_known(self, message: Mapping[str, Any]) -> tuple[Mapping[str, Any], str] | None:
        """The chain hash a memoized message was named by (no stage rewrites one in place: this is the
        rare way, a search of what was named rather than a map kept for every message of every turn)."""
        for messages, ids, hashes in self._known_names:
            with contextlib.suppress(ValueError):
                k = ids.index(id(message))
                if messages[k] is message:
                    return message, hashes[k]
        return None

    def _scaled(self, count: int) -> int:
        return count if self.factor == 1.0 else math.ceil(count * self.factor)


_SEQUENCES_PER_TURN = 8  # a turn counts a handful of whole sequences (history, window, composed input)
_COUNTED_WHEN_NAMED = 64  # new messages of a named history counted at once (a turn adds a few)
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
    content = message.get("content")
    return content if content is not None else message.get("tool_calls")


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
