"""The messages the chat edge validated recently, by exact digest: a resent history is validated once,
and the requests it validated recently, by their serialized messages: a resent history is digested once.

Agents resend their whole history on every turn. Validating each of its messages again (pydantic, about
5 ms for 1,000 messages) was the edge's largest cost after the JSON decode. A message whose
:func:`~proxy.canonical.exact_digest` is remembered here is the very message (equal digests mean equal
values) that passed validation before, and a message's validity depends on the message alone (the
cross-message rules, ``check_tool_pairing``, run on every request); so only the others are validated.

Digesting each message (an encoding and a SHA-256 per message) was then the largest part of what was
left. A request that repeats a recent request's messages and adds some is recognized instead: the
recent request is found by the digest of its last message (walking back over the new request's tail,
which is digested anyway), and it is the very prefix when the new request's messages, encoded as one
compact JSON array by orjson, start with the bytes of that request's array (``[m1,...,mk`` followed by
a comma: a JSON value ends where its text ends, so the first ``k`` messages encode, hence are, exactly
those messages, types and key order included). Its digests are then taken as they are, and its
messages need no validation: the request passed it whole.

Only digests (17 bytes each) are kept for single messages, at most ``max_entries`` of them; the
requests' encodings (and their digests) at most ``max_request_bytes`` in all; the least recently used
go first. The chat edge decodes large bodies on two worker threads at once, hence the lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.canonical import exact_digest

# How far back from a request's end its previous request's last message is looked for: a turn appends
# the answer and a user message, or a tool step's call and its results.
_TAIL_SEARCH = 64


@dataclass(frozen=True)
class Digested:
    """A request's messages digested: every message's exact digest, how many leading ones repeat a request
    validated before (``resent``), and the messages' encoding to remember the request by (``None``: the
    messages could not be encoded as one array, so the request is not remembered)."""

    digests: list[bytes]
    resent: int
    encoded: bytes | None


class KnownMessages:
    """A bounded, thread-safe set of the exact digests of validated messages, and of recent requests."""

    DEFAULT_MAX_ENTRIES = 200_000  # about 30 MB with the dict's own overhead: 200 sessions of 1,000 messages
    # The encodings of recent requests: a 1,000-message history is about 1.5 MB of them, so this keeps
    # the last request of the few sessions an operator's agents are running at once.
    DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024

    def __init__(
        self, max_entries: int = DEFAULT_MAX_ENTRIES, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    ) -> None:
        self.max_entries = max_entries
        self.max_request_bytes = max_request_bytes
        self._digests: OrderedDict[bytes, None] = OrderedDict()
        # Last message's digest -> (the request's encoded messages, their digests); by bytes, oldest first.
        self._requests: OrderedDict[bytes, tuple[bytes, list[bytes]]] = OrderedDict()
        self._request_bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._digests)

    def digest(self, messages: Sequence[Any]) -> Digested:
        """The exact digest of each of ``messages``, the resent prefix's taken from the request it repeats."""
        try:
            encoded: bytes | None = orjson.dumps(messages)
        except TypeError:  # what orjson refuses (a lone surrogate, a huge integer): digested one by one
            encoded = None
        tail: list[bytes] = []
        if encoded is not None:
            for index in range(len(messages) - 1, max(-1, len(messages) - 1 - _TAIL_SEARCH), -1):
                tail.append(exact_digest(messages[index]))
                prefix = self._prefix_digests(tail[-1], index + 1, encoded)
                if prefix is not None:
                    tail.pop()  # the prefix's last message, which the prefix's digests include
                    return Digested([*prefix, *reversed(tail)], index + 1, encoded)
        head = [exact_digest(message) for message in messages[: len(messages) - len(tail)]]
        return Digested([*head, *reversed(tail)], 0, encoded)

    def _prefix_digests(self, last: bytes, count: int, encoded: bytes) -> list[bytes] | None:
        with self._lock:
            known = self._requests.get(last)
        if known is None:
            return None
        prefix, digests = known
        if len(digests) != count:
            return None
        # ``prefix`` is ``[m1,...,mk]``: the request is the same, or starts with those ``k`` messages and a comma.
        comma = encoded[len(prefix) - 1 : len(prefix)] == b","  # a slice: never an index past the end
        if encoded == prefix or (comma and encoded.startswith(prefix[:-1])):
            return digests
        return None

    def unknown(self, digests: Sequence[bytes]) -> list[int]:
        """The positions of ``digests`` not validated before, oldest first."""
        with self._lock:
            known = self._digests
            return [index for index, digest in enumerate(digests) if digest not in known]

    def remember(self, digests: Sequence[bytes]) -> None:
        """Record ``digests`` as validated (their messages passed), most recently used last."""
        with self._lock:
            known = self._digests
            for digest in digests:
                if digest in known:
                    known.move_to_end(digest)
                else:
                    known[digest] = None
            while len(known) > self.max_entries:
                known.popitem(last=False)

    def remember_request(self, digested: Digested) -> None:
        """Record a request whose messages all passed validation, and its new messages' digests. The
        request it repeated is forgotten: a session's next turn repeats this one."""
        digests, encoded = digested.digests, digested.encoded
        self.remember(digests[digested.resent :])
        with self._lock:
            if digested.resent:
                self._forget(digests[digested.resent - 1])
            if encoded is None or not digests or _request_size(encoded, digests) > self.max_request_bytes:
                return
            self._forget(digests[-1])
            self._requests[digests[-1]] = (encoded, list(digests))
            self._request_bytes += _request_size(encoded, digests)
            while self._request_bytes > self.max_request_bytes:
                _, evicted = self._requests.popitem(last=False)
                self._request_bytes -= _request_size(*evicted)

    def _forget(self, last: bytes) -> None:
        forgotten = self._requests.pop(last, None)
        if forgotten is not None:
            self._request_bytes -= _request_size(*forgotten)


_DIGEST_SLOT_BYTES = 64  # a 17-byte digest as a bytes object and its list slot, rounded up


def _request_size(encoded: bytes, digests: Sequence[bytes]) -> int:
    return len(encoded) + len(digests) * _DIGEST_SLOT_BYTES
