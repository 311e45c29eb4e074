"""Which API a route's provider is spoken to in: Chat Completions, Responses, or Anthropic Messages.

A request reaches its provider natively when the client spoke the route's own API: the Messages ingress
to a ``messages`` route, the Responses ingress to a ``responses`` route. Then every field, header, block
and item of that API passes, and what the provider answers comes back as it is (``proxy/provider/native/``).
Every other pairing goes through the canonical Chat Completions call, which litellm adapts to the
provider; what it cannot carry is dropped and named in the trace.

The operator sets it per route (``api:`` beside ``litellm_params``); the default follows litellm's
provider: Anthropic speaks Messages, OpenAI's own API (no ``api_base``, or api.openai.com) speaks
Responses, and everything else, an ``openai/`` route to llama.cpp or vLLM included, speaks chat.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlparse

Api = Literal["chat", "responses", "messages"]
APIS: tuple[Api, ...] = ("chat", "responses", "messages")
_OPENAI_HOSTS = frozenset({"api.openai.com"})


def default_api(litellm_params: Mapping[str, Any]) -> tuple[Api, str]:
    """The API a route with these ``litellm_params`` speaks by default, and why (for the operator)."""
    provider = provider_of(litellm_params)
    if provider == "anthropic":
        return "messages", "an anthropic/ route speaks Anthropic's Messages API"
    if provider == "openai":
        base = litellm_params.get("api_base") or litellm_params.get("base_url")
        if not base:
            return "responses", "an openai/ route without api_base is OpenAI's own API, which speaks Responses"
        if urlparse(str(base)).hostname in _OPENAI_HOSTS:
            return "responses", "an openai/ route to api.openai.com speaks Responses"
        return "chat", "an openai/ route with its own api_base (llama.cpp, vLLM, ...) speaks Chat Completions"
    return "chat", f"litellm adapts Chat Completions to {provider or 'this provider'}"


def provider_of(litellm_params: Mapping[str, Any]) -> str:
    """litellm's provider of a route: ``custom_llm_provider``, else the model's prefix, else litellm's own
    guess for the bare names it knows (``claude-*``, ``gpt-*``, the o-series)."""
    explicit = litellm_params.get("custom_llm_provider")
    if isinstance(explicit, str) and explicit:
        return explicit
    model = str(litellm_params.get("model") or "")
    prefix, slash, _ = model.partition("/")
    if slash:
        return prefix
    if model.startswith("claude"):
        return "anthropic"
    if model.startswith(("gpt-", "o1", "o3", "o4", "chatgpt-", "codex-")):
        return "openai"
    return ""
