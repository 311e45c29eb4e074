"""A streamed Messages answer's rounds relayed to the client as one message (``proxy/runtime/rounds.py``).

Anthropic streams a message as ``message_start``, each content block's start, deltas and stop, one
``message_delta`` (stop reason and usage) and ``message_stop``. Across the rounds the client sees the first
round's ``message_start`` (its id and model), every block in order with indices that go on counting,
and one ``message_delta`` whose usage is the sum of every round's: the blocks of a ``tool_use`` of a
proxy-owned tool are held back (its name comes with its start). Thinking blocks reach the client as
they came, signatures included; the session puts the provider's own last round back in place of the
client's combined message (``SessionAssembler.link_proxy_steps``), so what the provider is sent next turn
is what it wrote.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from proxy.runtime.rounds import HELD, PROXY, ROUND_LIMIT_NOTICE, RelayState, summed

if TYPE_CHECKING:
    from proxy.ingress.messages.native import AnthropicCodec

_NOTICE = ROUND_LIMIT_NOTICE
_CALL_BLOCKS = frozenset({"tool_use"})  # the client's own calls (server-tool blocks run at the provider)


class AnthropicRoundRelay(RelayState):
    """``RoundRelay`` for Anthropic Messages stream events."""

    def __init__(self, codec: AnthropicCodec, proxy_tools: frozenset[str]) -> None:
        super().__init__(proxy_tools)
        self._codec = codec
        self._blocks: dict[int, int] = {}  # this round: provider index -> client index, PROXY or HELD
        self._held: dict[int, list[dict[str, Any]]] = {}  # client calls held with a proxy call: their events
        self._next_block = 0
        self._ending: list[dict[str, Any]] = []  # this round's message_delta and message_stop, held
        self._usages: list[dict[str, Any]] = []  # every round's usage (message_start's, then message_delta's)

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        self._round.append(event)
        kind = event.get("type")
        if kind == "message_start":
            self._usages.append(dict((event.get("message") or {}).get("usage") or {}))
            return self._relay(event) if self._rounds == 0 else []
        if kind in ("message_delta", "message_stop"):
            if kind == "message_delta" and event.get("usage"):
                self._usages[-1] = {**self._usages[-1], **event["usage"]} if self._usages else dict(event["usage"])
            self._ending.append(event)
            return []
        if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            return self._block_event(event)
        return self._relay(event)  # ping, error: as they came

    def next_round(self) -> list[dict[str, Any]]:
        self._rounds += 1
        self._round, self._blocks, self._held, self._proxy_seen, self._ending = [], {}, {}, False, []
        return []

    def close(self, dropped: frozenset[str]) -> list[dict[str, Any]]:
        self._dropped = dropped
        self._last = self._round
        if self._rounds == 0 and not self._proxy_seen:  # one round, nothing held: the provider's own ending
            ending = list(self._ending)
            self._relayed += ending
            return ending
        out: list[dict[str, Any]] = []
        for events in self._held.values():  # client calls held with proxy calls that are not run
            index = self._next_block
            self._next_block += 1
            self._client_called = True
            out += [{**event, "index": index} for event in events]
        if not self._text and not self._client_called:
            index = self._next_block
            self._next_block += 1
            out += [
                {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
                {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": _NOTICE}},
                {"type": "content_block_stop", "index": index},
            ]
        given = next((e for e in self._ending if e.get("type") == "message_delta"), {})
        delta = dict(given.get("delta") or {"stop_reason": "end_turn", "stop_sequence": None})
        if self._client_called:
            delta["stop_reason"] = "tool_use"
        elif delta.get("stop_reason") == "tool_use":
            delta["stop_reason"] = "end_turn"
        usage = summed(self._usages) if self._usages else {}
        out.append({"type": "message_delta", "delta": delta, "usage": usage})
        out.append({"type": "message_stop"})
        self._relayed += out
        return out

    def _block_event(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """A content block's event as the client gets it now: proxy calls (and client calls after one) held
        back, indices counted over the answer."""
        index = int(event.get("index") or 0)
        if event.get("type") == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") in _CALL_BLOCKS and block.get("name") in self._proxy:
                self._blocks[index], self._proxy_seen = PROXY, True
            elif block.get("type") in _CALL_BLOCKS and self._proxy_seen:
                self._blocks[index] = HELD
            else:
                self._blocks[index] = self._next_block
                self._next_block += 1
                if block.get("type") in _CALL_BLOCKS:
                    self._client_called = True
                if block.get("type") == "text":
                    self._text = True
        place = self._blocks.get(index, index)
        if place == PROXY:
            return []
        if place == HELD:
            self._held.setdefault(index, []).append(copy.deepcopy(event))
            return []
        return self._relay(event if place == index else {**event, "index": place})

    def _relay(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        self._relayed.append(event)
        return [event]

    def _message(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        """The chat form of the message ``events`` make (as the ingress reads the client's next request)."""
        message: dict[str, Any] = self._codec.chat_view(self._codec.response_of(events))["choices"][0]["message"]
        return message
