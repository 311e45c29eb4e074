"""The session's ``prompt_cache_key``: OpenAI routes a session's calls to the same prompt cache.

OpenAI caches prompt prefixes automatically, per machine; ``prompt_cache_key`` tells it which requests share
prefixes, so that they land where the prefix is cached. A client that sends none (most, the Agents SDK and
chat SDKs among them) leaves OpenAI to guess from the first few hundred tokens, which every session of one
agent shares: its calls spread across machines and miss the cache. In dynamic mode the proxy sends its own
calls with a key derived from the session (one key per context id, its branches included: they share their
head), on routes that speak OpenAI's Responses API (OpenAI's own API by default, or a provider the operator
declared with ``api: responses``), whose requests, chat and Responses alike, know the field. A key the
client sent is kept as it is; shadow and legacy send the client's request unchanged. The key is a hash: the
session id a client chose does not reach the provider.
"""

from __future__ import annotations

import hashlib
from typing import Any

from proxy.kernel.config import ModelRoute

FIELD = "prompt_cache_key"


def session_cache_key(context_id: str) -> str:
    """The key of a session's calls: stable for its context id, and not the id itself."""
    return "ctx-" + hashlib.sha256(f"context-proxy prompt cache\n{context_id}".encode()).hexdigest()[:32]


def with_session_cache_key(body: dict[str, Any], route: ModelRoute, context_id: str) -> dict[str, Any]:
    """``body`` with the session's key where ``route`` speaks Responses and the client sent none."""
    if route.api != "responses" or body.get(FIELD):
        return body
    return {**body, FIELD: session_cache_key(context_id)}
