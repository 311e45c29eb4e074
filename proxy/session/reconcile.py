"""The backend-independent half of reconciliation: hashing a request, building rows, deciding a fork.

Both backends run the same steps inside one write transaction; only the SQL differs. Keeping the
decisions here is what makes SQLite and PostgreSQL behave identically.
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.kernel import jsonio
from proxy.kernel.canonical import (
    GENESIS,
    HistoryEntry,
    chain_hash_of,
    chain_hashes,
    content_text,
    exact_digest,
    message_hash,
)
from proxy.session.store import BranchCount, BranchState, BranchView, tool_output_ref

# What orjson would write but the standard library refuses (dataclasses, datetimes) or writes its own way
# (subclasses of str, int, dict, list) goes to the standard library instead.
_STDLIB_TYPES_ONLY = (
    orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def json_text(value: Any) -> str:
    """JSON text for storage; keys keep the order the client sent them in.

    Raises ``ValueError`` for values JSON cannot represent (NaN, sets, arbitrary objects).

    orjson writes it (compact; a new session's history is a hundred kilobytes, stored in its first turn's
    transaction, where the standard library took a millisecond) unless its text holds a ``null``: orjson
    writes ``NaN`` and ``Infinity`` as ``null``, where storage must refuse them, so such a value (and
    whatever orjson refuses: a lone surrogate, a >64-bit integer) is written by the standard library.
    Both texts read back as the same value.
    """
    try:
        fast = orjson.dumps(value, option=_STDLIB_TYPES_ONLY)
    except orjson.JSONEncodeError:
        fast = None
    if fast is not None and b"null" not in fast:
        return fast.decode("utf-8")
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except TypeError as exc:
        raise ValueError(f"not JSON-serializable: {exc}") from exc
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (legal in a Python str parsed from JSON) cannot be written as UTF-8;
        # the escaped form round-trips to the same value.
        text = json.dumps(value, ensure_ascii=True, allow_nan=False)
    return text


def load_json(text: str) -> Any:
    """The value stored by ``json_text``, read as the standard library reads it, by orjson where the two
    agree (``jsonio.loads_text``): a new session's first turn reads its whole history back, a hundred
    kilobytes, on the store's writer thread with the GIL held."""
    return jsonio.loads_text(text)


def tool_body(message: Mapping[str, Any]) -> str:
    """The text body a tool message contributes (``read_tool_output``), read from its stored message.

    NUL and lone surrogates are replaced, as when bodies had a PostgreSQL text column of their own, so
    the same body comes back from either backend. The message JSON itself keeps them (escaped).
    """
    body = content_text(message.get("content")).replace("\x00", "\ufffd")
    return body.encode("utf-8", "replace").decode("utf-8") if _has_surrogate(body) else body


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def request_hashes(
    context_id: str,
    messages: Sequence[Mapping[str, Any]],
    memo: ChainMemo | None = None,
    digests: Sequence[bytes] | None = None,
) -> list[str]:
    """Chain hashes of every prefix of a request; an empty request or context id is a caller error.
    ``digests`` are the messages' :func:`~proxy.kernel.canonical.exact_digest`, when the caller has them."""
    if not context_id:
        raise ValueError("context_id must not be empty")
    if not messages:
        raise ValueError("a request must carry at least one message")
    return memo.hashes(context_id, messages, digests) if memo is not None else chain_hashes(messages)


def given_or_computed(
    context_id: str, messages: Sequence[Mapping[str, Any]], given: Sequence[str] | None, memo: ChainMemo
) -> list[str]:
    """The request's chain hashes: ``given`` by a caller that computed them with ``request_hashes`` already
    (hashing a long history again is its largest cost), else computed here."""
    if given is None:
        return request_hashes(context_id, messages, memo)
    if not context_id or not messages or len(given) != len(messages):
        raise ValueError("chain_hashes must be the request_hashes of a non-empty request")
    return list(given)


class ChainMemo:
    """Per recent session, the digests and chain hashes of its last request, so a turn hashes only what is new.

    Clients resend their whole history every turn; canonicalizing and hashing it all again was the
    largest cost of a long session's turn. A leading message whose :func:`~proxy.kernel.canonical.exact_digest`
    equals the one at the same position last time is the same message, so it has the same chain hash,
    and only the rest is hashed. A message that differs only cosmetically is simply hashed again;
    nothing here decides identity. Only digests (17 bytes) and chain hashes are kept, never the messages: the memo's
    size is bounded by ``max_bytes`` however large the messages are, and the least recently used
    sessions are dropped first.

    Across sessions, the canonical hash of each message hashed recently is kept by its exact digest (at
    most ``max_message_hashes``, least recently used first out): an agent opens every session with the same
    system prompt, tens of kilobytes whose canonical form cost more to serialize and hash than the rest of
    a new session's chain (issue 42). A chain hash is then one SHA-256 over two short hex strings. They
    count in ``max_bytes`` too, and go before any session's entry when the memo is full.
    """

    # What one remembered message costs: its digest in a bytes string, a 64-character hex chain hash
    # (a 113-byte str) and its list slot; rounded up. Measured in tests/session/test_reconcile.py.
    BYTES_PER_MESSAGE = 150
    BYTES_PER_SESSION = 400  # besides the session id: the entry's tuple, list and bytes headers, the dict slot

    MAX_MESSAGE_HASHES = 20_000  # a digest and a hex hash each: about 5 MB
    BYTES_PER_MESSAGE_HASH = 250  # the digest, the hex hash and the ordered dict's node; measured in the tests

    def __init__(self, max_bytes: int = 32 * 1024 * 1024, max_message_hashes: int = MAX_MESSAGE_HASHES) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.max_message_hashes = max_message_hashes
        self._last: OrderedDict[str, tuple[bytes, list[str]]] = OrderedDict()
        self._message_hashes: OrderedDict[bytes, str] = OrderedDict()  # exact digest -> message_hash

    def hashes(
        self, context_id: str, messages: Sequence[Mapping[str, Any]], given: Sequence[bytes] | None = None
    ) -> list[str]:
        """Chain hashes of every prefix of ``messages`` (``given``: their exact digests, already made)."""
        if given is not None and len(given) != len(messages):
            raise ValueError("one digest per message")
        listed = list(given) if given is not None else [exact_digest(message) for message in messages]
        digests = b"".join(listed)
        previous = self._last.pop(context_id, None)
        hashes: list[str] = []
        if previous is not None:
            self.size -= _entry_size(context_id, previous[1])
            previous_digests, previous_hashes = previous
            same = _common_messages(previous_digests, digests)
            hashes = previous_hashes[:same]
        current = hashes[-1] if hashes else GENESIS
        for index in range(len(hashes), len(messages)):
            current = chain_hash_of(current, self._message_hash(listed[index], messages[index]))
            hashes.append(current)
        size = _entry_size(context_id, hashes)
        if size <= self.max_bytes:
            self._last[context_id] = (digests, hashes)
            self.size += size
        self._shrink()
        return list(hashes)

    def _shrink(self) -> None:
        """Within ``max_bytes``: remembered message hashes go first, then the least recent sessions."""
        while self.size > self.max_bytes and self._message_hashes:
            self._message_hashes.popitem(last=False)
            self.size -= self.BYTES_PER_MESSAGE_HASH
        while self.size > self.max_bytes:
            evicted_id, (_, evicted) = self._last.popitem(last=False)
            self.size -= _entry_size(evicted_id, evicted)

    def _message_hash(self, digest: bytes, message: Mapping[str, Any]) -> str:
        """``message_hash(message)``, remembered by the message's exact digest across sessions."""
        known = self._message_hashes
        found = known.get(digest)
        if found is not None:
            known.move_to_end(digest)
            return found
        made = known[digest] = message_hash(message)
        self.size += self.BYTES_PER_MESSAGE_HASH
        if len(known) > self.max_message_hashes:
            known.popitem(last=False)
            self.size -= self.BYTES_PER_MESSAGE_HASH
        return made


_DIGEST_BYTES = len(exact_digest({}))


def _entry_size(context_id: str, hashes: Sequence[str]) -> int:
    return ChainMemo.BYTES_PER_SESSION + sys.getsizeof(context_id) + len(hashes) * ChainMemo.BYTES_PER_MESSAGE


def _common_messages(old: bytes, new: bytes) -> int:
    """How many leading messages two digest strings share: the whole of ``old`` (a resent history, nearly
    always) in one comparison, else a binary search over prefix comparisons, each a memcmp, rather than a
    comparison per message."""
    if new.startswith(old):
        return len(old) // _DIGEST_BYTES
    low, high = 0, min(len(old), len(new)) // _DIGEST_BYTES  # low messages are shared, high at most
    while low < high:
        middle = (low + high + 1) // 2
        if new.startswith(old[: middle * _DIGEST_BYTES]):
            low = middle
        else:
            high = middle - 1
    return low


def nearest_state(chain_hashes: Sequence[str], found: Mapping[str, Any]) -> BranchState | None:
    """Of the values ``found`` by prefix, the one at the latest prefix of ``chain_hashes`` (the nearest ancestor)."""
    for chain_hash in reversed(chain_hashes):
        if chain_hash in found:
            return BranchState(chain_hash, found[chain_hash])
    return None


SESSION_WIDE = ""  # the chain hash of session-wide state: the root of every chain


def view_chain(chain_hashes: Sequence[str]) -> list[str]:
    """The prefixes a branch view reads, oldest first: the session-wide root, then the request's chain."""
    return [SESSION_WIDE, *chain_hashes]


def states_found(rows: Iterable[tuple[str, str, str]]) -> dict[str, dict[str, Any]]:
    """State rows (channel, chain hash, JSON text) as channel -> {chain hash: value}."""
    found: dict[str, dict[str, Any]] = {}
    for channel, chain_hash, text in rows:
        found.setdefault(channel, {})[chain_hash] = load_json(text)
    return found


def branch_view(
    chain: Sequence[str],
    found: Mapping[str, Mapping[str, Any]],
    channels: Iterable[str],
    checkpoints: Mapping[str, dict[str, Any]],
) -> BranchView:
    """The view of ``channels`` along ``chain`` (from ``view_chain``), given the values ``found`` on it."""
    states = {}
    for channel in channels:
        nearest = nearest_state(chain, found.get(channel) or {})
        if nearest is not None:
            states[channel] = nearest
    return BranchView(states, checkpoints)


def branch_count(chain_hashes: Sequence[str], counted: Mapping[str, Any]) -> BranchCount:
    """The next count along a request's chain: one more than the nearest count before its head (an
    identical earlier request counted at the same head is a sibling, not a parent)."""
    previous = nearest_state(chain_hashes[:-1], counted)
    done = previous.value if previous is not None and isinstance(previous.value, int) else 0
    return BranchCount(done + 1, previous.chain_hash if previous is not None else None)


def stored_prefix_length(hashes: Sequence[str], is_stored: Callable[[str], bool]) -> int:
    """How many leading prefixes are already stored, asking ``is_stored`` about O(log n) of them.

    A session's stored prefixes are closed under taking prefixes (a message row is only ever written
    after its parent's, and rows go only with their whole session), so the stored ones are exactly the
    leading ones. The search gallops back from the end, because a resent history usually adds only a
    message or two, then bisects."""
    high = len(hashes)  # hashes[high - 1] is not known to be stored
    step = 1
    while high > 0:
        probe = max(high - step, 0)
        if is_stored(hashes[probe]):
            low = probe + 1  # hashes[:low] are stored
            break
        high, step = probe, step * 2
    else:
        return 0
    while low < high:  # hashes[:low] stored, hashes[high] not
        middle = (low + high) // 2
        if is_stored(hashes[middle]):
            low = middle + 1
        else:
            high = middle
    return low


def known_count(hashes: Sequence[str], stored: Collection[str]) -> int:
    """How many leading prefixes are already stored (the continuation point)."""
    for index, chain_hash in enumerate(hashes):
        if chain_hash not in stored:
            return index
    return len(hashes)


@dataclass(frozen=True)
class MessageRow:
    """One message to insert: its place in the chain, its JSON and, for tool messages, the reference its
    body is read back by (from the message itself: the body is stored once, in the message's JSON)."""

    position: int
    chain_hash: str
    parent_hash: str
    message_json: str
    tool_ref: str | None

    def stored(self) -> HistoryEntry:
        """The row as the protocol returns it."""
        return HistoryEntry(load_json(self.message_json), self.chain_hash, self.tool_ref, self.position)


def message_rows(messages: Sequence[Mapping[str, Any]], hashes: Sequence[str], start: int) -> Iterator[MessageRow]:
    """Rows for ``messages[start:]``, serialized one by one (a bad message raises ``ValueError``)."""
    for position in range(start, len(messages)):
        message = messages[position]
        chain_hash = hashes[position]
        try:
            text = json_text(dict(message))
        except ValueError as exc:
            raise ValueError(f"message {position} cannot be stored: {exc}") from exc
        is_tool = message.get("role") == "tool"
        yield MessageRow(
            position=position,
            chain_hash=chain_hash,
            parent_hash=hashes[position - 1] if position else GENESIS,
            message_json=text,
            tool_ref=tool_output_ref(chain_hash) if is_tool else None,
        )


def fork_without_lookup(previous_head: str, hashes: Sequence[str], known: int) -> bool | None:
    """Whether the request left the branch last continued, when the request alone can tell.

    A fork is a request whose history and the previous head's branch diverge: neither is a prefix of
    the other. Continuing, resending, or rewinding to an earlier point of the same branch is not a
    fork. Returns ``None`` when the answer needs the store: every request message is known but the
    previous head is not among them, so the request is either a rewind (its head is an ancestor of the
    previous head) or a switch to another stored branch.
    """
    if not previous_head or previous_head in hashes:
        return False
    if known < len(hashes):
        # New messages follow a point that is not the previous head, so the branches diverge there.
        return True
    return None
