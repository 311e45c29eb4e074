"""``FunctionBackend(handler)``: a ``ProviderBackend`` that answers with a function, like httpx's
``MockTransport(handler)``, and records every call in ``history``.

The handler takes the call's ``llm_input`` and returns a completion (a dict, or just the assistant
message via ``completion``), or raises a ``ProxyError`` as the real backend does after translating a
provider error. A stream call gets the same answer as chunks (``chunks.synthesize``), fetched
lazily so a test can drop it half-way; ``FunctionBackend.stream_closed`` says whether the relay closed it.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from proxy.kernel.errors import ProviderError
from proxy.kernel.route_api import Api
from proxy.provider.chunks import synthesize

Handler = Callable[[dict[str, Any]], dict[str, Any]]
# A native call: (api, body) -> the answer, or for a stream the list of its events.
NativeHandler = Callable[[str, dict[str, Any]], dict[str, Any] | list[dict[str, Any]]]


def completion(message: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """A whole chat completion carrying ``message``."""
    reason = finish_reason or ("tool_calls" if message.get("tool_calls") else "stop")
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": reason}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def tool_call(call_id: str, name: str, arguments: str = "{}") -> dict[str, Any]:
    """One assistant tool call."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class FunctionBackend:
    """Answers every model call with ``handler(llm_input)``; ``history`` holds each call's input. A native
    call (``complete_native``) is answered by ``native(api, body)``: the answer, or for a stream its events."""

    def __init__(self, handler: Handler, native: NativeHandler | None = None) -> None:
        self.handler = handler
        self.native = native
        self.history: list[dict[str, Any]] = []
        self.streams_opened = 0
        self.streams_closed = 0

    def provider_arguments(self, llm_input: dict[str, Any]) -> dict[str, Any]:
        """What a call is made with: this fake adds nothing."""
        return dict(llm_input)

    async def complete(self, llm_input: dict[str, Any]) -> dict[str, Any]:
        """The handler's completion."""
        self.history.append(copy.deepcopy(llm_input))
        return self.handler(llm_input)

    async def stream(self, llm_input: dict[str, Any], *, usage_to_caller: bool = True) -> AsyncIterator[dict[str, Any]]:
        """The handler's completion as chunks (the handler runs now, as the first chunk is fetched)."""
        self.history.append(copy.deepcopy(llm_input))
        answer = self.handler(llm_input)
        chunks = synthesize(
            [{"id": answer["id"], "object": "chat.completion.chunk", "created": 0, "model": "fake"}],
            answer["choices"][0]["message"],
        )
        self.streams_opened += 1
        return self._relay(chunks)

    async def complete_native(
        self, api: Api, body: dict[str, Any], headers: Mapping[str, str], route: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The native handler's answer."""
        self.history.append({"native_api": api, **copy.deepcopy(body)})
        answer = self._native()(api, body)
        if not isinstance(answer, dict):
            raise TypeError("a non-streamed native call needs an answer, not events")
        return answer

    async def stream_native(
        self, api: Api, body: dict[str, Any], headers: Mapping[str, str], route: Mapping[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """The native handler's events."""
        self.history.append({"native_api": api, **copy.deepcopy(body)})
        events = self._native()(api, body)
        if not isinstance(events, list):
            raise TypeError("a streamed native call needs events, not an answer")
        self.streams_opened += 1
        return self._relay(events)

    def _native(self) -> NativeHandler:
        if self.native is None:
            raise ProviderError("This FunctionBackend answers no native call (no native handler).", status=501)
        return self.native

    async def _relay(self, chunks: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        try:
            for chunk in chunks:
                yield chunk
        finally:
            self.streams_closed += 1
