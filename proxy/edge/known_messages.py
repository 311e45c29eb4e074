"""The messages the chat edge validated recently, by exact digest: a message seen before is validated once.

Agents resend their whole history on every turn. Validating each of its messages again (pydantic, about
5 ms for 1,000 messages) was the edge's largest cost after the JSON decode. A message whose
:func:`~proxy.kernel.canonical.exact_digest` is remembered here is the very message (equal digests mean equal
values) that passed validation before, and a message's validity depends on the message alone (the
cross-message rules, ``check_tool_pairing``, run on every request); so only the others are validated.
(A request that resends a recent request's messages is recognized before it is even decoded, by its
bytes: ``proxy/edge/resent_requests.py``; this catches the rest, a history resent in another body, say.)

Only digests (17 bytes each) are kept, at most ``max_entries`` of them, the least recently used going
first. The chat edge decodes large bodies on two worker threads at once, hence the lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence


class KnownMessages:
    """A bounded, thread-safe set of the exact digests of validated messages."""

    DEFAULT_MAX_ENTRIES = 200_000  # about 30 MB with the dict's own overhead: 200 sessions of 1,000 messages

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._digests: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._digests)

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
