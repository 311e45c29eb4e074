"""A streamed Responses answer's rounds relayed to the client as one response (``proxy/runtime/rounds.py``).

The Responses API streams ``response.created`` and ``response.in_progress``, each output item's
``output_item.added``, its content's events and ``output_item.done``, then ``response.completed`` (or
``.incomplete``, ``.failed``) with the whole response. Across the rounds the client sees the first round's
``response.created`` (its id), every item in order with output indices that go on counting, sequence
numbers that go on counting, and one terminal event holding every item it was given and the usage summed
over the rounds: the events of a ``function_call`` of a proxy-owned tool are held back (its name comes
with ``output_item.added``). Reasoning items reach the client as they came, ``encrypted_content``
included; the session puts the provider's own last round back in place of the client's combined answer
(``SessionAssembler.link_proxy_steps``).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from proxy.runtime.rounds import HELD, PROXY, ROUND_LIMIT_NOTICE, RelayState, summed

if TYPE_CHECKING:
    from proxy.ingress.responses.native import ResponsesCodec

_CALL_ITEMS = frozenset({"function_call", "custom_tool_call"})  # the client's own calls
_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_OPENING = frozenset({"response.created", "response.in_progress", "response.queued"})


class ResponsesRoundRelay(RelayState):
    """``RoundRelay`` for Responses API stream events."""

    def __init__(self, codec: ResponsesCodec, proxy_tools: frozenset[str]) -> None:
        super().__init__(proxy_tools)
        self._codec = codec
        self._items: dict[int, int] = {}  # this round: provider output index -> client index, PROXY or HELD
        self._held: dict[int, list[dict[str, Any]]] = {}  # client calls held with a proxy call: their events
        self._next_item = 0
        self._sequence = 0
        self._terminal: dict[str, Any] | None = None  # this round's terminal event, held
        self._usages: list[dict[str, Any]] = []
        self._opening: dict[str, Any] = {}  # the first round's response (id, created_at, model, ...)
        self._given: list[dict[str, Any]] = []  # the items the client got, in its order

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        self._round.append(event)
        kind = event.get("type")
        if kind in _OPENING:
            if self._rounds:
                return []
            if kind == "response.created":
                self._opening = copy.deepcopy(dict(event.get("response") or {}))
            return self._relay(event)
        if kind in _TERMINAL:
            self._terminal = event
            usage = (event.get("response") or {}).get("usage")
            if usage:
                self._usages.append(dict(usage))
            return []
        if "output_index" in event:
            return self._item_event(event)
        return self._relay(event)  # error and events the proxy does not know: as they came

    def next_round(self) -> list[dict[str, Any]]:
        self._rounds += 1
        self._round, self._items, self._held, self._proxy_seen, self._terminal = [], {}, {}, False, None
        return []

    def close(self, dropped: frozenset[str]) -> list[dict[str, Any]]:
        self._dropped = dropped
        self._last = self._round
        if self._rounds == 0 and not self._proxy_seen:  # one round, nothing held: the provider's own ending
            return self._relay(self._terminal) if self._terminal is not None else []
        out: list[dict[str, Any]] = []
        for events in self._held.values():  # client calls held with proxy calls that are not run
            index = self._next_item
            self._next_item += 1
            self._client_called = True
            for event in events:
                out += self._relay({**event, "output_index": index})
        if not self._text and not self._client_called:
            out += self._notice()
        final = copy.deepcopy(dict((self._terminal or {}).get("response") or {}))
        response = {**self._opening, **{k: v for k, v in final.items() if k not in ("id", "created_at")}}
        response["output"] = copy.deepcopy(self._given)
        if self._usages:
            response["usage"] = summed(self._usages)
        kind = (self._terminal or {}).get("type") or "response.completed"
        out += self._relay({"type": kind, "response": response, "sequence_number": 0})  # numbered as it goes
        return out

    def _item_event(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """An output item's event as the client gets it now: proxy calls (and client calls after one) held
        back, output indices counted over the answer."""
        index = int(event.get("output_index") or 0)
        if event.get("type") == "response.output_item.added":
            item = event.get("item") or {}
            call = item.get("type") in _CALL_ITEMS
            if call and self._codec.call_name(item) in self._proxy:
                self._items[index], self._proxy_seen = PROXY, True
            elif call and self._proxy_seen:
                self._items[index] = HELD
            else:
                self._items[index] = self._next_item
                self._next_item += 1
                self._client_called = self._client_called or call
                self._text = self._text or item.get("type") == "message"
        place = self._items.get(index, index)
        if place == PROXY:
            return []
        if place == HELD:
            self._held.setdefault(index, []).append(copy.deepcopy(event))
            return []
        return self._relay({**event, "output_index": place})

    def _notice(self) -> list[dict[str, Any]]:
        """A message item saying the round limit stopped the proxy's calls (the client got nothing else)."""
        index = self._next_item
        self._next_item += 1
        item = {
            "type": "message",
            "id": f"msg_proxy_{index}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": ROUND_LIMIT_NOTICE, "annotations": []}],
        }
        out: list[dict[str, Any]] = []
        for event in (
            {"type": "response.output_item.added", "output_index": index, "item": {**item, "content": []}},
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ):
            out += self._relay(event)
        return out

    def _relay(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """``event`` as the client gets it: sequence numbers count over the answer."""
        if "sequence_number" in event:
            event = {**event, "sequence_number": self._sequence}
            self._sequence += 1
        if event.get("type") == "response.output_item.done" and isinstance(event.get("item"), dict):
            self._given.append(copy.deepcopy(event["item"]))
        self._relayed.append(event)
        return [event]

    def _message(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        """The chat form of the answer ``events`` make (as the ingress reads the client's next request)."""
        message: dict[str, Any] = self._codec.chat_view(self._codec.response_of(events))["choices"][0]["message"]
        return message
