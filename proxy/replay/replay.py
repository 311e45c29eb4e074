"""Replaying a recording through the current build and configuration, offline.

The proxy runs in-process (``create_app``, a fresh temporary store, uvicorn in a thread on loopback)
with a ``ReplayBackend`` in place of the provider: each model call is answered from the recorded
exchange with the same client request, call kind and index, and what the proxy sends now is kept
for the verdict. The recorded client requests are re-sent over real HTTP, one at a time in arrival
order, with the ids the proxy minted then (response ids, compaction tokens) mapped to the ones it
mints now.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from proxy.context.nonce import session_nonce
from proxy.kernel.config import Settings
from proxy.kernel.errors import ContextOverflow, ProviderError, ProxyError
from proxy.kernel.route_api import Api
from proxy.kernel.tenancy import DEFAULT_TEAM, team_of
from proxy.provider.call_tag import current_tag, take_shadow_candidate
from proxy.provider.cassette import Exchange, RecordedRequest, read_recordings
from proxy.provider.chunks import accumulate, synthesize
from proxy.provider.recording import native_input
from proxy.provider.redaction import redact_llm_input
from proxy.provider.science_script import checkpoint_for

# Replay pins its own framing secret: the nonces it produces are known, so that they (and the
# recorded deployment's) can be told apart from a real change.
REPLAY_SECRET = b"context-proxy replay: a fixed framing secret"
UNRECORDED = "unrecorded_call"
# Ids the proxy mints for clients: response and item ids (``resp_``, ``msg_``, ``fc_``...) and
# compaction tokens (``cpx1.``); they differ every run.
_MINTED_ID = re.compile(r"\b(?:cpx1\.|[a-z]{2,4}_)[0-9a-f]{24,32}")


@dataclass
class ReplayedCall:
    """One model call the current build made, and the recorded exchange it was answered from."""

    key: str
    index: int
    llm_input: dict[str, Any]  # redacted, like the recording
    candidate: dict[str, Any] | None = None  # shadow mode: what the proxy would have sent
    recorded: Exchange | None = None
    stand_in: str = ""  # "scripted summarizer" or "unrecorded" when nothing recorded answered it


@dataclass
class TurnReplay:
    """One recorded client request, re-sent: what the client got now and the calls it took."""

    recorded: RecordedRequest
    status: int
    answer: str
    context_id: str
    nonce: str
    calls: list[ReplayedCall] = field(default_factory=list)
    id_map: dict[str, str] = field(default_factory=dict)


class ReplayBackend:
    """Answers each model call from the recording of the request being replayed."""

    def __init__(self) -> None:
        self._recorded: RecordedRequest | None = None
        self._counts: Counter[str] = Counter()
        self.calls: list[ReplayedCall] = []

    def begin(self, recorded: RecordedRequest) -> list[ReplayedCall]:
        """The next client request is ``recorded``; returns the list its calls will be added to."""
        self._recorded = recorded
        self._counts = Counter()
        self.calls = []
        return self.calls

    def model_map_limits(self, model: str) -> tuple[int | None, int | None]:
        """The limits litellm's model map gives, as the recorded deployment had them."""
        from proxy.provider.litellm_backend import LiteLLMBackend

        return LiteLLMBackend(timeout_seconds=1).model_map_limits(model)

    def provider_arguments(self, llm_input: dict[str, Any]) -> dict[str, Any]:
        """``llm_input`` as it is: replay answers from the recording and calls no provider."""
        return dict(llm_input)

    def _start(self, llm_input: dict[str, Any]) -> ReplayedCall:
        key = current_tag().key
        index = self._counts[key]
        self._counts[key] += 1
        recorded = None
        if self._recorded is not None:
            recorded = next((e for e in self._recorded.exchanges if e.key == key and e.index == index), None)
        candidate = take_shadow_candidate()
        call = ReplayedCall(
            key, index, redact_llm_input(llm_input), redact_llm_input(candidate) if candidate else None, recorded
        )
        self.calls.append(call)
        return call

    def _answer(self, call: ReplayedCall, llm_input: dict[str, Any]) -> Exchange:
        exchange = call.recorded
        if exchange is not None and (exchange.response, exchange.chunks, exchange.error) != (None, None, None):
            if exchange.error is not None:
                raise _recorded_error(exchange.error)
            return exchange
        if call.key.startswith("summarizer"):
            # A summarization the recording never needed (a smaller window, say): the built-in scripted
            # summarizer writes a well-formed checkpoint, so the turn can still be compared.
            call.stand_in = "scripted summarizer"
            content = checkpoint_for(str(llm_input["messages"][-1].get("content") or ""))
            return Exchange(call.key, call.index, {}, response=_completion(content, llm_input))
        call.stand_in = "unrecorded"
        raise ProviderError(
            f"replay: the recording has no answer for this call ({call.key} #{call.index})", code=UNRECORDED
        )

    async def complete(self, llm_input: dict[str, Any]) -> dict[str, Any]:
        """The recorded answer of this call."""
        exchange = self._answer(self._start(llm_input), llm_input)
        if exchange.response is not None:
            return copy.deepcopy(exchange.response)
        message = accumulate(exchange.chunks or [])
        return _completion(message.get("content"), llm_input, message)

    async def stream(self, llm_input: dict[str, Any], *, usage_to_caller: bool = True) -> AsyncIterator[dict[str, Any]]:
        """The recorded chunks of this call (a recorded whole answer is cut into chunks)."""
        exchange = self._answer(self._start(llm_input), llm_input)
        if exchange.chunks is not None:
            chunks = copy.deepcopy(exchange.chunks)
        else:
            response = exchange.response or {}
            chunks = synthesize([], response["choices"][0]["message"])
        return _iterate(chunks)

    async def complete_native(
        self, api: Api, body: dict[str, Any], headers: Mapping[str, str], route: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The recorded native answer of this call."""
        llm_input = native_input(api, body)
        exchange = self._answer(self._start(llm_input), llm_input)
        if exchange.response is None:
            raise ProviderError(f"replay: the recording of this {api} call is a stream", code=UNRECORDED)
        return copy.deepcopy(exchange.response)

    async def stream_native(
        self, api: Api, body: dict[str, Any], headers: Mapping[str, str], route: Mapping[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """The recorded native events of this call."""
        llm_input = native_input(api, body)
        exchange = self._answer(self._start(llm_input), llm_input)
        if exchange.chunks is None:
            raise ProviderError(f"replay: the recording of this {api} call is not a stream", code=UNRECORDED)
        return _iterate(copy.deepcopy(exchange.chunks))


async def _iterate(chunks: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for chunk in chunks:
        yield chunk


def _completion(content: Any, llm_input: dict[str, Any], message: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-replay",
        "object": "chat.completion",
        "created": 0,
        "model": str(llm_input.get("model", "")),
        "choices": [
            {
                "index": 0,
                "message": message or {"role": "assistant", "content": content},
                "finish_reason": "tool_calls" if message and message.get("tool_calls") else "stop",
            }
        ],
    }


def _recorded_error(record: dict[str, Any]) -> ProxyError:
    """The error the provider adapter raised when the call was recorded, raised again."""
    error = record.get("error") or {}
    message = str(error.get("message") or "recorded provider error")
    if record.get("class") == "ContextOverflow":
        return ContextOverflow(
            message,
            limit=record.get("limit"),
            provider_message=str(record.get("providerMessage") or ""),
            counts_output=bool(record.get("countsOutput")),
        )
    return ProviderError(
        message, status=int(record.get("status") or 502), type=error.get("type"), code=error.get("code")
    )


class IdMap:
    """Ids the proxy minted in the recording, and the ones it minted for the same answers now."""

    def __init__(self) -> None:
        self.ids: dict[str, str] = {}

    def learn(self, recorded_answer: str, replayed_answer: str) -> None:
        """Pair the minted ids of two answers to the same request by their order of appearance."""
        then = list(dict.fromkeys(_MINTED_ID.findall(recorded_answer)))
        now = list(dict.fromkeys(_MINTED_ID.findall(replayed_answer)))
        same = set(then) & set(now)  # relayed from the recorded provider answer, not minted: not paired
        then, now = [i for i in then if i not in same], [i for i in now if i not in same]
        for old, new in zip(then, now, strict=False):
            self.ids.setdefault(old, new)

    def forward(self, text: str) -> str:
        """``text`` with every recorded id replaced by its replayed counterpart."""
        if not self.ids:
            return text
        return _MINTED_ID.sub(lambda m: self.ids.get(m.group(0), m.group(0)), text)


def replay_settings(settings: Settings, workdir: Path) -> Settings:
    """``settings`` as replay runs them: a fresh store and traces in ``workdir``, nothing recorded, the
    replay framing secret, no authentication (the recording kept no credentials to send)."""
    return dataclasses.replace(
        settings,
        data_dir=workdir / "data",
        store_url=None,
        trace_enabled=True,
        trace_dir=workdir / "traces",
        framing_secret=REPLAY_SECRET,
        record_dir=None,
        master_key=None,
    )


def replay(folders: list[Path], settings: Settings, timeout: float = 120.0) -> list[TurnReplay]:
    """Re-send every recorded request of ``folders`` through the current build; ``ValueError`` when a
    recording cannot be read."""
    from proxy.app import create_app  # the app imports this package's recorder
    from proxy.provider.scripted import serve_in_thread

    recordings = read_recordings(folders)
    backend = ReplayBackend()
    replays: list[TurnReplay] = []
    ids = IdMap()
    with tempfile.TemporaryDirectory(prefix="context-proxy-replay-") as workdir:
        app = create_app(replay_settings(settings, Path(workdir)), backend=backend)
        with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=timeout) as client:
            for recorded in recordings:
                calls = backend.begin(recorded)
                body = recorded.body if isinstance(recorded.body, str) else json.dumps(recorded.body)
                response = client.request(
                    recorded.method,
                    ids.forward(recorded.path),
                    headers=_replayed_headers(recorded),
                    content=ids.forward(body).encode("utf-8"),
                )
                ids.learn(recorded.answer, response.text)
                context_id = response.headers.get("x-context-id") or recorded.context_id
                replays.append(
                    TurnReplay(
                        recorded,
                        response.status_code,
                        response.text,
                        context_id,
                        session_nonce(REPLAY_SECRET, context_id),
                        calls,
                        dict(ids.ids),
                    )
                )
    return replays


def _replayed_headers(recorded: RecordedRequest) -> dict[str, str]:
    """The recorded headers for the replay's unauthenticated app. A team's request was identified within
    its team's key, which the recording does not keep; replay names its session outright (the
    administrator may name any session), so two teams' sessions of one id stay two sessions."""
    headers = {**recorded.headers, "content-type": "application/json"}
    if team_of(recorded.context_id) != DEFAULT_TEAM:
        headers = {k: v for k, v in headers.items() if k.lower() != "x-session-id"}
        headers["x-session-id"] = recorded.context_id
    return headers
