"""The Anthropic stand-in's prompt cache: what a request reads from it, writes to it, and is billed.

Kept simple, and deterministic, like Anthropic's in the parts tests look at:

- The prompt is its parts in Anthropic's cache order: each tool, each system block, then each block of
  each message (a string content is one text block) tagged with its role. A part's tokens are a quarter
  of the bytes of its canonical JSON, ``cache_control`` left out; a prefix's tokens are a quarter of the
  bytes of the parts it holds.
- A request with no ``cache_control`` neither reads nor writes. Otherwise it reads the longest prefix,
  ending at any part boundary up to its last breakpoint, that an earlier request wrote (Anthropic looks
  back 20 blocks from a breakpoint; here the whole way), and writes the prefix up to each breakpoint.
- Nothing under ``min_tokens`` (1,024 by default) is written or read. Entries never expire, and the cache
  is per model.
- Billing: ``cache_read_input_tokens`` is the prefix read, ``cache_creation_input_tokens`` what the last
  written breakpoint adds beyond it, ``input_tokens`` the rest.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from typing import Any

from proxy.provider.scripted_anthropic_rules import blocks_of


@dataclass(frozen=True)
class CacheBill:
    """How a request's input tokens are billed: read from the cache, written to it, and the rest."""

    input_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    ttl: str  # "5m" or "1h": the lifetime asked for at the last breakpoint written


def _without_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_cache_control(item) for key, item in value.items() if key != "cache_control"}
    if isinstance(value, list):
        return [_without_cache_control(item) for item in value]
    return value


def _parts(body: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The prompt's parts in cache order, each as (the part as sent, what keys and counts it)."""
    parts: list[tuple[dict[str, Any], dict[str, Any]]] = [(tool, {"tool": tool}) for tool in body.get("tools") or []]
    system = body.get("system")
    if isinstance(system, str):
        system = [{"type": "text", "text": system}]
    parts += [(block, {"system": block}) for block in system or []]
    for message in body.get("messages") or []:
        parts += [(block, {"role": message.get("role"), "block": block}) for block in blocks_of(message)]
    return parts


def _cache_control(part: dict[str, Any]) -> Any:
    """The part's ``cache_control``; a tool result's inner blocks can carry one for it."""
    if part.get("cache_control") is not None:
        return part["cache_control"]
    inner = part.get("content") if part.get("type") == "tool_result" else None
    controls = [block.get("cache_control") for block in inner or [] if isinstance(block, dict)]
    return next((control for control in controls if control is not None), None)


def count_input_tokens(body: dict[str, Any]) -> int:
    """The request's input tokens as the stand-in counts them: a quarter of its prompt parts' JSON bytes."""
    return max(1, sum(len(_canonical(_without_cache_control(keyed))) for _, keyed in _parts(body)) // 4)


def _canonical(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()


class PromptCache:
    """The prefixes written so far, per model, with their token counts."""

    def __init__(self, min_tokens: int = 1024) -> None:
        self.min_tokens = min_tokens
        self._written: dict[str, int] = {}
        self._lock = threading.Lock()

    def bill(self, body: dict[str, Any], *, write: bool = True) -> CacheBill:
        """How the request is billed against the cache, writing its breakpoints' prefixes when ``write``."""
        digest = hashlib.sha256(_canonical(body.get("model")))
        size = 0
        boundaries: list[tuple[str, int]] = []  # after each part: the prefix's key and its tokens
        breakpoints: list[tuple[int, str]] = []  # the parts with cache_control: index and ttl
        for index, (sent, keyed) in enumerate(_parts(body)):
            encoded = _canonical(_without_cache_control(keyed))
            digest.update(len(encoded).to_bytes(8, "big") + encoded)
            size += len(encoded)
            boundaries.append((digest.copy().hexdigest(), size // 4))
            control = _cache_control(sent) if isinstance(sent, dict) else None
            if control is not None:
                breakpoints.append((index, str(control.get("ttl", "5m")) if isinstance(control, dict) else "5m"))
        total = max(1, size // 4)
        if not breakpoints:
            return CacheBill(total, 0, 0, "5m")
        last = breakpoints[-1][0]
        eligible = [(index, ttl) for index, ttl in breakpoints if boundaries[index][1] >= self.min_tokens]
        with self._lock:
            hits = [tokens for key, tokens in boundaries[: last + 1] if key in self._written]
            read = max((tokens for tokens in hits if tokens >= self.min_tokens), default=0)
            if write:
                for index, _ in eligible:
                    key, tokens = boundaries[index]
                    self._written[key] = tokens
        written, ttl = (boundaries[eligible[-1][0]][1], eligible[-1][1]) if eligible else (0, "5m")
        creation = max(0, written - read)
        return CacheBill(total - read - creation, read, creation, ttl)
