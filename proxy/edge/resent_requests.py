"""Requests that resend a recent request's messages, recognized by their bytes: the resent messages are
neither decoded, digested nor validated again. Any body whose ``messages`` member is its conversation:
chat's, and the Messages API's (Claude Code's body opens with its model and messages).

Agents resend their whole history on every turn, so a turn's body is the previous body's bytes up to the
end of its last message, a comma, the new messages and the rest of the body. Decoding a 1,000-message
history (megabytes), checking what it decoded and digesting each message was the larger part of what the
proxy spent on a turn. A body that starts with a remembered request's bytes up to the end of its
``messages`` array's last element, then a comma (or the array's end), repeats exactly those messages: a
JSON value is its text, and the bytes before them (``{"model": ..., "messages": [``) are the same, so they
sit in the same place. Only the rest is decoded here, as two small documents: the new messages, and the
body with its ``messages`` array replaced by a random marker string, which must come back as the value
of ``messages`` (so the array is the one a decoder keeps, not shadowed by a later duplicate key). Both go
through :func:`~proxy.edge.request_body.decode_body`, the one place a client's JSON is decoded, with all its
checks; anything unusual (a lone surrogate, a malformed tail, an unexpected layout) falls back to
decoding the whole body there, which also names the problem of a bad one.

A request is remembered only after it passed validation (``remember``), with its messages as decoded
(kept here, never handed out: every turn gets its own copies of the containers, so whatever a turn does
to its messages cannot change what the next turn decodes), their exact digests, and its bytes up to
the end of the last message. At most ``max_bytes`` of requests, a request's body bytes counted three times
(its decoded messages hold its text again, with the dicts around it); least recently used first out.
Decodes run on two worker threads at once, hence the lock.

Finding where a request that repeats none lies in its body (the first turn of a session, or one whose
history was rewritten) costs two or three more decodes of it: half a millisecond on an agent's first
call, its 80 KB system prompt decoded again to be sure where its ``messages`` member starts. So such a
request is placed off the clock, once its answer is sent (``make_spares``, below), from its bytes alone:
its messages decoded again there are the ones kept. A session's next turn comes after that answer; one
that comes sooner is decoded whole, as it would be with no memo.

Copying a 1,000-message history's containers takes a millisecond or more; a turn should not wait for
it. ``make_spares``, called once a turn's answer is sent (while the agent runs its tools), copies the
messages of the requests remembered since, and the next turn that resends one takes its copy instead of
making one; a turn that comes before its spare is ready copies as before. Spares are outside the byte
bound, and never push a request out: a spare holds only containers (its strings are the request's), about
a fifth of its request's prefix bytes, so spares add at most a fifteenth to what the memo holds. Counted
in the bound, a spare was made only when the last eviction happened to leave room for it: once the memo
was full, a session got a spare on every turn or on none (bench part 2: a third of the 1,000-message
sessions copied their messages on every turn, 1.5 ms more each).
"""

from __future__ import annotations

import marshal
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeAlias

import orjson

from proxy.edge.request_body import decode_body
from proxy.kernel.errors import InvalidRequest

_WHITESPACE = b" \t\r\n"
_MESSAGES_KEY = b'"messages"'
_MARKER = secrets.token_hex(16)  # stands in for the messages array; no client can guess it
_MARKER_JSON = orjson.dumps(_MARKER)
_CHECK_BYTES = 64  # compared first: different sessions differ just before their prefix ends
_MIN_MESSAGES = 8  # shorter requests decode in microseconds: not worth remembering
# How orjson says it decoded a whole value and found more after it (pinned by the tests: the memo relies on it)
ORJSON_TRAILING_CONTENT = "unexpected content after document"


# Where a request's messages lie in its body: the body, its prefix's length, where the array starts, a
# copy of its messages, and which of them nest (``_nests``).
_Layout: TypeAlias = tuple[bytes, int, int, tuple[Any, ...], tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class _Request:
    raw: bytes  # the body
    length: int  # how much of it is its prefix: up to the end of its messages array's last element
    start: int  # where the array's ``[`` is
    messages: tuple[Any, ...]  # as decoded, never handed out
    digests: tuple[bytes, ...]
    nested: tuple[int, ...]  # the messages holding a dict or a list (``_fresh_messages``)
    check: bytes  # the ``_CHECK_BYTES`` before the prefix's end, compared first (``_candidates``)

    @property
    def size(self) -> int:
        """What it holds, in bytes: the body, and its messages' text twice again (decoded, with the
        dicts around it)."""
        return len(self.raw) + 2 * self.length


@dataclass
class DecodedBody:
    """A decoded body, and how many of its leading messages repeat a request validated before
    (``resent``), with their exact digests."""

    body: dict[str, Any]
    resent: int = 0
    resent_digests: tuple[bytes, ...] = ()
    _layout: _Layout | None = field(default=None, repr=False)  # a continuation's, for ``remember``
    _continues: int | None = field(default=None, repr=False)  # the remembered request it repeats
    _raw: bytes | None = field(default=None, repr=False)  # a request that repeats none: placed later


class ResentRequests:
    """A bounded, thread-safe memo of recent requests, by their bytes."""

    DEFAULT_MAX_BYTES = 48 * 1024 * 1024  # a 5,000-message history (13 MB of body) and a few smaller ones

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, max_requests: int = 256) -> None:
        self.max_bytes = max_bytes
        self.max_requests = max_requests
        self._requests: OrderedDict[int, _Request] = OrderedDict()  # oldest first
        self._bytes = 0
        self._next_key = 0
        self._spares: dict[int, list[Any]] = {}  # a ready copy of a request's messages, for its next turn
        self._wanted: list[int] = []  # the requests remembered since ``make_spares`` last ran
        self._unplaced: list[tuple[bytes, tuple[bytes, ...]]] = []  # first seen since then, with their digests
        self._unplaced_bytes = 0  # their bodies' bytes: within ``max_bytes`` too, if no answer is sent for long
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._requests)

    @property
    def ready_spares(self) -> int:
        """How many remembered requests have a copy of their messages ready for their next turn."""
        return len(self._spares)

    @property
    def wants_spares(self) -> bool:
        """Whether ``make_spares`` has anything to do."""
        return bool(self._wanted or self._unplaced)

    def decode(self, raw: bytes) -> DecodedBody:
        """``raw`` decoded as :func:`~proxy.edge.request_body.decode_body` decodes it (``InvalidRequest`` for a
        bad body), its resent messages taken from the request they repeat."""
        for key, known in self._candidates(raw):
            resent = _continued(raw, known, partial(self._copies, key, known))
            if resent is not None:
                resent._continues = key
                return resent
        return DecodedBody(decode_body(raw), _raw=raw)

    def remember(self, decoded: DecodedBody, digests: list[bytes]) -> None:
        """Remember a request whose messages all passed validation, with every message's exact digest: one
        that continues a remembered request now, one that repeats none once ``make_spares`` places it."""
        if decoded._layout is not None:
            self._keep(decoded._layout, digests, decoded._continues)
        elif decoded._raw is not None and len(digests) >= _MIN_MESSAGES and _worth_placing(decoded._raw, self):
            with self._lock:
                self._unplaced.append((decoded._raw, tuple(digests)))
                self._unplaced_bytes += len(decoded._raw)
                while self._unplaced_bytes > self.max_bytes or len(self._unplaced) > self.max_requests:
                    self._unplaced_bytes -= len(self._unplaced.pop(0)[0])  # the oldest first

    def _keep(self, layout: _Layout, digests: list[bytes], continues: int | None) -> None:
        raw, length, start, messages, nested = layout
        check = raw[max(0, length - _CHECK_BYTES) : length]
        known = _Request(raw, length, start, messages, tuple(digests), nested, check)
        if len(messages) != len(digests) or known.size > self.max_bytes:
            return
        with self._lock:
            if continues is not None:
                self._forget(continues)  # the session's next turn repeats this one, not that one
            self._requests[self._next_key] = known
            self._wanted = [*self._wanted[-self.max_requests :], self._next_key]
            self._next_key += 1
            self._bytes += known.size
            while self._bytes > self.max_bytes or len(self._requests) > self.max_requests:
                self._forget(next(iter(self._requests)))

    def make_spares(self) -> None:
        """Place the requests first seen since the last call, then copy the messages of each request
        remembered since, for its next turn to take (call it between turns: off the clock of any request).
        The remembered messages are never handed out, so they are copied outside the lock."""
        with self._lock:
            unplaced, self._unplaced, self._unplaced_bytes = self._unplaced, [], 0
        for raw, digests in unplaced:
            layout = _layout(raw)
            if layout is not None:
                self._keep(layout, list(digests), None)
        with self._lock:
            wanted = [(key, self._requests[key]) for key in self._wanted if key in self._requests]
            self._wanted = []
        for key, known in wanted:
            copies = _fresh_messages(known.messages, known.nested)
            with self._lock:
                if key in self._requests:  # still remembered: a later request may have pushed it out
                    self._spares[key] = copies  # a request is wanted once, so it has no spare yet

    def _copies(self, key: int, known: _Request) -> list[Any]:
        """Copies of ``known``'s messages for the turn that resends them: its spare, taken once, or new."""
        with self._lock:
            spare = self._spares.pop(key, None)
        return spare if spare is not None else _fresh_messages(known.messages, known.nested)

    def _candidates(self, raw: bytes) -> list[tuple[int, _Request]]:
        with self._lock:
            recent = list(reversed(self._requests.items()))
        size = len(raw)
        # compared in place (``startswith`` at an offset copies nothing): a full memo holds a hundred and more
        return [
            (key, known)
            for key, known in recent
            if size > known.length and raw.startswith(known.check, known.length - len(known.check))
        ]

    def _forget(self, key: int) -> None:
        known = self._requests.pop(key, None)
        if known is not None:
            self._bytes -= known.size
            self._spares.pop(key, None)


def _continued(raw: bytes, known: _Request, copies: Callable[[], list[Any]]) -> DecodedBody | None:
    """``raw`` decoded as ``known``'s messages (``copies`` of them: the turn's own) and some more, or
    ``None`` when it does not continue it."""
    if not raw.startswith(memoryview(known.raw)[: known.length]):  # compared in place: no copy of megabytes
        return None
    after = _skip_whitespace(raw, known.length)
    separator = raw[after : after + 1]
    if separator == b"]":
        new: list[Any] = []
        end = after
    elif separator == b",":
        tail = _new_messages(b"[" + raw[after + 1 :])
        if tail is None:
            return None
        new, length = tail
        end = after + length - 1  # the tail's "[" stands where the comma is
    else:
        return None
    rest = _rest(raw, known.start, end)
    if rest is None:
        return None
    mine = copies()
    rest["messages"] = [*mine, *new]
    kept = (*known.messages, *(fresh_copy(message) for message in new))
    nested = (*known.nested, *(len(mine) + k for k, message in enumerate(new) if _nests(message)))
    return DecodedBody(rest, len(mine), known.digests, (raw, _prefix_length(raw, end), known.start, kept, nested))


def _new_messages(tail: bytes) -> tuple[list[Any], int] | None:
    """The JSON array ``tail`` starts with, decoded, and its length in bytes; ``None`` for anything but
    a non-empty array of plain JSON (a lone surrogate, say: the whole body's decode settles those)."""
    end = _end_of_first_value(tail, tail.isascii())
    if end is None:
        return None
    length = tail.rfind(b"]", 0, end) + 1
    if length <= 0:
        return None
    try:
        decoded = decode_body(b'{"messages":' + tail[:length] + b"}")  # its checks, at the body's depth
    except InvalidRequest:
        return None
    messages = decoded["messages"]
    if not isinstance(messages, list) or not messages:
        return None
    return messages, length


def _rest(raw: bytes, start: int, end: int) -> dict[str, Any] | None:
    """The body with the messages array at ``raw[start : end + 1]`` replaced by the marker, decoded; ``None``
    unless it is an object whose ``messages`` is the marker (the array is the value a decoder keeps)."""
    try:
        rest = decode_body(raw[:start] + _MARKER_JSON + raw[end + 1 :])
    except InvalidRequest:
        return None
    return rest if rest.get("messages") == _MARKER else None


def _layout(raw: bytes) -> _Layout | None:
    """Where the messages array of the body ``raw`` lies in it (the length of its prefix, where its ``[``
    is), with its messages decoded from there (the memo's own: no one else holds them) and which of them
    nest; ``None`` when it is short or cannot be found for certain."""
    start = _array_start(raw)
    if start is None:
        return None
    after = _end_of_first_value(memoryview(raw)[start:], ascii_text=raw.isascii())
    if after is None:
        return None
    end = raw.rfind(b"]", start, start + after)
    if end < 0 or 2 * (end + 1 - start) < len(raw) or _rest(raw, start, end) is None:
        return None  # not found for certain, or not worth keeping (``_worth_placing``)
    try:  # decoded as the whole body was: the same bytes through the same checks
        messages = decode_body(b'{"messages":' + raw[start : end + 1] + b"}")["messages"]
    except InvalidRequest:
        return None
    if not isinstance(messages, list) or len(messages) < _MIN_MESSAGES:
        return None
    nested = tuple(k for k, message in enumerate(messages) if _nests(message))
    return raw, _prefix_length(raw, end), start, tuple(messages), nested


def _worth_placing(raw: bytes, memo: ResentRequests) -> bool:
    """Whether a body that repeats no remembered request may be worth remembering: within the bound, and
    its messages array perhaps half of it or more. A continuation is spared decoding its resent messages
    but decodes the rest of its body twice over (the new messages, then the body around them), so a body
    whose system prompt and tools outweigh its messages (the Messages API's ``system`` before its
    ``messages``, say: 110 of 143 KB on the agent shape) gains nothing and pays for placing; a history
    grown longer than what surrounds it is placed when its session sends it again. Only the position of the
    first ``"messages"`` is looked at here (past the middle: the array is shorter than what comes before
    it); ``_layout`` measures the array itself."""
    if len(raw) > memo.max_bytes:
        return False
    key = raw.find(_MESSAGES_KEY)
    return key >= 0 and 2 * key <= len(raw)


def _array_start(raw: bytes) -> int | None:
    """Where the top-level ``"messages"`` member's array starts in ``raw``, when it is found for certain:
    what comes before the key decodes as the opening of an object (``{``, or members and a comma)."""
    key = raw.find(_MESSAGES_KEY)
    while key >= 0:
        head = raw[:key].strip(_WHITESPACE)
        if head == b"{" or (head.endswith(b",") and _is_object(head[:-1] + b"}")):
            colon = _skip_whitespace(raw, key + len(_MESSAGES_KEY))
            start = _skip_whitespace(raw, colon + 1)
            return start if raw[colon : colon + 1] == b":" and raw[start : start + 1] == b"[" else None
        key = raw.find(_MESSAGES_KEY, key + 1)
    return None


def _is_object(text: bytes) -> bool:
    try:
        return isinstance(orjson.loads(text), dict)
    except orjson.JSONDecodeError:
        return False


def _skip_whitespace(raw: bytes, at: int) -> int:
    """The position of the first byte from ``at`` on that is not JSON whitespace (looked for in a window)."""
    window = raw[at : at + 256]
    return at + len(window) - len(window.lstrip(_WHITESPACE))


def _end_of_first_value(text: bytes | memoryview, ascii_text: bool) -> int | None:
    """Where the JSON value ``text`` starts with ends (the byte offset of what follows it, whitespace
    skipped), when more follows it; ``None`` for anything else (a value that is all of ``text``, or
    text orjson refuses before that value ends: a lone surrogate, bad UTF-8). ``ascii_text``: whether
    ``text`` is ASCII, where orjson's count of characters is one of bytes."""
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        if not exc.msg.startswith(ORJSON_TRAILING_CONTENT):  # refused inside the value: its end is unknown
            return None
        return exc.pos if ascii_text else len(exc.doc[: exc.pos].encode("utf-8"))
    return None


def _prefix_length(raw: bytes, end: int) -> int:
    """How much of ``raw`` is the array's prefix: up to its ``]`` at ``end``, whitespace before it trimmed."""
    while end > 0 and raw[end - 1] in _WHITESPACE:
        end -= 1
    return end


def _fresh_messages(messages: tuple[Any, ...], nested: tuple[int, ...]) -> list[Any]:
    """``fresh_copy`` of each of a remembered request's ``messages``, at C speed: a dict copy of each (nearly all
    hold only strings and numbers), then the ``nested`` ones (tool calls, content parts) copied whole
    through ``marshal``, which copies plain JSON values (their small strings with them) in one pass, and
    keeps the keys' order. Anything either refuses is copied by ``fresh_copy``."""
    try:
        out = list(map(dict.copy, messages))
    except TypeError:  # a message that is not a dict (validated requests hold none)
        return [fresh_copy(message) for message in messages]
    if nested:
        deep = [messages[k] for k in nested]
        try:
            copies = marshal.loads(marshal.dumps(deep))
        except ValueError:  # a value that is not plain JSON
            copies = [fresh_copy(message) for message in deep]
        for k, copy in zip(nested, copies, strict=True):
            out[k] = copy
    return out


def _nests(message: Any) -> bool:
    """Whether ``fresh_copy`` of ``message`` is more than a copy of one dict."""
    return type(message) is not dict or any(type(v) is dict or type(v) is list for v in message.values())


def fresh_copy(value: Any) -> Any:
    """A copy of ``value``'s dicts and lists (their strings and numbers, immutable, are shared); copied
    whole, then its nested containers replaced, which is half the time of building each anew. Anything
    else is returned as it is: a message that is not an object is refused by the checks after the decode
    (copying it here raised, a 500)."""
    if type(value) is not dict and type(value) is not list:
        return value
    copy = value.copy()
    if type(value) is dict:
        for key, item in value.items():
            if type(item) is dict or type(item) is list:
                copy[key] = fresh_copy(item)
    elif type(value) is list:
        for index, item in enumerate(value):
            if type(item) is dict or type(item) is list:
                copy[index] = fresh_copy(item)
    return copy
