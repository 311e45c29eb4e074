"""The provider port: what the runtime calls a model through, whichever backend serves it.

``LiteLLMBackend`` (``litellm_backend.py``) is the product's; ``FunctionBackend`` (``function.py``)
answers with a function (tests), ``RecordingBackend`` (``recording.py``) wraps another to record it,
and the replay command has its own (``proxy/replay/replay.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from proxy.kernel.route_api import Api


class ProviderBackend(Protocol):
    """Calls the model. ``llm_input`` is the turn service's keyword arguments for ``litellm.acompletion``; a
    backend may add its own (``provider_arguments`` says which, so the trace can show them)."""

    def provider_arguments(self, llm_input: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments a call with ``llm_input`` is made with: ``llm_input`` plus what this
        backend adds. Must not change ``llm_input``."""

    async def complete(self, llm_input: dict[str, Any]) -> dict[str, Any]:
        """A whole chat completion as an OpenAI response dict."""

    async def stream(self, llm_input: dict[str, Any], *, usage_to_caller: bool = True) -> AsyncIterator[dict[str, Any]]:
        """Chat completion chunks as OpenAI chunk dicts; the first one is fetched before returning.
        ``usage_to_caller=False``: the usage ``llm_input`` asks for is the proxy's own and reaches no client,
        so its chunk may carry the provider's own figures rather than litellm's (``LiteLLMBackend.stream``)."""

    async def complete_native(
        self, api: Api, body: dict[str, Any], headers: Mapping[str, str], route: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The provider's answer to a request in its own API (native passage), as the provider sent it.
        ``route`` is the route's ``litellm_params`` (where to connect, with which key)."""

    async def stream_native(
        self, api: Api, body: dict[str, Any], headers: Mapping[str, str], route: Mapping[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """The provider's stream of events for a native request, as it sent them; the first is fetched
        before returning."""
