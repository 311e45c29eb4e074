"""A stream of chat chunks as the Responses event sequence the OpenAI SDK (and Codex) assembles.

Text is relayed live (``output_text.delta``), and so are a plain function call's arguments: its
``output_item.added`` goes out with the call's first chunk and each chat arguments fragment becomes a
``function_call_arguments.delta``; ``.done`` and ``output_item.done`` follow when the chat stream ends.
Calls of custom (freeform) tools and of ``tool_search`` are emitted whole at the end instead, since
their ``input`` / ``arguments`` are decoded from the complete JSON the model wrote for the function they
were translated to. Codex takes its history from the ``output_item.done`` items and ends the turn at
``response.completed``, which carries the usage. A failure after the stream began becomes
``response.failed``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.ingress.responses.output import (
    call_item,
    completion_status,
    message_item,
    new_id,
    reasoning_item,
    response_object,
    usage_of,
)
from proxy.ingress.responses.request import ResponsesRequest, ToolMap
from proxy.kernel.errors import ProxyError
from proxy.runtime.native import NativeCodec

Event = dict[str, Any]
# Called with the final response object and the accumulated assistant message, before the terminal
# event goes out, so a client that retrieves the response right after the stream finds it.
Finisher = Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]]


@dataclass
class _LiveCall:
    """A function call item opened while its arguments still stream: where it sits in the output."""

    item_id: str
    output_index: int


@dataclass
class _State:
    """What has been streamed so far."""

    output: list[dict[str, Any]] = field(default_factory=list)
    reasoning: str = ""
    text: str = ""
    message_id: str | None = None  # set while a message item is open
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    live: dict[int, _LiveCall] = field(default_factory=dict)  # chat call index -> its open output item
    usage: dict[str, Any] | None = None
    finish_reason: Any = None


class ResponseStream:
    """Translates one chat stream; ``events()`` yields the Responses events with sequence numbers."""

    def __init__(
        self, response_id: str, request: ResponsesRequest, tools: ToolMap, finish: Finisher | None = None
    ) -> None:
        self._id = response_id
        self._request = request
        self._tools = tools
        self._finish = finish
        self._sequence = 0
        self._created_at: int | None = None

    def _event(self, kind: str, **data: Any) -> Event:
        event = {"type": kind, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return event

    def _response(self, status: str, state: _State, **extra: Any) -> dict[str, Any]:
        response = response_object(
            self._id, self._request, status=status, output=list(state.output), created_at=self._created_at, **extra
        )
        self._created_at = response["created_at"]
        return response

    async def events(self, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[Event]:
        """The whole event sequence for ``chunks``, ending in completed, incomplete or failed."""
        state = _State()
        start = self._response("in_progress", state, usage=None)
        yield self._event("response.created", response=start)
        yield self._event("response.in_progress", response=start)
        try:
            async for chunk in chunks:
                for event in self._chunk(state, chunk):
                    yield event
        except ProxyError as exc:
            for event in self._close_open_items(state):
                yield event
            for number, live in state.live.items():  # a call cut off mid-arguments stays in the output, marked
                partial = call_item(_chat_call(state.calls[number]), self._tools, live.item_id)
                state.output[live.output_index] = partial | {"status": "incomplete"}
            error = {"code": exc.code or exc.type, "message": exc.message}
            yield self._event("response.failed", response=self._response("failed", state, usage=None, error=error))
            return
        for event in self._close_open_items(state):
            yield event
        for event in self._calls(state):
            yield event
        status, reason = completion_status(state.finish_reason)
        final = self._response(status, state, usage=usage_of(state.usage), incomplete_reason=reason)
        if self._finish is not None:
            try:
                await self._finish(final, self._assistant(state))
            except ProxyError as exc:
                error = {"code": exc.code or exc.type, "message": exc.message}
                yield self._event("response.failed", response=self._response("failed", state, usage=None, error=error))
                return
        yield self._event("response.completed" if status == "completed" else "response.incomplete", response=final)

    def _chunk(self, state: _State, chunk: dict[str, Any]) -> list[Event]:
        if chunk.get("usage"):
            state.usage = chunk["usage"]
        events: list[Event] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if choice.get("finish_reason"):
                state.finish_reason = choice["finish_reason"]
            reasoning = delta.get("reasoning_content")
            if isinstance(reasoning, str) and reasoning:
                state.reasoning += reasoning
            text = delta.get("content")
            if isinstance(text, str) and text:
                events += self._text(state, text)
            for call in delta.get("tool_calls") or []:
                events += self._call_delta(state, call)
        return events

    def _call_delta(self, state: _State, call: dict[str, Any]) -> list[Event]:
        """Accumulate one chat tool-call fragment; stream it when it belongs to a plain function call."""
        index = int(call.get("index") or 0)
        slot = state.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        function = call.get("function") or {}
        slot["id"] = call.get("id") or slot["id"]
        slot["name"] += function.get("name") or ""
        fragment = function.get("arguments") or ""
        slot["arguments"] += fragment
        events: list[Event] = []
        live = state.live.get(index)
        if live is None and slot["name"] and self._streams_live(slot["name"]):
            # Providers send a call's name whole with its first fragment, so the item can open now.
            events += self._close_open_items(state)
            live = _LiveCall(new_id("fc"), len(state.output))
            state.live[index] = live
            item = call_item(_chat_call(slot), self._tools, live.item_id) | {"arguments": "", "status": "in_progress"}
            state.output.append(item)
            events.append(self._event("response.output_item.added", output_index=live.output_index, item=item))
            fragment = slot["arguments"]  # everything so far, in case fragments came before the name
        if live is not None and fragment:
            where = {"output_index": live.output_index, "item_id": live.item_id}
            events.append(self._event("response.function_call_arguments.delta", **where, delta=fragment))
        return events

    def _streams_live(self, flat_name: str) -> bool:
        origin = self._tools.origins.get(flat_name)
        return origin is None or origin.kind not in ("custom", "tool_search")

    def _flush_reasoning(self, state: _State) -> list[Event]:
        if not state.reasoning:
            return []
        item = reasoning_item(state.reasoning)
        state.reasoning = ""
        index = len(state.output)
        state.output.append(item)
        return [
            self._event("response.output_item.added", output_index=index, item=item),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _text(self, state: _State, text: str) -> list[Event]:
        events = self._flush_reasoning(state)
        if state.message_id is None:
            state.message_id = new_id("msg")
            opened = message_item("", state.message_id, status="in_progress")
            opened["content"] = []
            events.append(self._event("response.output_item.added", output_index=len(state.output), item=opened))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events.append(self._part_event("response.content_part.added", state, part=part))
        state.text += text
        events.append(self._part_event("response.output_text.delta", state, delta=text, logprobs=[]))
        return events

    def _part_event(self, kind: str, state: _State, **data: Any) -> Event:
        return self._event(kind, output_index=len(state.output), item_id=state.message_id, content_index=0, **data)

    def _close_open_items(self, state: _State) -> list[Event]:
        events = self._flush_reasoning(state)
        if state.message_id is None:
            return events
        item = message_item(state.text, state.message_id)
        part = item["content"][0]
        events.append(self._part_event("response.output_text.done", state, text=state.text, logprobs=[]))
        events.append(self._part_event("response.content_part.done", state, part=part))
        events.append(self._event("response.output_item.done", output_index=len(state.output), item=item))
        state.output.append(item)
        state.message_id = None
        return events

    def _calls(self, state: _State) -> list[Event]:
        """Finish the live calls (``.done``, ``output_item.done``), then emit the buffered ones whole."""
        events: list[Event] = []
        for number, slot in sorted(state.calls.items()):
            live = state.live.get(number)
            if live is None:
                continue
            item = call_item(_chat_call(slot), self._tools, live.item_id)
            state.output[live.output_index] = item
            where = {"output_index": live.output_index, "item_id": live.item_id}
            events.append(
                self._event(
                    "response.function_call_arguments.done", **where, name=item["name"], arguments=slot["arguments"]
                )
            )
            events.append(self._event("response.output_item.done", output_index=live.output_index, item=item))
        for number, slot in sorted(state.calls.items()):
            if number in state.live:
                continue
            item = call_item(_chat_call(slot), self._tools)
            index = len(state.output)
            events += self._call_events(index, item)
            state.output.append(item)
        return events

    def _call_events(self, index: int, item: dict[str, Any]) -> list[Event]:
        kind = item["type"]
        item_id = item["id"]
        blank = {"function_call": {"arguments": ""}, "custom_tool_call": {"input": ""}}.get(kind, {})
        events = [self._event("response.output_item.added", output_index=index, item={**item, **blank})]
        where = {"output_index": index, "item_id": item_id}
        if kind == "function_call":
            arguments = item["arguments"]
            events.append(self._event("response.function_call_arguments.delta", **where, delta=arguments))
            events.append(
                self._event("response.function_call_arguments.done", **where, name=item["name"], arguments=arguments)
            )
        elif kind == "custom_tool_call":
            events.append(self._event("response.custom_tool_call_input.delta", **where, delta=item["input"]))
            events.append(self._event("response.custom_tool_call_input.done", **where, input=item["input"]))
        events.append(self._event("response.output_item.done", output_index=index, item=item))
        return events

    def _assistant(self, state: _State) -> dict[str, Any]:
        calls = [
            {"id": slot["id"], "type": "function", "function": {"name": slot["name"], "arguments": slot["arguments"]}}
            for _, slot in sorted(state.calls.items())
        ]
        message: dict[str, Any] = {"role": "assistant", "content": state.text or None}
        if calls:
            message["tool_calls"] = calls
        return message


def _chat_call(slot: dict[str, Any]) -> dict[str, Any]:
    """An accumulated slot as a chat tool call (``call_item``'s input)."""
    return {"id": slot["id"] or None, "function": {"name": slot["name"], "arguments": slot["arguments"]}}


async def native_events(
    events: AsyncIterator[Event], response_id: str, codec: NativeCodec, finish: Finisher
) -> AsyncIterator[Event]:
    """The provider's own events relayed as they come (native passage), the response's id the proxy's (so
    ``previous_response_id`` and ``GET /v1/responses/{id}`` find it); the response is remembered before the
    terminal event goes out. A failure after the stream began becomes ``response.failed``."""
    last: dict[str, Any] = {}
    number = 0
    try:
        async for event in events:
            out = dict(event)
            if isinstance(out.get("response"), dict):
                out["response"] = last = {**out["response"], "id": response_id}
            if out.get("type") in _TERMINAL:
                await finish(out["response"], codec.chat_view(out["response"])["choices"][0]["message"])
            number = int(out.get("sequence_number", number)) + 1
            yield out
    except ProxyError as exc:
        error = {"code": exc.code or exc.type, "message": exc.message}
        failed = {**last, "id": response_id, "status": "failed", "error": error}
        yield {"type": "response.failed", "response": failed, "sequence_number": number}


_TERMINAL = frozenset({"response.completed", "response.incomplete"})
