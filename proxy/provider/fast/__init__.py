"""The provider fast path: litellm's transformation layer over one pooled ``httpx.AsyncClient``.

``litellm.acompletion`` spends most of a small call's CPU on bookkeeping the proxy never reads (cost
calculation, its logging object, a hop into its executor, building an SDK client per call). For a route
whose adaptation is a pure request/response transformation this package calls litellm's own pieces
directly: the same message/tool validation and parameter mapping ``completion()`` runs (``base``), the
provider config's request transformation, the answer converted as litellm's handler converts it, and
failures raised as that handler raises them and mapped by litellm's ``exception_type``, so
``provider_errors`` sees the same exception classes. Everything litellm-internal the fast path relies on
is named in ``surface.LITELLM_SURFACE`` (a unit test imports each one, so an upgrade that moves one fails
loudly) and is used only here.

The rule (each adapter's ``accepted``): a call (streamed or not: every adapter ``streams``) with an
``api_base`` and an ``api_key``, only the route's keys and parameters, plain text or tool messages and
plain function tools, a model litellm does not bridge to the Responses API, no litellm ``proxy_auth``;
and per provider:

- ``openai/`` (``openai.py``): no class-level ``litellm.OpenAIConfig`` defaults; a stream of a model
  litellm would not fake-stream.
- ``azure/<deployment>`` (``azure.py``): an ``api_version`` that is a dated one (not ``v1``/``latest``/
  ``preview``), a deployment litellm serves with its plain ``AzureOpenAIConfig`` (not o-series or
  GPT-5), an ``api_base`` that is a resource endpoint (not a deployment URL or Cloudflare's gateway), no
  Entra ID credentials in the environment, no class-level ``AzureOpenAIConfig`` defaults or
  ``litellm.headers``.
- ``anthropic/`` (``anthropic.py``): the parameters Anthropic maps without dropping any (sampling,
  ``stop``, token limits, ``user``, tools), the ``/v1/messages`` suffix not disabled.

Anything else (another provider, an image part, a route option such as ``extra_headers``) goes through
``acompletion``. Streams take the fast path on every route, as each route's litellm handler streams
(``stream`` of each adapter; ``streaming.py``: litellm's own ``CustomStreamWrapper`` over the pooled
connection). ``openai/`` and ``azure/`` read the SSE with the openai SDK's ``AsyncStream``; ``openai/``
adds the stream options ``get_stream_options`` adds, and ``azure/`` sends the mapped ``stream_options``
as they are. ``anthropic/`` reads it with litellm's ``ModelResponseIterator``, and its body is the
handler's ``json.dumps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.provider.fast.anthropic import AnthropicAdapter
from proxy.provider.fast.azure import AzureAdapter
from proxy.provider.fast.base import Adapter
from proxy.provider.fast.messages import MessageScan
from proxy.provider.fast.openai import OpenAIAdapter
from proxy.provider.fast.surface import LITELLM_SURFACE
from proxy.provider.pool import PooledClient, litellm_client

__all__ = ["LITELLM_SURFACE", "FastCall", "FastPath"]


@dataclass(frozen=True)
class FastCall:
    """A call the fast path took: the provider adapter, its arguments, and what the adapter's check made of
    its messages (the check and the message steps are one pass over a history of thousands)."""

    adapter: Adapter
    llm_input: dict[str, Any]
    scan: MessageScan


class FastPath:
    """Serves the calls some provider adapter accepts, over one pool of provider connections."""

    def __init__(self, litellm: Any, parts: dict[str, Any]) -> None:
        """``parts``: ``surface.load()``'s answer (the backend loads it once for every path)."""
        adapters: list[Adapter] = [
            OpenAIAdapter(litellm, parts),
            AzureAdapter(litellm, parts),
            AnthropicAdapter(litellm, parts),
        ]
        self._adapters = {f"{adapter.provider}/": adapter for adapter in adapters}
        self._parts = parts
        self._client: PooledClient | None = None  # made on first use: a backend built only to read
        # the model map (start-up checks) opens no pool

    async def aclose(self) -> None:
        """Close the pooled connections."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def accepts(self, llm_input: dict[str, Any]) -> bool:
        """Whether the fast path sends exactly what acompletion would (the documented rule)."""
        return self.accepted(llm_input) is not None

    def accepted(self, llm_input: dict[str, Any]) -> FastCall | None:
        """The call, for ``complete``, when the fast path sends exactly what acompletion would; else ``None``."""
        adapter = self._adapter(llm_input)
        scan = adapter.accepted(llm_input) if adapter is not None else None
        return None if adapter is None or scan is None else FastCall(adapter, llm_input, scan)

    async def complete(self, call: FastCall, timeout: float) -> Any:
        """One provider call that ``accepted`` took; returns litellm's ``ModelResponse`` or raises a litellm
        exception."""
        # litellm resolves a route's timeout to a float (and says so in its errors)
        return await call.adapter.complete(self._pool(), call.llm_input, float(timeout), call.scan)

    async def stream(self, call: FastCall, timeout: float, *, usage_to_caller: bool = True) -> Any:
        """A streamed call that ``accepted`` took: the async iterator of litellm chunks ``acompletion`` returns
        for it, or a litellm exception (``streaming.py``). ``usage_to_caller``: see ``Adapter.stream``."""
        return await call.adapter.stream(
            self._pool(), call.llm_input, float(timeout), call.scan, usage_to_caller=usage_to_caller
        )

    def _pool(self) -> PooledClient:
        if self._client is None:
            self._client = litellm_client(self._parts)  # litellm's own transport (``provider/pool.py``)
        return self._client

    def _adapter(self, llm_input: dict[str, Any]) -> Adapter | None:
        model = llm_input.get("model")
        prefix = model.split("/", 1)[0] + "/" if isinstance(model, str) else ""
        return self._adapters.get(prefix)
