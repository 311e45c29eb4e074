"""Token estimators: a tokenizer-free conservative one, an exact tiktoken one, a scaled one (tiktoken
corrected by what the provider reported, see ``calibration.py``), and a per-message cache.

The assembler only sees the :class:`~proxy.context.types.TokenEstimator` protocol, so a provider can
inject its exact tokenizer without changing anything else.
"""

from __future__ import annotations

import hashlib
import math
import operator
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from proxy.canonical import HistoryEntry, canonical_message, content_text, message_digest, stable_json
from proxy.context.cjk_costs import cost_table
from proxy.context.types import PrefixTokenEstimator, TokenEstimator

# Every chat message costs a few framing tokens (role, separators) on top of its content; OpenAI's
# documented figure is 3-4, plus 3 priming the reply. 4 keeps us on the safe side per message.
MESSAGE_OVERHEAD_TOKENS = 4
# Tool schemas are rendered by the provider into a hidden preamble. The per-tool framing is a guess;
# the JSON text of the schema dominates anyway.
TOOL_OVERHEAD_TOKENS = 8
# Upper bound for one image part: OpenAI's high-detail formula (85 + 170 per 512px tile) stays below
# this for the largest image it accepts after downscaling.
IMAGE_PART_TOKENS = 1600

# Pieces roughly as tiktoken's pre-tokenizer cuts text: a word with its leading space, a digit run,
# a punctuation run with its leading space, a run of non-ASCII characters with its leading space, a
# whitespace run (leaving its last space to the next piece, as tiktoken does), and any other single
# character (control characters), so nothing goes uncounted. Each piece is at least one token and at
# most one token per UTF-8 byte; the costs below sit in between.
_PIECE = re.compile(
    r" ?[A-Za-z]+|[0-9]+| ?[!-/:-@\[-`{-~]+| ?[^\x00-\x7f]+|[ \t\n\r\f\v]+(?![^ \t\n\r\f\v])|[ \t\n\r\f\v]+|.",
    re.DOTALL,
)
_WORDLIKE = re.compile(r" ?(?:[a-z]+|[A-Z][a-z]+)")
_VOWEL = re.compile(r"[aeiouy]")
_CONSONANT_CLUSTER = re.compile(r"[^aeiouy ]{5}", re.IGNORECASE)


def _letters_cost(piece: str) -> float:
    n = len(piece.lstrip(" "))
    if _WORDLIKE.fullmatch(piece) and _VOWEL.search(piece) and not _CONSONANT_CLUSTER.search(piece):
        # Natural-language words: about one token per 4 letters, at least one per word.
        return 1.0 + (n - 1) / 4
    # Acronyms, identifiers in odd case, base64 and hash fragments: close to one token per letter pair
    # or worse, since the vocabulary rarely has them.
    return 0.75 * n + 0.5


def _non_ascii_cost(piece: str) -> int:
    table = cost_table()
    # Characters outside the table (emoji, accented Latin, Cyrillic...) cost their UTF-8 length: every
    # byte is a token in both encodings, so that can never be an under-count. A leading space costs 1
    # the same way, and the character after it its UTF-8 length too: a space can merge with that
    # character's first byte and split the rest (cl100k cuts " 倍" into three tokens although "倍" alone
    # is one), so the table's cost of the character on its own does not bound it there.
    if piece.startswith(" ") and len(piece) > 1:
        return 1 + len(piece[1].encode("utf-8")) + sum(table.get(ch) or len(ch.encode("utf-8")) for ch in piece[2:])
    return sum(table.get(ch) or len(ch.encode("utf-8")) for ch in piece)


class ConservativeTokenEstimator:
    """An upper estimate of tiktoken's ``cl100k_base`` and ``o200k_base`` counts, without a tokenizer.

    Words cost by length, digits by groups of three, punctuation runs a little under one token per
    character (pairs such as ``":`` merge), CJK by a generated per-character table of worst-case
    costs, any other non-ASCII character by its bytes; each piece is capped by its UTF-8 length (a hard
    upper bound). ``slack`` absorbs the rare word that the vocabulary splits more finely than the word
    rule assumes. Over-count on whole documents: about 1.9x for English prose and code, 1.45x
    (cl100k) / 1.9x (o200k) for Chinese; ``tests/context/test_estimators.py`` holds the proof.
    """

    def __init__(self, *, slack: int = 2, message_overhead: int = MESSAGE_OVERHEAD_TOKENS) -> None:
        self.slack = slack
        self.message_overhead = message_overhead

    def count_text(self, text: str) -> int:
        """Estimated tokens of ``text``."""
        if not text:
            return 0
        total = 0.0
        for match in _PIECE.finditer(text):
            piece = match.group()
            first = piece[0] if piece[0] != " " or len(piece) == 1 else piece[1]
            if first.isascii() and first.isalpha():
                cost = _letters_cost(piece)
            elif first.isascii() and first.isdigit():
                cost = math.ceil(len(piece) / 3)
            elif piece.isascii() and piece.isspace():
                cost = 1 + len(piece) // 8
            elif not first.isascii():
                cost = _non_ascii_cost(piece)
            else:
                cost = 0.3 + 0.7 * len(piece)  # punctuation: usually merges in pairs, rarely in runs of 3+
            total += min(cost, len(piece.encode("utf-8")))
        return math.ceil(total) + self.slack

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Estimated tokens of one chat message, framing included."""
        return _count_message(self, message, self.message_overhead)

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Estimated tokens of the tool schemas as the provider renders them."""
        return sum(self.count_text(stable_json(tool)) + TOOL_OVERHEAD_TOKENS for tool in tools)


# OpenAI model families on the older encoding; every other model (gpt-4o, gpt-4.1, gpt-5, the o-series,
# and all non-OpenAI models, for which tiktoken is only the base that calibration corrects) uses o200k.
_CL100K_PREFIXES = ("gpt-4", "gpt-3.5", "gpt-35", "text-embedding-", "davinci", "babbage")
_O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-4.5", "chatgpt-4o")


def tiktoken_encoding_for(model: str) -> str:
    """The tiktoken encoding for a model string (``openai/gpt-4o``, ``azure/gpt-35-turbo``, ``claude-...``)."""
    name = model.rsplit("/", 1)[-1].lower()
    if name.startswith(_O200K_PREFIXES):
        return "o200k_base"
    return "cl100k_base" if name.startswith(_CL100K_PREFIXES) else "o200k_base"


class TiktokenEstimator:
    """Exact counts with a tiktoken encoding (OpenAI models); messages get the same framing overhead."""

    def __init__(self, encoding_name: str = "o200k_base", *, message_overhead: int = MESSAGE_OVERHEAD_TOKENS) -> None:
        import tiktoken  # local import: tiktoken loads its encodings lazily, keep the package import cheap

        self.encoding_name = encoding_name
        self.message_overhead = message_overhead
        self._encoding = tiktoken.get_encoding(encoding_name)

    def count_text(self, text: str) -> int:
        """Exact tokens of ``text`` (special-token text counted as ordinary text)."""
        return len(self._encoding.encode(text, disallowed_special=())) if text else 0

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Tokens of one chat message, framing included."""
        return _count_message(self, message, self.message_overhead)

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of the tool schemas' JSON plus per-tool framing."""
        return sum(self.count_text(stable_json(tool)) + TOOL_OVERHEAD_TOKENS for tool in tools)


class ScaledEstimator:
    """Another estimator's counts times ``factor``, rounded up: a base count corrected for a provider
    whose tokenizer differs (the factor comes from calibration). Wrap a cached base: every count here is
    a multiplication of one the base already knows."""

    def __init__(self, inner: TokenEstimator, factor: float) -> None:
        self.inner = inner
        self.factor = factor
        # Checked once: a runtime protocol check costs microseconds, a count by chain hash well under one.
        self._named = inner if isinstance(inner, PrefixTokenEstimator) else None

    def count_text(self, text: str) -> int:
        """The base count of ``text``, scaled."""
        return math.ceil(self.inner.count_text(text) * self.factor)

    def count_message(self, message: Mapping[str, Any]) -> int:
        """The base count of one message, scaled."""
        return math.ceil(self.inner.count_message(message) * self.factor)

    def count_message_at(self, chain_hash: str, message: Mapping[str, Any]) -> int:
        """The base count of a history message (looked up by its chain hash when the base can), scaled: the
        base count is what is cached, so a new calibration factor never meets a stale scaled count."""
        named = self._named
        base = named.count_message_at(chain_hash, message) if named is not None else self.inner.count_message(message)
        return math.ceil(base * self.factor)

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """The base count of the tool schemas, scaled."""
        return math.ceil(self.inner.count_tools(tools) * self.factor)


def _count_message(estimator: TokenEstimator, message: Mapping[str, Any], overhead: int) -> int:
    canon = canonical_message(message)
    total = overhead + estimator.count_text(content_text(canon.get("content")))
    for key in ("name", "tool_call_id"):
        if isinstance(canon.get(key), str):
            total += estimator.count_text(canon[key])
    for call in canon.get("tool_calls", ()):
        # The provider sees the call's id, name and arguments; their JSON text bounds all three.
        total += estimator.count_text(stable_json(call))
    if "function_call" in canon:
        total += estimator.count_text(stable_json(canon["function_call"]))
    content = canon.get("content")
    if isinstance(content, list):
        for part in content:
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "text":
                continue
            # An image costs the provider a bounded number of tokens whatever its bytes; charging its
            # base64 text would make one screenshot look like a book. Other parts (audio, files) have
            # provider-specific costs: their JSON keeps them from being free.
            total += IMAGE_PART_TOKENS if kind == "image_url" else estimator.count_text(stable_json(part))
    return total


class CachingEstimator:
    """Wraps an estimator and caches its counts, so a turn only pays for what is new.

    Every entry is keyed by a 17-byte digest, never by the text: messages by
    :func:`~proxy.canonical.message_digest` (equal digests mean equal canonical messages, so a hit is
    never wrong; cosmetic variants at worst miss), history messages also by their chain hash
    (``count_message_at``: the name reconciliation gave them, so the unchanged prefix of a resent
    history costs a lookup per message, not a digest of its content), texts (sections, the system
    prompt) and tool lists by a BLAKE2b digest of their text. Keys and values are small and of fixed
    size, which is why the byte bound ``max_bytes`` is kept as an entry count (``max_bytes //
    ENTRY_BYTES``), however large the messages (a process serving hundreds of sessions with 200 KB
    tool outputs must not keep those outputs alive through its cache keys). Only base counts are
    cached: a calibrated route scales them afterwards (``ScaledEstimator``). One instance should live
    as long as the estimates stay valid.

    Thread-safe: the compactor counts a large history on a worker thread while the event loop counts
    other sessions' requests with the same instance. Reads are single dict lookups; storing (with its
    eviction) holds a lock, and the counting itself runs outside it. ``hits`` and ``misses`` are
    statistics and may lose an increment under that concurrency.
    """

    # Measured with tracemalloc: a 17-byte key, its int and the dict slot come to about 140 bytes;
    # ints above 256 are separate objects. Rounded up, so the bound stated above holds.
    ENTRY_BYTES = 200

    DEFAULT_MAX_BYTES = 20 * 1024 * 1024  # 100,000 entries: a 1,000-message history in 100 sessions

    def __init__(self, inner: TokenEstimator, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.inner = inner
        self.max_bytes = max_bytes
        self.max_entries = max(1, max_bytes // self.ENTRY_BYTES)
        self.hits = 0
        self.misses = 0
        self._cache: dict[bytes, int] = {}
        self._lock = threading.Lock()

    def count_text(self, text: str) -> int:
        """Cached by a digest of the text."""
        return self._cached(_TEXT + _digest(text), lambda: self.inner.count_text(text))

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Cached per canonical message content."""
        return self._cached(message_digest(message), lambda: self.inner.count_message(message))

    def count_message_at(self, chain_hash: str, message: Mapping[str, Any]) -> int:
        """Cached by the message's chain hash too: equal chain hashes mean equal canonical messages (after
        equal histories), so a hit is never wrong. A miss (a message new to this chain) is counted through
        the content cache, so a forked history's copies of known messages are still not counted again."""
        key = _chain_key(chain_hash)
        cached = self._cache.get(key) if key is not None else None
        if cached is not None:
            self.hits += 1
            return cached
        count = self.count_message(message)
        if key is not None:
            self._store(key, count)
        return count

    def known_count_at(self, chain_hash: str) -> int | None:
        """The cached count of the history message named ``chain_hash``, or ``None`` (nothing is counted)."""
        key = _chain_key(chain_hash)
        cached = self._cache.get(key) if key is not None else None
        if cached is not None:
            self.hits += 1
        return cached

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Cached by a digest of the tools' stable JSON."""
        return self._cached(_TOOLS + _digest(stable_json(list(tools))), lambda: self.inner.count_tools(tools))

    def _cached(self, key: bytes, compute: Callable[[], int]) -> int:
        cached = self._cache.get(key)
        if cached is not None:
            self.hits += 1
            return cached
        self.misses += 1
        value = compute()
        self._store(key, value)
        return value

    def _store(self, key: bytes, value: int) -> None:
        with self._lock:
            if key not in self._cache and len(self._cache) >= self.max_entries:
                # Insertion-ordered dict: evicting the oldest entry keeps the cache bounded without an LRU.
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = value


# Key prefixes: message digests start with b"f" or b"c" (see message_digest), so the spaces never meet.
_TEXT, _TOOLS, _CHAIN = b"t", b"T", b"h"


def _chain_key(chain_hash: str) -> bytes | None:
    """The cache key of a SHA-256 hex chain hash (``proxy/canonical.py``): its first 128 bits, like every
    other key here. ``None`` for anything else, which is then counted by content only."""
    if len(chain_hash) != 64:
        return None
    try:
        return _CHAIN + bytes.fromhex(chain_hash[:32])
    except ValueError:
        return None


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


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
        # The shared cache's own lookup of a named message's count, used when naming (``None``: another counter).
        self._known_at = inner.known_count_at if isinstance(inner, CachingEstimator) else None
        self._by_object: dict[int, tuple[Mapping[str, Any], Any, int]] = {}  # id -> (message, content, count)
        self._by_anchor: dict[int, tuple[Mapping[str, Any], int]] = {}  # id of content -> (message, count)
        self._named: dict[int, tuple[Mapping[str, Any], str]] = {}  # id -> (message, chain hash)
        self._named_by_anchor: dict[int, tuple[Mapping[str, Any], str]] = {}  # id of content -> (message, hash)
        self._last_named: tuple[tuple[Mapping[str, Any], ...], list[str]] = ((), [])
        # ids of a counted message sequence -> (the messages, their contents, base counts): see ``base_counts``
        self._sequences: dict[tuple[int, ...], _CountedSequence] = {}

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
        self._last_named = (tuple(messages), hashes)
        named, by_anchor = self._named, self._named_by_anchor
        # A message the shared cache already counted (the resent prefix: nearly all) is memoized here and
        # now, in this one pass, as if counted: the turn's first count of it is then a memo hit.
        known = self._known_at
        by_object, counted_by_anchor = self._by_object, self._by_anchor
        for message, chain_hash in zip(messages, chain_hashes, strict=True):
            named[id(message)] = (message, chain_hash)
            content = message.get("content")
            anchor = content if content is not None else message.get("tool_calls")  # _anchor, inlined
            if anchor is not None:
                by_anchor[id(anchor)] = (message, chain_hash)
            tokens = known(chain_hash) if known is not None else None
            if tokens is not None:
                by_object[id(message)] = (message, content, tokens)
                if anchor is not None:
                    counted_by_anchor.setdefault(id(anchor), (message, tokens))

    def count_text(self, text: str) -> int:
        """Passed through (scaled): texts are few per turn."""
        return self._scaled(self.inner.count_text(text))

    def count_message(self, message: Mapping[str, Any]) -> int:
        """The inner count, once per distinct message content, scaled."""
        return self._scaled(self.base_count_message(message))

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Passed through (scaled)."""
        return self._scaled(self.inner.count_tools(tools))

    def counts(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """``count_message`` of each of ``messages``, in one pass (see ``base_counts``)."""
        base = self.base_counts(messages)
        factor = self.factor
        return base if factor == 1.0 else [math.ceil(count * factor) for count in base]

    def base_counts(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """``base_count_message`` of each of ``messages``, memoized for the sequence as a whole.

        Several stages count one sequence of the same message objects (the validator the composed input,
        then the calibration sample what was sent): the second time it is recognized in C-speed passes
        (the ids, and each message's content still the one counted) instead of one lookup per message.
        """
        key = tuple(map(id, messages))
        contents = tuple(map(_content_of, messages))
        seen = self._sequences.get(key)
        if seen is not None and all(map(operator.is_, seen[1], contents)):
            return list(seen[2])
        by_object, by_anchor, count = self._by_object, self._by_anchor, self.base_count_message
        out: list[int] = []
        for message, content in zip(messages, contents, strict=True):
            # base_count_message's two cheap answers, inlined (a call per message is most of their cost):
            # the very message counted before, or a shallow copy of one (the composer's, nearly all).
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
        if len(self._sequences) >= _SEQUENCES_PER_TURN:
            self._sequences.pop(next(iter(self._sequences)))
        self._sequences[key] = (tuple(messages), contents, tuple(out))  # holds the messages: their ids stay theirs
        return out

    def unscaled(self) -> TokenEstimator:
        """This memo's base counts (what calibration compares with the provider's figure)."""
        return _Unscaled(self)

    def base_count_message(self, message: Mapping[str, Any]) -> int:
        """The inner estimator's count of ``message``, memoized."""
        seen = self._by_object.get(id(message))
        content = message.get("content")
        if seen is not None and seen[0] is message and seen[1] is content:
            return seen[2]
        tokens = self._count_new(message)
        self._by_object[id(message)] = (message, content, tokens)
        anchor = _anchor(message)
        if anchor is not None:
            self._by_anchor.setdefault(id(anchor), (message, tokens))
        return tokens

    def _count_new(self, message: Mapping[str, Any]) -> int:
        """A message this memo has not seen as this object: a named one, a copy, or one to count."""
        prefix = self._prefix
        named = self._named.get(id(message))
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

    def _scaled(self, count: int) -> int:
        return count if self.factor == 1.0 else math.ceil(count * self.factor)


_SEQUENCES_PER_TURN = 8  # a turn counts a handful of whole sequences (history, window, composed input)
_CountedSequence: TypeAlias = tuple[tuple[Mapping[str, Any], ...], tuple[Any, ...], tuple[int, ...]]
_content_of = operator.methodcaller("get", "content")


def counts_of(estimator: TokenEstimator, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """``estimator.count_message`` of each message: in one memoized pass for a turn's counter (``TurnEstimator``
    or its ``unscaled`` view), one call per message for any other."""
    if isinstance(estimator, TurnEstimator | _Unscaled):
        return estimator.counts(messages)  # a list of its own: the memo keeps a tuple
    return [estimator.count_message(message) for message in messages]


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
        return self._turn.inner.count_tools(tools)
