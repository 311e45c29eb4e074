"""The native-passage port: how a request in the client's own API crosses the provider boundary.

When the client speaks its route's own API (``ModelRoute.api``: the Messages ingress on a ``messages``
route, the Responses ingress on a ``responses`` route), the ingress hands the turn service a
``NativeRequest``: the API, the headers of that API to forward, and a codec, implemented by the ingress
(which knows its wire format), that renders the provider request from the assembled chat messages and
reads the provider's answer back into the chat form the turn service works with. The provider receives
the native body (``ProviderBackend.complete_native``), and the client gets the provider's native answer
and events as they came: thinking blocks with their signatures, encrypted reasoning items, server-tool
blocks, citations, stop reasons and usage details included.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.kernel.route_api import Api
from proxy.runtime.rounds import RoundRelay


class NativeCodec(Protocol):
    """A wire format's side of native passage (``ingress/messages/native.py``, ``ingress/responses/native.py``)."""

    def body(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        *,
        stream: bool,
        breakpoints: Collection[int] = (),
    ) -> dict[str, Any]:
        """The provider request for these chat ``messages`` and ``tools`` (the assembled ones, or in legacy and
        shadow mode the client's own), rendered natively: what kept its native parts is sent as it came.
        ``breakpoints``: the messages after which the prompt stays stable (``Candidate.cache_breakpoints``),
        where an API with explicit prompt-cache marks puts the proxy's."""

    def chat_view(self, response: Mapping[str, Any]) -> dict[str, Any]:
        """The provider's native answer as a chat completion: the assistant message (with its native parts,
        ``proxy/kernel/native.py``) and the usage in chat terms (``prompt_tokens`` counting cache reads)."""

    def response_of(self, events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """A stream's events added up to the answer they make."""

    def events_of(self, response: Mapping[str, Any]) -> list[dict[str, Any]]:
        """An answer as the events of a stream (what a stream's relay writes of its own)."""

    def without_tools(self, response: Mapping[str, Any], names: frozenset[str]) -> dict[str, Any]:
        """The answer without its calls of the tools ``names`` (proxy-owned tools past the round limit)."""

    def round_relay(self, proxy_tools: frozenset[str]) -> RoundRelay:
        """The relay of a stream's rounds in this API's events (``proxy/runtime/rounds.py``)."""


@dataclass(frozen=True)
class NativeRequest:
    """A request the provider is sent in the client's own API."""

    api: Api
    codec: NativeCodec
    headers: Mapping[str, str] = field(default_factory=dict)  # the API's own headers (anthropic-version, -beta)
