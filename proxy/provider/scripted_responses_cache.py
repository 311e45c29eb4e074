"""The Responses stand-in's automatic prompt cache, simple and deterministic, shaped like OpenAI's.

- The prompt is, in order, the instructions, the tools, then every input item (those
  ``previous_response_id`` brings in first), each as one line of canonical JSON; its tokens are a
  quarter of those bytes.
- Every request, stored or not, writes its prefixes of 1,024 tokens and more, in 128-token steps, under
  its model and ``prompt_cache_key`` (absent is a key of its own); nothing shorter is cached.
- ``cached_tokens`` is the longest such prefix an earlier request under the same key wrote. Entries never
  expire.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

MIN_TOKENS = 1024
STEP_TOKENS = 128
BYTES_PER_TOKEN = 4


def prompt_bytes(body: dict[str, Any], items: list[dict[str, Any]]) -> bytes:
    """The prompt as the cache and the token count see it: one canonical JSON line per part."""
    parts: list[Any] = []
    if body.get("instructions"):
        parts.append({"instructions": body["instructions"]})
    if body.get("tools"):
        parts.append({"tools": body["tools"]})
    parts += items
    return b"".join(
        json.dumps(part, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode() + b"\n" for part in parts
    )


class AutomaticCache:
    """The prefix digests written so far, per (model, prompt_cache_key)."""

    def __init__(self) -> None:
        self._written: set[tuple[str, str | None, int, str]] = set()
        self._lock = threading.Lock()

    def cached_tokens(self, model: str, key: str | None, prompt: bytes) -> int:
        """The tokens of ``prompt`` read from the cache; then its own prefixes are written."""
        tokens = len(prompt) // BYTES_PER_TOKEN
        digest = hashlib.sha256()
        done = 0
        steps: list[tuple[int, str]] = []
        for size in range(MIN_TOKENS, tokens + 1, STEP_TOKENS):
            end = size * BYTES_PER_TOKEN
            digest.update(prompt[done:end])  # one running digest: every prefix is hashed in one pass
            done = end
            steps.append((size, digest.copy().hexdigest()))
        with self._lock:
            hit = max((size for size, prefix in steps if (model, key, size, prefix) in self._written), default=0)
            self._written.update((model, key, size, prefix) for size, prefix in steps)
        return hit
