"""Canonical form and content hashes of chat messages.

The store names every prefix of a conversation by a chain hash ``h_i = H(h_{i-1}, message_i)``.
Clients resend their whole history each turn, and the same message often comes back with cosmetic
differences (``"refusal": null``, ``"annotations": []``, ``content: null`` vs absent on a tool-call
message). Hashing only the fields that change what the model sees keeps such a message the same
message; everything the client sent is still stored as it came.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

# The fields of a chat message that change what a model sees. Anything else (refusal, annotations,
# audio, provider-specific extras, a native sidecar) is kept in storage but not hashed.
_SEMANTIC_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id", "function_call")
# A prompt-cache mark says where the client wants a cache breakpoint, not what the model sees: clients
# move it to the newest message every turn, and the message it left must stay the same message.
CACHE_MARK = "cache_control"
_TOOL_CALL_FIELDS = ("id", "type", "function")

GENESIS = ""


def memo_digest(data: bytes) -> bytes:
    """16 bytes naming ``data`` in one process's memos (token counts, remembered tool schemas; never
    stored). SHA-256, truncated: this machine kind computes it in hardware (the CPU's SHA extensions),
    59 µs for an agent's 80 KB system prompt against BLAKE2b's 124 µs, and an agent's turn digests that
    prompt, its tools and its new messages several times."""
    return hashlib.sha256(data).digest()[:16]


@dataclass(slots=True)
class HistoryEntry:
    """One message of a session's history: the store's, the assembler's and the compactor's record of it.

    ``chain_hash`` names the history up to and including it; ``tool_output_ref`` is the reference
    ``read_tool_output`` takes for a stored tool body; ``position`` is its index in its branch as the
    store keeps it (``None`` for a proxy-owned step, which is kept beside the branch, not in it).
    Treat it as immutable; it is not frozen because every turn makes one per history message, and a
    frozen dataclass takes five times as long to make.
    """

    message: dict[str, Any]
    chain_hash: str
    tool_output_ref: str | None = None
    position: int | None = None


def canonical_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """The semantic part of ``message``: fixed fields, no nulls, no empty tool-call lists."""
    canon: dict[str, Any] = {}
    for key in _SEMANTIC_FIELDS:
        value = message.get(key)
        if value is None or value == []:
            continue
        if key == "tool_calls":
            value = [_canonical_tool_call(call) for call in value]
        elif key == "content" and isinstance(value, list):
            value = [_unmarked(part) for part in value]
            if len(value) == 1 and _is_plain_text(value[0]):
                value = value[0]["text"]  # one text part is the text: clients mark a message by turning it into one
        canon[key] = value
    if canon.get("content") == "" and "tool_calls" in canon:
        del canon["content"]
    return canon


def _is_plain_text(part: Any) -> bool:
    return isinstance(part, Mapping) and part.keys() == {"type", "text"} and part["type"] == "text"


def _unmarked(part: Any) -> Any:
    """A content part without its cache mark."""
    if isinstance(part, Mapping) and CACHE_MARK in part:
        return {key: value for key, value in part.items() if key != CACHE_MARK}
    return part


def _canonical_tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: call[k] for k in _TOOL_CALL_FIELDS if call.get(k) is not None}
    function = out.get("function")
    if isinstance(function, Mapping):
        out["function"] = {k: function[k] for k in ("name", "arguments") if function.get(k) is not None}
    return out


def stable_json(value: Any) -> str:
    """Deterministic JSON text: sorted keys, no whitespace, Unicode kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def message_hash(message: Mapping[str, Any]) -> str:
    """Hex SHA-256 of the canonical form of one message."""
    return hashlib.sha256(_canonical_bytes(message)).hexdigest()


def message_digest(message: Mapping[str, Any]) -> bytes:
    """A 17-byte digest of ``message``'s semantic fields: equal digests mean equal canonical forms.

    Cheaper than :func:`message_hash`: the fields are hashed as sent (strings as their bytes, anything
    else as its stable JSON), without building and serializing the canonical form, so cosmetic variants
    (``content: null`` against absent) may get different digests; nothing may treat different digests as
    different messages. A malformed tool-call list falls back to the canonical hash. Caches key by this
    instead of by the message text, so a key costs the same few bytes whatever the message's size.
    """
    try:
        return _FIELDS + _fields_digest(message)
    except (KeyError, TypeError, AttributeError):
        return _CANONICAL + memo_digest(_canonical_bytes(message))


_FIELDS, _CANONICAL = b"f", b"c"  # the two digest spaces never collide with each other


def exact_digest(message: Any) -> bytes:
    """A 17-byte digest of ``message`` as sent, every field and key order included: equal digests mean
    equal messages. About four times cheaper than :func:`message_digest` (one orjson encoding and one
    SHA-256, both in C), for telling whether a resent message is the one seen before. Any value digests,
    message or not (the edge digests what it has not validated yet): what orjson refuses (a lone
    surrogate, an integer beyond 64 bits, a non-string key) is digested by its ``repr``, in a space of
    its own, which for JSON data is as faithful (and tells ``{1: 0}`` from ``{"1": 0}``)."""
    try:
        return _EXACT + hashlib.sha256(orjson.dumps(message)).digest()[:16]
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return _EXACT_REPR + hashlib.sha256(repr(message).encode("utf-8", "surrogatepass")).digest()[:16]


_EXACT, _EXACT_REPR = b"j", b"r"  # never equal to each other or to message_digest's b"f" and b"c"


def _fields_digest(message: Mapping[str, Any]) -> bytes:
    fields = [message.get(key) for key in ("role", "content", "name", "tool_call_id", "function_call")]
    for call in message.get("tool_calls") or ():
        function = call["function"]
        fields += (call["id"], call.get("type"), function.get("name"), function.get("arguments"))
    digest = hashlib.sha256()  # as memo_digest, fed field by field
    for value in fields:
        if value is None:
            digest.update(b"\x00")
            continue
        # Strings (nearly every field) as their bytes; content parts or object arguments as stable JSON,
        # which is how the canonical form serializes them. Marked and length-prefixed, so that no two
        # different field sequences feed the same bytes.
        kind, data = (b"\x01", value) if isinstance(value, str) else (b"\x02", stable_json(value))
        encoded = data.encode("utf-8", "surrogatepass")
        digest.update(kind + len(encoded).to_bytes(8, "little"))
        digest.update(encoded)
    return digest.digest()[:16]


def _canonical_bytes(message: Mapping[str, Any]) -> bytes:
    # surrogatepass: a client may send a lone surrogate ("\\ud800" in JSON); it must hash, not crash.
    return stable_json(canonical_message(message)).encode("utf-8", "surrogatepass")


def chain_hash(previous: str, message: Mapping[str, Any]) -> str:
    """The chain hash of a prefix ending in ``message`` whose previous prefix hashes to ``previous``."""
    return chain_hash_of(previous, message_hash(message))


def chain_hash_of(previous: str, hashed: str) -> str:
    """``chain_hash`` of a message whose ``message_hash`` is ``hashed`` (a caller that remembers it)."""
    return hashlib.sha256(f"{previous}\n{hashed}".encode()).hexdigest()


def chain_hashes(messages: Iterable[Mapping[str, Any]], start: str = GENESIS) -> list[str]:
    """Chain hashes of every prefix of ``messages``, in order."""
    hashes: list[str] = []
    current = start
    for message in messages:
        current = chain_hash(current, message)
        hashes.append(current)
    return hashes


def content_text(content: Any) -> str:
    """The text of a message ``content``: a string, or the text parts of a content-part array joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [part.get("text", "") for part in content if isinstance(part, Mapping) and part.get("type") == "text"]
        return "\n".join(p for p in parts if isinstance(p, str))
    return str(content)
