"""Token estimators: a tokenizer-free conservative one, an exact tiktoken one, a scaled one (tiktoken
corrected by what the provider reported, see ``calibration.py``), and a per-message cache. The per-turn
memo over them, which finds a message again by identity, is ``turn_estimator.py``.

The assembler only sees the :class:`~proxy.context.types.TokenEstimator` protocol, so a provider can
inject its exact tokenizer without changing anything else.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from proxy.context.cjk_costs import cost_table
from proxy.context.types import PrefixTokenEstimator, TokenEstimator
from proxy.kernel.canonical import canonical_message, content_text, memo_digest, message_digest, stable_json

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
        """Exact tokens of ``text`` (special-token text counted as ordinary text); a very long text in pieces."""
        if len(text) <= _ENCODE_PIECE_CHARS:
            return len(self._encoding.encode(text, disallowed_special=())) if text else 0
        return sum(len(self._encoding.encode(piece, disallowed_special=())) for piece in _pieces(text))

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Tokens of one chat message, framing included."""
        return _count_message(self, message, self.message_overhead)

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of the tool schemas' JSON plus per-tool framing."""
        return sum(self.count_text(stable_json(tool)) + TOOL_OVERHEAD_TOKENS for tool in tools)


# tiktoken encodes without the GIL but builds its list of token ids with it: for a 31 MB text, 1.5 s in
# which no other thread ran (the event loop included, while a worker counted). Pieces of this many
# characters hold it for milliseconds each.
_ENCODE_PIECE_CHARS = 200_000
_LAST_WORD_END = re.compile(r".*\S(?=\s)", re.DOTALL)


def _pieces(text: str) -> Iterator[str]:
    """``text`` in pieces of about ``_ENCODE_PIECE_CHARS``, each cut before a whitespace character that
    follows a non-whitespace one: tiktoken's pre-tokenizer never joins across such a point, so the pieces'
    counts add up to the whole text's (only a text with no such point nearby is cut anywhere)."""
    start, end = 0, len(text)
    while start < end:
        cut = start + _ENCODE_PIECE_CHARS
        if cut >= end:
            yield text[start:]
            return
        half = start + _ENCODE_PIECE_CHARS // 2
        found = _LAST_WORD_END.match(text, half, cut + 1)  # the last non-space before a space, in the back half
        if found is not None:
            cut = found.end()
        yield text[start:cut]
        start = cut


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

    Every entry is keyed by a 17-byte digest or a 64-character chain hash, never by the text: messages
    by :func:`~proxy.kernel.canonical.message_digest` (equal digests mean equal canonical messages, so a hit is
    never wrong; cosmetic variants at worst miss), history messages also by their chain hash
    (``count_message_at``: the name reconciliation gave them, so the unchanged prefix of a resent
    history costs a lookup per message, not a digest of its content; the hash string itself is the key,
    the very object the chain memo hands every turn), texts (sections, the system prompt) and tool
    lists by a digest of their text (``memo_digest``). Keys and values are small and of fixed size, which is why
    the byte bound ``max_bytes`` is kept as an entry count (``max_bytes //
    ENTRY_BYTES``), however large the messages (a process serving hundreds of sessions with 200 KB
    tool outputs must not keep those outputs alive through its cache keys). Only base counts are
    cached: a calibrated route scales them afterwards (``ScaledEstimator``). One instance should live
    as long as the estimates stay valid.

    Thread-safe: the compactor counts a large history on a worker thread while the event loop counts
    other sessions' requests with the same instance. Reads are single dict lookups; storing (with its
    eviction) holds a lock, and the counting itself runs outside it. ``hits`` and ``misses`` are
    statistics and may lose an increment under that concurrency.
    """

    # Measured with tracemalloc: a 17-byte key, its int and the dict slot come to about 140 bytes, a
    # chain hash key held by the cache alone to about 190 (tests/context/test_estimators.py); ints above
    # 256 are separate objects. Rounded up, so the bound stated above holds.
    ENTRY_BYTES = 200

    DEFAULT_MAX_BYTES = 20 * 1024 * 1024  # 100,000 entries: a 1,000-message history in 100 sessions

    def __init__(self, inner: TokenEstimator, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.inner = inner
        self.max_bytes = max_bytes
        self.max_entries = max(1, max_bytes // self.ENTRY_BYTES)
        self.hits = 0
        self.misses = 0
        self._cache: dict[bytes | str, int] = {}  # str: chain hashes
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
        cached = self._cache.get(chain_hash)  # only chain hashes are ever stored under a str key
        if cached is not None:
            self.hits += 1
            return cached
        count = self.count_message(message)
        if _is_chain_hash(chain_hash):
            self._store(chain_hash, count)
        return count

    def known_count_at(self, chain_hash: str) -> int | None:
        """The cached count of the history message named ``chain_hash``, or ``None`` (nothing is counted)."""
        return self.known_counts_at([chain_hash])[0]

    def known_counts_at(self, chain_hashes: Sequence[str]) -> list[int | None]:
        """``known_count_at`` of each of ``chain_hashes``, in one C-speed pass (the hash strings are the keys,
        and a resent history's are the very string objects of the last turn, their hashes computed once)."""
        counts: list[int | None] = list(map(self._cache.get, chain_hashes))
        self.hits += len(counts) - counts.count(None)
        return counts

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Cached by a digest of the tools' JSON with sorted keys."""
        return self.count_tools_by(self.tools_key(tools), tools)

    def tools_key(self, tools: Sequence[Mapping[str, Any]]) -> bytes:
        """The key ``count_tools`` caches ``tools``' count under."""
        return _TOOLS + _tools_digest(tools)

    def tools_key_after(self, prefix_key: bytes, rest: Sequence[Mapping[str, Any]]) -> bytes:
        """A key of the tools ``prefix_key`` names followed by ``rest``, made from ``prefix_key`` without
        digesting those tools again. Equal keys mean equal lists, as ``tools_key``'s do; the same list keyed
        both ways is merely cached twice."""
        return _TOOLS_AFTER + memo_digest(prefix_key + _tools_digest(rest))

    def count_tools_by(self, key: bytes, tools: Sequence[Mapping[str, Any]]) -> int:
        """``tools``' count, cached under ``key`` (``tools_key`` or ``tools_key_after`` of them)."""
        return self._cached(key, lambda: self.inner.count_tools(tools))

    def _cached(self, key: bytes, compute: Callable[[], int]) -> int:
        cached = self._cache.get(key)
        if cached is not None:
            self.hits += 1
            return cached
        self.misses += 1
        value = compute()
        self._store(key, value)
        return value

    def _store(self, key: bytes | str, value: int) -> None:
        with self._lock:
            if key not in self._cache and len(self._cache) >= self.max_entries:
                # Insertion-ordered dict: evicting the oldest entry keeps the cache bounded without an LRU.
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = value


# Key prefixes: message digests start with b"f" or b"c" (see message_digest), so the spaces never meet;
# chain hashes are str keys, never equal to a bytes key. Tool lists: b"T" their digest, b"A" a known list's
# key and the digest of what follows it (``tools_key_after``).
_TEXT, _TOOLS, _TOOLS_AFTER = b"t", b"T", b"A"


def _is_chain_hash(name: str) -> bool:
    """Whether ``name`` is a SHA-256 hex chain hash (``proxy/kernel/canonical.py``), the only str keys stored: a
    64-character string (113 bytes, usually the very object the chain memo holds) keeps an entry within
    ``ENTRY_BYTES``. Anything else is counted by content only."""
    return len(name) == 64 and _HEX.fullmatch(name) is not None


_HEX = re.compile(r"[0-9a-f]{64}")


def _digest(text: str) -> bytes:
    return memo_digest(text.encode("utf-8", "surrogatepass"))


def _tools_digest(tools: Sequence[Mapping[str, Any]]) -> bytes:
    """A digest of ``tools`` as JSON with sorted keys: orjson's, a tenth of the standard library's time (a
    turn's first count of its tools, which are decoded anew each turn, hashed their schemas with it),
    or, for what orjson refuses (a lone surrogate, a key that is not a string), ``stable_json``'s. The
    digest only keys this process's cache, so the two need not agree. orjson writes NaN as null, so a
    schema holding NaN shares its key with one holding null: the edge refuses non-finite numbers, so a
    request's tools hold none, and the proxy's own schemas hold none either."""
    try:
        text = orjson.dumps(list(tools), option=orjson.OPT_SORT_KEYS)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return _digest(stable_json(list(tools)))
    return memo_digest(text)
