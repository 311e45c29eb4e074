"""One model call of a turn: assemble (unless legacy), call the provider once, trace and observe it.

``ModelCalls.attempt`` is what ``TurnService`` (``service.py``) calls for each attempt of each round: it
builds the provider call (a chat call for litellm, or the client's own API for a native request:
``native.py``), calls the backend, and hands the finished call's ``CallRecord`` to the observers and the
trace writer (``record``, the one place that does either; for a live stream when the stream ends).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.context.turn_estimator import TurnEstimator, counts_of
from proxy.context.types import TokenEstimator
from proxy.kernel.client_params import client_arguments, with_route
from proxy.kernel.config import ModelRoute, Settings
from proxy.kernel.errors import ContextOverflow, EmptyStream, ProxyError
from proxy.kernel.native import NATIVE, without_native
from proxy.kernel.route_api import provider_of
from proxy.kernel.usage import ModelPrices, PriceLookup, ProviderUsage, no_prices
from proxy.provider import call_tag
from proxy.provider.base import ProviderBackend
from proxy.runtime.answers import Answer, Completion, LiveStream
from proxy.runtime.anthropic_marks import marked_for_anthropic
from proxy.runtime.assembly import Assembler, Candidate, TurnRequest
from proxy.runtime.cache_key import with_session_cache_key
from proxy.runtime.calibration import TokenCalibrator
from proxy.runtime.empty_stream import judge_empty_stream, requested_output
from proxy.runtime.native import NativeCodec, NativeRequest
from proxy.runtime.observers import CallObserver
from proxy.runtime.trace import TraceWriter
from proxy.runtime.trace_record import CallCost, CallRecord, trace_json

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reply:
    """One model call's answer and what the model was offered and shown when it gave it."""

    answer: Answer
    proxy_tools: frozenset[str] = frozenset()  # proxy-owned tools the model was offered in this call
    visible_history: tuple[dict[str, Any], ...] = ()  # what the model saw when it made these calls

    def proxy_calls(self) -> list[dict[str, Any]]:
        """The calls of proxy-owned tools in a whole answer (a live stream's are its relay's: ``rounds.py``)."""
        if not isinstance(self.answer, Completion) or not self.proxy_tools:
            return []
        calls = self.answer.message.get("tool_calls") or []
        return [c for c in calls if c["function"]["name"] in self.proxy_tools]


class ModelCalls:
    """Makes a turn's model calls against one assembler and one provider backend, and records each."""

    def __init__(
        self,
        settings: Settings,
        assembler: Assembler,
        backend: ProviderBackend,
        calibrator: TokenCalibrator,
        observer: CallObserver,
        traces: TraceWriter | None,
        prices: PriceLookup = no_prices,
    ) -> None:
        self.settings = settings
        self.prices = prices  # litellm's cost map, by the litellm model string
        self.assembler = assembler
        self.backend = backend
        self.calibrator = calibrator
        self.observer = observer
        self.traces = traces

    async def attempt(self, request: TurnRequest, recovery: int, reason: str = "") -> Reply:
        """Assemble (unless legacy), call the provider once, and trace this attempt (a live stream's trace
        is written when the stream ends)."""
        call_tag.begin_attempt(recovery)  # record and replay: the first attempt or the overflow retry
        began = time.time_ns()
        candidate, shadow_failure = None, None
        if request.mode == "dynamic":
            candidate = await self._assemble(request, recovery, reason)
        elif request.mode == "shadow":
            # Shadow is how operators try the proxy in front of a live agent: a candidate that cannot be
            # assembled is traced, and the client's own request is sent as it would be anyway.
            try:
                candidate = await self.assembler.assemble(request)
            except Exception as exc:
                logger.warning("shadow candidate failed for %s: %s", request.identity.context_id, exc)
                shadow_failure = exc
        sent = candidate if request.mode == "dynamic" else None
        if request.native is not None:
            return await self._native_attempt(
                request, request.native, candidate, shadow_failure, recovery, reason, began
            )
        llm_input = build_llm_input(request.body, request.route, sent, request.provider_fields)
        if sent is not None and provider_of(request.route.litellm_params) == "anthropic":
            messages, tools = marked_for_anthropic(
                llm_input["messages"], llm_input.get("tools"), sent.cache_breakpoints
            )
            llm_input["messages"] = messages
            if tools is not None:
                llm_input["tools"] = tools
        if sent is not None:
            llm_input = with_session_cache_key(llm_input, request.route, request.identity.context_id)
        # The usage of a streamed answer is the calibration's only source for it: in dynamic mode the
        # proxy asks for it and keeps it from a client that did not (shadow and legacy send what the
        # client sent, so they learn only when the client asked).
        strip_usage = sent is not None and bool(request.body.get("stream")) and not _asks_usage(llm_input)
        if strip_usage:
            llm_input["stream_options"] = {**(llm_input.get("stream_options") or {}), "include_usage": True}
        if request.mode == "shadow" and candidate is not None:  # record and replay compare shadow candidates
            call_tag.offer_shadow_candidate(
                lambda: build_llm_input(request.body, request.route, candidate, request.provider_fields)
            )
        record = CallRecord(
            request,
            candidate,
            llm_input,
            _client_tokens(request.body, self.sizes(request)),
            recovery,
            reason,
            assembly_error=shadow_failure,
        )
        record.provider_arguments = self.backend.provider_arguments(llm_input)
        record.started_ns = began
        proxy_tools = sent.proxy_tools if sent is not None else frozenset()
        visible = sent.visible_history if sent is not None else ()
        started = time.perf_counter()
        live = False
        try:
            answer: Answer
            if not request.body.get("stream"):
                response = await self.backend.complete(llm_input)
                record.usage = response.get("usage")
                record.calibration = await self.calibrator.observe(
                    request.route, llm_input, record.usage, _counter(request)
                )
                answer = Completion(response)
            else:  # relayed as it comes; with proxy tools offered, round by round (``rounds.py``)
                chunks = await self.backend.stream(llm_input, usage_to_caller=not strip_usage)
                answer, live = LiveStream(self._finish_stream(chunks, record, strip_usage)), True
            return Reply(answer, proxy_tools, visible)
        except EmptyStream as empty:
            # A 200 with nothing in it: an overflow the server did not name, or a failure to explain.
            sent_tokens = _estimated_size(llm_input, False, self.sizes(request))
            judged = judge_empty_stream(empty, sent_tokens, requested_output(llm_input), request.limits)
            record.provider_error = judged.body()["error"]
            record.provider_status = judged.status
            raise judged from empty
        except ProxyError as exc:
            record.provider_error = exc.body()["error"]
            record.provider_status = exc.status
            if isinstance(exc, ContextOverflow):
                # Counted as the assembly counted it (the route's calibrated estimator), so RouteLimits
                # judges the provider's statement against the same figure the window was filled by.
                exc.sent_tokens = _estimated_size(llm_input, exc.counts_output, self.sizes(request))
            raise
        finally:
            record.provider_ms = round((time.perf_counter() - started) * 1000, 3)
            if not live:
                self.record(record)

    async def _native_attempt(
        self,
        request: TurnRequest,
        native: NativeRequest,
        candidate: Candidate | None,
        shadow_failure: Exception | None,
        recovery: int,
        reason: str,
        began: int,
    ) -> Reply:
        """``_attempt``'s provider call when the provider is sent the client's own API (``runtime/native.py``):
        the codec renders the body, the provider's answer or events go back to the client as they came, and
        their chat view serves the turn (proxy-owned calls, calibration, the trace's usage)."""
        sent = candidate if request.mode == "dynamic" else None
        stream = bool(request.body.get("stream"))
        codec = native.codec
        counted = _chat_form(request.body, sent)  # the chat form of what is sent: what calibration counts
        ends = sent.cache_breakpoints if sent is not None else ()
        body = codec.body(counted["messages"], counted["tools"], stream=stream, breakpoints=ends)
        if sent is not None:
            body = with_session_cache_key(body, request.route, request.identity.context_id)
        if request.mode == "shadow" and candidate is not None:  # record and replay compare shadow candidates
            call_tag.offer_shadow_candidate(lambda: codec.body(candidate.messages, candidate.tools, stream=stream))
        record = CallRecord(
            request,
            candidate,
            body,
            _client_tokens(request.body, self.sizes(request)),
            recovery,
            reason,
            assembly_error=shadow_failure,
        )
        record.started_ns = began
        proxy_tools = sent.proxy_tools if sent is not None else frozenset()
        visible = sent.visible_history if sent is not None else ()
        route = request.route.litellm_params
        started = time.perf_counter()
        live = False
        try:
            answer: Answer
            if not stream:
                response = await self.backend.complete_native(native.api, body, native.headers, route)
                chat = codec.chat_view(response)
                record.usage = chat.get("usage")
                record.calibration = await self.calibrator.observe(
                    request.route, counted, record.usage, _counter(request)
                )
                answer = Completion(chat, native=response)
            else:
                events_in = await self.backend.stream_native(native.api, body, native.headers, route)
                relay = self._finish_native_stream(events_in, record, codec, counted)
                answer, live = LiveStream(relay), True
            return Reply(answer, proxy_tools, visible)
        except ProxyError as exc:
            record.provider_error = exc.body()["error"]
            record.provider_status = exc.status
            if isinstance(exc, ContextOverflow):
                exc.sent_tokens = _estimated_size(counted, exc.counts_output, self.sizes(request))
            raise
        finally:
            record.provider_ms = round((time.perf_counter() - started) * 1000, 3)
            if not live:
                self.record(record)

    async def _finish_native_stream(
        self,
        events: AsyncIterator[dict[str, Any]],
        record: CallRecord,
        codec: NativeCodec,
        counted: dict[str, Any],
    ) -> AsyncIterator[dict[str, Any]]:
        """Relay the provider's own events as they come; when the stream ends, learn from its usage. The
        trace is written when the stream ends, fails or is dropped."""
        seen: list[dict[str, Any]] = []
        try:
            async for event in events:
                seen.append(event)
                yield event
            record.usage = codec.chat_view(codec.response_of(seen)).get("usage")
            record.calibration = await self.calibrator.observe(
                record.request.route, counted, record.usage, _counter(record.request)
            )
        except ProxyError as exc:
            record.provider_error = exc.body()["error"]
            record.provider_status = exc.status
            raise
        finally:
            try:
                aclose = getattr(events, "aclose", None)
                if aclose is not None:
                    await aclose()
            finally:
                self.record(record)

    async def _assemble(self, request: TurnRequest, recovery: int, reason: str) -> Candidate:
        """The dynamic candidate; a failed assembly is traced (no provider call follows) and raised unchanged."""
        began = time.time_ns()
        try:
            return await self.assembler.assemble(request)
        except Exception as exc:  # any failure: the client gets its error as before, the trace says why
            failed = CallRecord(
                request,
                None,
                {},
                _client_tokens(request.body, self.sizes(request)),
                recovery,
                reason,
                assembly_error=exc,
            )
            failed.started_ns = began
            self.record(failed)
            raise

    async def _finish_stream(
        self, chunks: AsyncIterator[dict[str, Any]], record: CallRecord, strip_usage: bool
    ) -> AsyncIterator[dict[str, Any]]:
        """Relay the chunks (without the usage the proxy asked for itself), learn from the usage when the
        stream ends; the trace is written when the stream ends, fails or is dropped."""
        usage = None
        try:
            async for chunk in chunks:
                usage = chunk.get("usage") or usage
                kept = _client_chunk(chunk, strip_usage)
                if kept is not None:
                    yield kept
            record.usage = None if _usage_estimated(chunks) else usage
            record.calibration = await self.calibrator.observe(
                record.request.route, record.llm_input, record.usage, _counter(record.request)
            )
        except ProxyError as exc:
            record.provider_error = exc.body()["error"]
            record.provider_status = exc.status
            raise
        finally:
            try:
                aclose = getattr(chunks, "aclose", None)
                if aclose is not None:
                    await aclose()
            finally:
                self.record(record)

    def sizes(self, request: TurnRequest) -> TokenEstimator:
        """The counter of what a call sends (the trace's ``clientTokens``, an overflow's size): the turn's
        own estimator (calibrated by default), as the candidate is counted, so the report compares like
        with like; its memo already knows the client's messages by chain hash and what the assembly counted."""
        counter = _counter(request)
        if counter is None:
            counter = TurnEstimator(self.calibrator.conservative)
            counter.name_messages(*_named(request))
        return counter

    def record(self, record: CallRecord) -> None:
        """Hand a finished call to the observers and, when traces are on, write its trace file."""
        record.cost = self._cost(record)
        self.observer.model_call(record)  # the one observation point of a model call, traces on or off
        if self.traces is not None:
            request = record.request
            self.traces.write(request.identity.context_id, request.turn, trace_json(record), recovery=record.recovery)

    def _cost(self, record: CallRecord) -> CallCost | None:
        """The call's cost and its summarizer calls' at their routes' prices; ``None`` when nothing was billed
        (the assembly failed before any call). An unknown figure is ``None`` with its reason, never 0."""
        unknown: list[str] = []
        model = record.request.route.litellm_model
        prices = self.prices(model)
        own: float | None = 0.0  # a failed call, or a compaction request (its calls are the summarizer's)
        answered = record.compaction is None and record.provider_error is None and record.provider_ms is not None
        if answered:
            own = _priced(model, prices, ProviderUsage.of(record.usage), unknown)
        summarizer: float | None = 0.0
        calls = summarizer_calls_of(record)
        for call in calls:
            if call.get("error") is not None and not call.get("usage"):
                continue  # a refused call is not billed
            call_model = self._summary_model(call)
            cost = _priced(call_model, self.prices(call_model), ProviderUsage.of(call.get("usage")), unknown)
            summarizer = None if cost is None or summarizer is None else summarizer + cost
        if not answered and not calls:
            return None
        return CallCost(own, summarizer, prices, tuple(dict.fromkeys(unknown)))

    def _summary_model(self, call: Mapping[str, Any]) -> str:
        """The litellm model a summarizer call was made to: its route's (the call records the route's name)."""
        route = self.settings.route(str(call.get("model") or ""))
        if route is not None:
            return route.litellm_model
        return str((call.get("llmInput") or {}).get("model") or "")


def _priced(model: str, prices: ModelPrices | None, usage: ProviderUsage | None, unknown: list[str]) -> float | None:
    """What ``usage`` cost at ``prices``; ``None``, with the reason added to ``unknown``, when either is missing."""
    if usage is None:
        unknown.append("the provider reported no usage")
        return None
    if prices is None:
        unknown.append(f"no price for {model or 'the model'} in litellm's cost map")
        return None
    return prices.cost(usage)


def summarizer_calls_of(record: CallRecord) -> Sequence[Mapping[str, Any]]:
    """The summarizer calls a model call made: in its assembly, or for a client's compaction request."""
    if record.compaction is not None:
        return record.compaction.outcome.calls
    candidate = record.candidate
    return candidate.record.summarizer_calls if candidate is not None and candidate.record is not None else ()


def _named(request: TurnRequest) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The client's messages and their chain hashes."""
    return request.body["messages"], request.reconciliation.chain_hashes


def _counter(request: TurnRequest) -> TurnEstimator | None:
    """The turn's own counter (``TokenAccounting.estimator``), when the request has its accounting."""
    return request.tokens.estimator if request.tokens is not None else None


def _usage_estimated(chunks: object) -> bool:
    """Whether a stream's usage was made up by litellm, not sent by the provider (``ProviderStream``): the
    provider's usage is calibration's source, never a count of our own side."""
    return getattr(chunks, "usage_estimated", False) is True


def _asks_usage(llm_input: Mapping[str, Any]) -> bool:
    options = llm_input.get("stream_options")
    return isinstance(options, Mapping) and bool(options.get("include_usage"))


def _client_chunk(chunk: dict[str, Any], strip_usage: bool) -> dict[str, Any] | None:
    """The chunk as the client gets it: without ``usage`` when only the proxy asked for it (``None``: a
    chunk that carried nothing else)."""
    if not strip_usage or "usage" not in chunk:
        return chunk
    if not chunk.get("choices"):
        return None
    return {key: value for key, value in chunk.items() if key != "usage"}


def without_proxy_calls(reply: Reply, rounds: int, native: NativeRequest | None = None) -> Completion:
    """A whole answer with its proxy-owned calls removed: the client must never see a tool it does not know
    (a live stream's are held back by its relay, ``rounds.py``)."""
    answer = reply.answer
    assert isinstance(answer, Completion)  # a stream's proxy calls never reach this far
    if native is not None:
        kept_native = native.codec.without_tools(answer.native or {}, reply.proxy_tools)
        return Completion(native.codec.chat_view(kept_native), native=kept_native)
    message = answer.message
    kept = [c for c in message.get("tool_calls") or [] if c["function"]["name"] not in reply.proxy_tools]
    message.pop("tool_calls", None)
    if kept:
        message["tool_calls"] = kept
    elif not message.get("content"):
        message["content"] = f"[context-proxy: the model was still calling proxy-owned tools after {rounds} rounds]"
    response = copy.deepcopy(answer.response)
    response["choices"][0]["message"] = {**response["choices"][0]["message"], **message}
    if not kept:
        response["choices"][0]["message"].pop("tool_calls", None)
    response["choices"][0]["finish_reason"] = "tool_calls" if kept else "stop"
    return Completion(response)


def _chat_form(body: Mapping[str, Any], sent: Candidate | None) -> dict[str, Any]:
    """The chat messages and tools a native call carries: the assembled ones, else the client's."""
    if sent is not None:
        return {"messages": sent.messages, "tools": sent.tools or []}
    return {"messages": body.get("messages") or [], "tools": body.get("tools") or []}


def build_llm_input(
    body: dict[str, Any],
    route: ModelRoute,
    candidate: Candidate | None,
    provider_fields: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The keyword arguments for ``litellm.acompletion``: the client's allow-listed fields (see
    ``proxy.kernel.client_params``), the arguments an ingress set itself (``provider_fields``), the assembled
    messages and tools when a candidate is sent, and the route's ``litellm_params`` last. Empty tool lists
    are omitted (OpenAI rejects ``tools: []``).
    """
    llm_input = client_arguments(body, route.allowed_client_params)
    llm_input.update(provider_fields or {})
    if candidate is not None:
        llm_input["messages"] = candidate.messages
        if candidate.tools:
            llm_input["tools"] = candidate.tools
        else:
            llm_input.pop("tools", None)
            llm_input.pop("tool_choice", None)
            llm_input.pop("parallel_tool_calls", None)
    messages = llm_input.get("messages")
    if isinstance(messages, list) and any(isinstance(m, dict) and NATIVE in m for m in messages):
        # A step a native call left (its provider-native parts) goes to a chat provider in its chat form only.
        llm_input["messages"] = [without_native(m) if isinstance(m, dict) else m for m in messages]
    if route.null_content_as_empty:
        llm_input["messages"] = _null_content_as_empty(llm_input.get("messages"))
    return with_route(llm_input, route.litellm_params)


def _null_content_as_empty(messages: Any) -> Any:
    """``messages`` with every assistant message's missing or null content sent as ``""`` (a route's
    ``null_content_as_empty``: chat templates that concatenate the content fail on null)."""
    if not isinstance(messages, list):
        return messages
    return [
        {**m, "content": ""} if isinstance(m, dict) and m.get("role") == "assistant" and m.get("content") is None else m
        for m in messages
    ]


def _estimated_size(llm_input: dict[str, Any], counts_output: bool, estimator: TokenEstimator) -> int:
    """What the provider was sent, in tokens estimated by ``estimator``; with the requested output when
    the provider said it counted that against the window."""
    size = sum(counts_of(estimator, [m for m in llm_input.get("messages") or [] if isinstance(m, dict)]))
    size += estimator.count_tools(llm_input.get("tools") or [])
    if counts_output:
        size += requested_output(llm_input)
    return size


def _client_tokens(body: Mapping[str, Any], estimator: TokenEstimator) -> int:
    """What the client's own request costs (estimated like ``estimatedTokens``): what a passthrough would
    send, so a report can set it against the candidate in every mode."""
    return _estimated_size({"messages": body.get("messages"), "tools": body.get("tools")}, False, estimator)
