"""A streamed answer that stays live while the proxy runs its own tools: rounds relayed as one answer.

When the proxy offers its own tools (``read_tool_output`` in every session that works with tools), the
model may call one in any answer. The stream is still relayed as it comes: text, thinking and the client's
own tool calls reach the client at once; only a call of a proxy-owned tool is held back (its name comes
with its first delta). When the provider's stream ends with such a call, the turn service runs it and asks
the model again, and the next round's stream continues the same answer: one message id, tool-call and
block indices that go on counting, one finish reason and one usage, the sum over the rounds.

A client tool call that was relayed is never taken back: when the model calls a proxy tool in an answer
that already gave the client a call, the proxy's calls are dropped and the answer ends with the client's
(the model sees that output next turn and may call again). A client call the model makes after a proxy
call in the same answer is held with it: the model is asked again with the proxy's results and makes it
again (or not), as in an answer that was read whole.

``RoundRelay`` is the port; ``ChatRoundRelay`` serves chat chunks (every chat-speaking ingress), and each
native codec has its own for its API's events (``NativeCodec.round_relay``).

The client ends up with one message that holds every round's text; the provider wrote several (the
rounds, with the proxy's calls and results between them). ``client_message`` and ``last_message`` tell the
turn service both, so the session puts the provider's real messages back in place of the client's
(``SessionAssembler.link_proxy_steps``): thinking and reasoning stay valid where they were written.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from proxy.provider.chunks import accumulate

# What the client gets when every call of an answer was the proxy's and the round limit stopped them.
ROUND_LIMIT_NOTICE = "[context-proxy: the model was still calling proxy-owned tools after the round limit]"


class RoundRelay(Protocol):
    """Relays one answer's rounds to the client as one streamed answer (see the module docstring)."""

    @property
    def client_called(self) -> bool:
        """Whether a client tool call went out in this answer (it is never taken back)."""

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """What the client gets of this provider event (chunk) now."""

    def round_message(self) -> dict[str, Any]:
        """This round's whole message in chat form, proxy calls included (what the model wrote)."""

    def next_round(self) -> list[dict[str, Any]]:
        """The round ended with proxy calls the turn service runs: what the client gets of the round's held
        ending, and the next round's events continue the same answer."""

    def close(self, dropped: frozenset[str]) -> list[dict[str, Any]]:
        """The answer's ending: the calls of ``dropped`` (proxy tools the last round called and the proxy does
        not run) left out, client calls held with them let out, the finish and the summed usage."""

    def client_message(self) -> dict[str, Any]:
        """The answer as the client has it (its next request sends it back), in chat form."""

    def last_message(self) -> dict[str, Any]:
        """The last round's message as the provider wrote it, without ``dropped`` calls, in chat form."""


def summed(usages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Usage objects added up field by field (nested detail objects too); the first's other fields kept."""
    total: dict[str, Any] = copy.deepcopy(dict(usages[0])) if usages else {}
    for usage in usages[1:]:
        for key, value in usage.items():
            mine = total.get(key)
            if isinstance(value, bool) or value is None:
                continue
            if isinstance(value, int | float) and isinstance(mine, int | float) and not isinstance(mine, bool):
                total[key] = mine + value
            elif isinstance(value, Mapping) and isinstance(mine, Mapping):
                total[key] = summed([mine, value])
            elif key not in total:
                total[key] = copy.deepcopy(value)
    return total


def without_calls(message: Mapping[str, Any], names: frozenset[str]) -> dict[str, Any]:
    """A chat message without its tool calls of ``names``."""
    out = dict(message)
    kept = [call for call in out.get("tool_calls") or [] if (call.get("function") or {}).get("name") not in names]
    out.pop("tool_calls", None)
    if kept:
        out["tool_calls"] = kept
    return out


PROXY, HELD = -1, -2  # where a provider call's index goes: held back for good, or held with the proxy's


class RelayState:
    """What every API's relay keeps: the events relayed and this round's, whether a proxy call was seen in
    this round and a client call in the answer, and what the answer's messages are made of. ``_message``
    reads events into the chat form of the message they make (each API its own way)."""

    def __init__(self, proxy_tools: frozenset[str]) -> None:
        self._proxy = proxy_tools
        self._relayed: list[dict[str, Any]] = []  # what the client got
        self._round: list[dict[str, Any]] = []  # this round's provider events, all of them
        self._proxy_seen = False  # a proxy call in this round: later client calls of the round are held
        self._client_called = False
        self._text = False  # the client got text: no notice is needed when the proxy's calls are dropped
        self._rounds = 0
        self._last: list[dict[str, Any]] = []  # the last round's events, once closed
        self._dropped: frozenset[str] = frozenset()

    @property
    def client_called(self) -> bool:
        return self._client_called

    def round_message(self) -> dict[str, Any]:
        return self._message(self._round)

    def client_message(self) -> dict[str, Any]:
        return self._message(self._relayed)

    def last_message(self) -> dict[str, Any]:
        return without_calls(self._message(self._last), self._dropped)

    def _message(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        raise NotImplementedError


class ChatRoundRelay(RelayState):
    """``RoundRelay`` for OpenAI chat chunks."""

    def __init__(self, proxy_tools: frozenset[str]) -> None:
        super().__init__(proxy_tools)
        self._envelope: dict[str, Any] | None = None  # the first round's id, created and model
        self._calls: dict[int, int] = {}  # this round: provider index -> client index, PROXY or HELD
        self._held: dict[int, list[tuple[dict[str, Any], dict[str, Any]]]] = {}  # client calls held: (chunk, delta)
        self._next_call = 0
        self._finish: dict[str, Any] | None = None  # this round's chunk with the finish reason, held
        self._usages: list[dict[str, Any]] = []  # usage chunks, held to the end

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        self._round.append(event)
        if self._envelope is None:
            self._envelope = {key: event[key] for key in ("id", "created", "model") if key in event}
        choices = event.get("choices") or []
        if event.get("usage") and not choices:
            self._usages.append(event)
            return []
        if choices and choices[0].get("finish_reason") is not None:
            self._finish = event
            return []
        return self._out(event)

    def next_round(self) -> list[dict[str, Any]]:
        out = self._out(_without_finish(self._finish)) if self._finish is not None else []
        self._rounds += 1
        self._round, self._calls, self._held, self._proxy_seen, self._finish = [], {}, {}, False, None
        return out

    def close(self, dropped: frozenset[str]) -> list[dict[str, Any]]:
        self._dropped = dropped
        self._last = self._round
        if self._rounds == 0 and not self._proxy_seen:  # one round, nothing held: the provider's own ending
            out = ([self._finish] if self._finish is not None else []) + self._usages
            self._relayed += out
            return out
        out = self._out(_without_finish(self._finish)) if self._finish is not None else []
        for deltas in self._held.values():  # client calls held with proxy calls that are not run
            index = self._next_call
            self._next_call += 1
            self._client_called = True
            out += [self._stamped(_with_calls(chunk, [{**call, "index": index}])) for chunk, call in deltas]
        template = self._finish or (self._round[-1] if self._round else {})
        if not self._text and not self._client_called:
            out.append(self._stamped(_chunk(template, {"role": "assistant", "content": ROUND_LIMIT_NOTICE}, None)))
        reason = str((self._finish or {}).get("choices", [{}])[0].get("finish_reason") or "stop")
        if self._client_called:
            reason = "tool_calls"
        elif reason == "tool_calls":
            reason = "stop"
        out.append(self._stamped(_chunk(template, {}, reason)))
        if self._usages:
            usage = summed([chunk["usage"] for chunk in self._usages])
            out.append(self._stamped({**self._usages[-1], "usage": usage}))
        self._relayed += out
        return out

    def _message(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        return accumulate(events)

    def _out(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The chunk as the client gets it now: proxy calls (and client calls after one) held back, call
        indices counted over the answer, the envelope the first round's."""
        choices = chunk.get("choices") or []
        if not choices:
            return [self._relayed_now(self._stamped(chunk))]
        delta = choices[0].get("delta") or {}
        if delta.get("content"):
            self._text = True
        calls = delta.get("tool_calls")
        if not calls:
            return [self._relayed_now(self._stamped(chunk))]
        kept: list[dict[str, Any]] = []
        for call in calls:
            index = self._place(call)
            if index == HELD:
                self._held.setdefault(int(call.get("index", 0)), []).append((chunk, call))
            elif index != PROXY:
                kept.append(call if index == call.get("index", 0) else {**call, "index": index})
        if kept == calls:
            return [self._relayed_now(self._stamped(chunk))]
        rest = {key: value for key, value in delta.items() if key != "tool_calls"}
        if not kept and not any(value for key, value in rest.items() if key != "role"):
            return []
        return [self._relayed_now(self._stamped(_with_calls(chunk, kept)))]

    def _place(self, call: Mapping[str, Any]) -> int:
        """Where a provider tool-call delta goes: its client index, or held back."""
        index = int(call.get("index", 0))
        if index not in self._calls:
            name = (call.get("function") or {}).get("name")
            if name in self._proxy:
                self._calls[index], self._proxy_seen = PROXY, True
            elif self._proxy_seen:
                self._calls[index] = HELD
            else:
                self._calls[index], self._client_called = self._next_call, True
                self._next_call += 1
        return self._calls[index]

    def _stamped(self, chunk: dict[str, Any]) -> dict[str, Any]:
        """A later round's chunk under the first round's envelope (one answer to the client)."""
        if self._rounds == 0 or self._envelope is None:
            return chunk
        return {**chunk, **self._envelope}

    def _relayed_now(self, chunk: dict[str, Any]) -> dict[str, Any]:
        self._relayed.append(chunk)
        return chunk


def _without_finish(chunk: dict[str, Any]) -> dict[str, Any]:
    """The finish chunk's delta as a plain chunk (its content and calls go out; the finish is the answer's)."""
    choices = [{**choice, "finish_reason": None} for choice in chunk.get("choices") or []]
    return {key: value for key, value in chunk.items() if key != "usage"} | {"choices": choices}


def _with_calls(chunk: dict[str, Any], calls: list[dict[str, Any]]) -> dict[str, Any]:
    """``chunk`` with its first choice's tool calls replaced."""
    choice = dict(chunk["choices"][0])
    delta = {key: value for key, value in (choice.get("delta") or {}).items() if key != "tool_calls"}
    if calls:
        delta["tool_calls"] = calls
    choice["delta"] = delta
    return {**chunk, "choices": [choice]}


def _chunk(template: Mapping[str, Any], delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    """A chunk in ``template``'s envelope with one choice."""
    envelope = {key: copy.deepcopy(value) for key, value in template.items() if key not in ("choices", "usage")}
    return {**envelope, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
