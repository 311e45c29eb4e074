"""The provider-native form a canonical message or tool keeps beside its chat form (native passage).

The assembly works on Chat Completions messages. A request that reaches its provider in the client's own
API (Anthropic Messages, OpenAI Responses: ``proxy/kernel/route_api.py``) carries what chat cannot hold
(signed thinking blocks, encrypted reasoning items, server-tool blocks, citations, cache marks) in a
sidecar under the key ``native``: the API it belongs to, the native parts the chat message was made
from (content blocks or input items), and two digests of the chat message as it was made (its canonical
hash, and its exact digest, the cheap check ``native_parts`` makes first). When the provider
request is rendered back into the native API (``proxy/provider/native/``), a message whose chat form is
unchanged is sent as its native parts, byte for byte; one the assembly changed (a tool result become a
preview) is rendered from its chat form. The sidecar is stored with the message but is not part of its
identity (``canonical.py`` hashes the chat fields only), so where a client puts its cache marks does not
make a message another message.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.kernel.canonical import exact_digest, message_hash, stable_json
from proxy.kernel.route_api import Api

NATIVE = "native"


def with_native(item: dict[str, Any], api: Api, parts: Sequence[Any]) -> dict[str, Any]:
    """``item`` (a chat message or tool) with its native ``parts`` attached, digesting its chat form now (its
    canonical digest remembered by its exact one: a resent history is canonicalized once, ``_CANONICAL``)."""
    chat = without_native(item)
    exact = _exact(chat)
    item[NATIVE] = {"api": api, "parts": list(parts), "digest": _CANONICAL.digest(exact, chat), "exact": exact}
    return item


def native_parts(item: Mapping[str, Any], api: Api) -> list[Any] | None:
    """The native parts ``item`` was made from, when they are ``api``'s and its chat form is unchanged since;
    ``None`` otherwise (render it from its chat form).

    Every message of a native request is checked on every call, so a long session's history is: the chat
    form as it is byte for byte (``exact``: one orjson encoding and one SHA-256, in C) is the common case
    and is checked first; only a message whose bytes changed is canonicalized and hashed (the digest's
    meaning: a cosmetic change, ``content: null`` for absent, is no change), as is one stored without the
    exact digest. A 240-message Claude Code history took 6 to 8 ms of canonical hashing per call."""
    native = item.get(NATIVE)
    if not isinstance(native, Mapping) or native.get("api") != api or not isinstance(native.get("parts"), list):
        return None
    chat = without_native(item)
    exact = _exact(chat)
    unchanged = native.get("exact") == exact or native.get("digest") == _CANONICAL.digest(exact, chat)
    return list(native["parts"]) if unchanged else None


def without_native(item: Mapping[str, Any]) -> dict[str, Any]:
    """``item`` without its sidecar: what a chat provider may be sent."""
    return {key: value for key, value in item.items() if key != NATIVE}


def _digest(chat: Mapping[str, Any]) -> str:
    """The chat form's digest: a message's canonical hash, a tool's stable JSON."""
    if "role" in chat:
        return message_hash(chat)
    return hashlib.sha256(stable_json(chat).encode("utf-8", "surrogatepass")).hexdigest()


class _CanonicalDigests:
    """The canonical digests of chat forms made recently, by their exact digests (a pure function's results:
    shared by every request of the process, whichever session). A native request's every message gets a
    sidecar on every call: a Responses history (Codex resends its whole input) was canonicalized anew each
    time. At most ``MAX_ENTRIES``, least recently used first out; two worker threads may ask at once."""

    MAX_ENTRIES = 20_000  # two hex strings each: about 5 MB

    def __init__(self) -> None:
        self._digests: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def digest(self, exact: str, chat: Mapping[str, Any]) -> str:
        """``_digest(chat)``, whose exact digest is ``exact``."""
        with self._lock:
            known = self._digests.get(exact)
            if known is not None:
                self._digests.move_to_end(exact)
                return known
        made = _digest(chat)
        with self._lock:
            self._digests[exact] = made
            if len(self._digests) > self.MAX_ENTRIES:
                self._digests.popitem(last=False)
        return made


_CANONICAL = _CanonicalDigests()


def _exact(chat: Mapping[str, Any]) -> str:
    """The chat form's exact digest, as stored with the sidecar: equal means the very same chat form."""
    return exact_digest(chat).hex()
