"""Anthropic messages translated recently, by the exact digest of the message as sent: a resent history is
validated and translated once.

Claude Code resends its whole conversation, and its system prompt, on every call. Validating each message
again (the request model, then each block), translating it into chat messages, then validating and
digesting those as chat messages cost a Messages turn about 0.4 ms more than a chat turn of the same
history (chat validates a message seen before once: ``proxy/edge/known_messages.py``). A message's
translation depends on the message alone and on two facts about the route: whether its provider is
Anthropic (cache marks and thinking blocks kept) and whether it is spoken to in the Messages API (the
blocks kept beside the chat form); so the message's :func:`~proxy.kernel.canonical.exact_digest` names
what it became on each kind of route. Whether it is valid depends on the message alone: a message
remembered at all passed validation. The system prompt is remembered the same way, under a key of its own.

What is remembered: the chat messages a message became (kept here, never handed out: every turn gets its
own copies, so whatever a turn does to its messages cannot change the next turn's), their exact digests
(the turn's chain memo takes them instead of digesting again), and how many server blocks it left out.
Only the translations of a request that passed every check, the chat path's cross-message rules
included, are remembered (``remember``), so a remembered message is one that passed them all: the
ingress validates the others only. At most ``max_bytes`` (a message's JSON length counted three times:
the kept chat form, its native blocks, the dicts around them), least recently used first out. The ingress
translates a large body on the reader's two worker threads, hence the lock.
"""

from __future__ import annotations

import marshal
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import orjson

from proxy.edge.resent_requests import fresh_copy
from proxy.kernel.canonical import exact_digest

_SYSTEM = b"s"  # the system prompt's keys: never equal to a message's


@dataclass(frozen=True, slots=True)
class Translated:
    """What one Anthropic message (or the system prompt) became for one kind of route: its chat messages."""

    messages: tuple[dict[str, Any], ...]  # as kept: never handed out (``Recalled.copies``)
    digests: tuple[bytes, ...]  # each chat message's exact digest
    dropped: int  # server blocks left out
    size: int  # the bytes it is counted as


# A remembered message: what it became for each kind of route it was sent to, by ``_route_facts``.
_Entry: TypeAlias = dict[bytes, Translated]


@dataclass
class Recalled:
    """One request's messages as far as the memo knows them: each message's key (and the system prompt's),
    what is remembered of the known ones, and what this request translated anew (for ``remember``)."""

    keys: list[bytes]
    system_key: bytes | None
    known: dict[int, _Entry]  # by message position; -1 is the system prompt
    learned: dict[bytes, tuple[bytes, Translated]] = field(default_factory=dict)

    @property
    def fresh(self) -> list[int]:
        """The positions of the messages no request passed with: only they are validated."""
        return [index for index in range(len(self.keys)) if index not in self.known]

    def copies(
        self, index: int, *, anthropic: bool, native: bool
    ) -> tuple[list[dict[str, Any]], list[bytes], int] | None:
        """The turn's own copy of the chat messages the message at ``index`` became on such a route, with
        their digests and how many server blocks it left out; ``None`` when it is to be translated now."""
        translated = self.known.get(index, {}).get(_route_facts(anthropic, native))
        if translated is None:
            return None
        return _copied(translated.messages), list(translated.digests), translated.dropped

    def learn(
        self, index: int, messages: Sequence[dict[str, Any]], dropped: int, *, anthropic: bool, native: bool
    ) -> list[bytes]:
        """Note what the message at ``index`` became on such a route (the caller keeps ``messages``: a copy is
        kept here), for ``remember`` once the request passes; returns their exact digests."""
        digests = [exact_digest(message) for message in messages]
        key = self.system_key if index < 0 else self.keys[index]
        if key is not None:
            size = 3 * sum(len(orjson.dumps(message, default=repr)) for message in messages)
            kept = tuple(fresh_copy(message) for message in messages)
            self.learned[key] = (_route_facts(anthropic, native), Translated(kept, tuple(digests), dropped, size))
        return digests


class MessageTranslations:
    """A bounded, thread-safe memo of translated Anthropic messages, by the exact digest of each as sent."""

    DEFAULT_MAX_BYTES = 32 * 1024 * 1024  # a hundred sessions of a 100 KB system prompt and their histories

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()  # least recently used first
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def recall(self, messages: Any, system: Any, digests: Sequence[bytes] = ()) -> Recalled | None:
        """What is remembered of a request's ``messages`` and ``system`` prompt (their raw values); ``None``
        for a body whose ``messages`` is not a list (full validation names the problem). ``digests``: the
        exact digests of its leading messages, already made."""
        if not isinstance(messages, list):
            return None
        keys = [*digests, *map(exact_digest, messages[len(digests) :])]
        system_key = None if system is None else _SYSTEM + exact_digest(system)
        with self._lock:
            known = {index: self._used(key) for index, key in enumerate(keys) if key in self._entries}
            if system_key is not None and system_key in self._entries:
                known[-1] = self._used(system_key)
        return Recalled(keys, system_key, known)

    def remember(self, recalled: Recalled) -> None:
        """Remember what a request that passed every check translated anew."""
        with self._lock:
            for key, (facts, translated) in recalled.learned.items():
                entry = self._entries.setdefault(key, {})
                if facts in entry or translated.size > self.max_bytes:
                    continue
                entry[facts] = translated
                self._bytes += translated.size
            while self._bytes > self.max_bytes:
                _, oldest = self._entries.popitem(last=False)
                self._bytes -= sum(translated.size for translated in oldest.values())

    def _used(self, key: bytes) -> _Entry:
        self._entries.move_to_end(key)
        return dict(self._entries[key])  # the request's own view: ``remember`` may add to the entry


def _route_facts(anthropic: bool, native: bool) -> bytes:
    """What a translation depends on besides the message: whether the route's provider is Anthropic, and
    whether the route is spoken to in the Messages API."""
    return bytes((anthropic, native))


def _copied(messages: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """A copy of kept chat messages, at C speed (``marshal`` copies plain JSON values, keys' order kept);
    anything it refuses is copied container by container."""
    try:
        copies: list[dict[str, Any]] = marshal.loads(marshal.dumps(list(messages)))
    except ValueError:  # a value that is not plain JSON
        return [fresh_copy(message) for message in messages]
    return copies
