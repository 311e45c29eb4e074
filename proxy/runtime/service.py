"""The turn service: the one front door to a model call. ``run`` serves a client request end to end (lock
the branch, reconcile, assemble, call the provider, trace); ``compact`` writes the proxy's checkpoint of a
history on the client's request (Codex's remote compaction). Nothing else calls a model, writes a trace or
feeds the observers; what an ingress reads besides (a token count, issued checkpoints) it asks here too.

The turn lock of the request's branch (its history's head, see ``proxy/runtime/branch.py``) is held
until the answer is complete, for a stream until its last chunk, so two requests with the same
history never interleave their store updates, while runs that only open alike proceed in parallel.

The answer's three kinds and the ``TurnLock`` a live stream takes over live in
``proxy/runtime/answers.py``.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from proxy.context.nonce import session_nonce
from proxy.context.turn_estimator import TurnEstimator, counts_of
from proxy.context.types import TokenEstimator
from proxy.kernel.client_params import client_arguments, with_route
from proxy.kernel.config import Mode, ModelRoute, Settings
from proxy.kernel.errors import AssemblyFailed, ContextOverflow, ProxyError
from proxy.provider import call_tag
from proxy.provider.base import ProviderBackend
from proxy.provider.chunks import synthesize
from proxy.provider.redaction import redact_llm_input
from proxy.runtime import issued_checkpoints
from proxy.runtime.answers import Answer, BufferedStream, Completion, LiveStream, TurnLock, TurnResult
from proxy.runtime.assembly import Assembler, Candidate, TurnRequest
from proxy.runtime.branch import BRANCH_TURNS, BranchTurn, branch_of, next_branch_turn
from proxy.runtime.calibration import TokenCalibrator, usage_of
from proxy.runtime.issued_checkpoints import IssuedCheckpoint
from proxy.runtime.limits import ModelLimits, ModelMapLookup, RouteLimits
from proxy.runtime.observers import CallObserver, Observers
from proxy.runtime.remote_compaction import (
    CompactionRequest,
    CompactionResult,
    RemoteCompaction,
    summary_tokens,
    write_checkpoint,
)
from proxy.runtime.session_identity import SessionIdentity
from proxy.runtime.trace import TraceWriter
from proxy.runtime.trace_record import CallRecord, trace_json
from proxy.session.reconcile import ChainMemo, request_hashes
from proxy.session.store import SessionStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Reply:
    """One model call's answer and what the model was offered and shown when it gave it."""

    answer: Answer
    proxy_tools: frozenset[str] = frozenset()  # proxy-owned tools the model was offered in this call
    visible_history: tuple[dict[str, Any], ...] = ()  # what the model saw when it made these calls

    def proxy_calls(self) -> list[dict[str, Any]]:
        """The calls of proxy-owned tools in this answer (none for a live stream: nothing was offered)."""
        if isinstance(self.answer, LiveStream) or not self.proxy_tools:
            return []
        calls = self.answer.message.get("tool_calls") or []
        return [c for c in calls if c["function"]["name"] in self.proxy_tools]


class ProxyStepRunner(Protocol):
    """Runs the model's proxy-owned tool calls and stores the step where later calls will see it."""

    async def run_proxy_step(
        self,
        request: TurnRequest,
        message: dict[str, Any],
        calls: list[dict[str, Any]],
        visible: tuple[dict[str, Any], ...],
    ) -> None:
        """Run ``calls`` (made in ``message`` by a model that saw ``visible``); store the step after the
        request's last message."""

    async def link_proxy_steps(self, request: TurnRequest, answer: dict[str, Any] | None) -> None:
        """Attach the request's steps to the branch continuing with ``answer`` (``None``: relayed live)."""


class TurnService:
    """Runs turns against one store, one assembler and one provider backend."""

    def __init__(
        self,
        settings: Settings,
        store: SessionStore,
        assembler: Assembler,
        backend: ProviderBackend,
        traces: TraceWriter | None,
        model_map: ModelMapLookup,
        steps: ProxyStepRunner | None = None,
        clock: Callable[[], float] = time.monotonic,
        framing_secret: bytes = b"",
        calibrator: TokenCalibrator | None = None,
        observer: CallObserver | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.assembler = assembler
        self.backend = backend
        self.traces = traces
        self.steps = steps
        self._limits = RouteLimits(settings, model_map, clock)
        self._branch_hashes = ChainMemo()
        self._framing_secret = framing_secret
        self.calibrator = calibrator or TokenCalibrator(settings, store)
        self.observer = observer or Observers(())  # metrics and spans (proxy/observe/): fed every model call

    def framing_nonce(self, context_id: str) -> str:
        """The session's framing nonce: what its hidden wrappers and checkpoint tags carry."""
        return session_nonce(self._framing_secret, context_id)

    def limits_for(self, route: ModelRoute) -> ModelLimits:
        """The route's limits, corrected for a while by believable overflow errors (see ``RouteLimits``)."""
        return self._limits.get(route)

    async def run(
        self,
        body: dict[str, Any],
        identity: SessionIdentity,
        route: ModelRoute,
        headers: Mapping[str, str] | None = None,
        mode: Mode | None = None,
        ingress: Mapping[str, Any] | None = None,
        digests: Sequence[bytes] | None = None,
    ) -> TurnResult:
        """Serve one validated request; the caller has already authorized and routed it.

        ``ingress`` is what a non-chat ingress records about its translation (for the trace); ``digests``
        are the messages' exact digests when the edge computed them (``proxy/edge/known_messages.py``).
        """
        # Named once: the hashes key the branch's turn lock and go on to the store with the request.
        hashes = request_hashes(identity.context_id, body["messages"], self._branch_hashes, digests)
        async with TurnLock(self.store.turn_lock(identity.context_id, branch_of(hashes))) as lock:
            request = await self._first_request(
                body, identity, route, headers or {}, mode or self.settings.mode, ingress, hashes
            )
            answer = await self._answer(request)
            answer.outlive(lock)  # what the answer still needs once the turn returns (a live stream: the lock)
            return TurnResult(identity, request.mode, answer, working=request)

    async def compact(self, request: CompactionRequest) -> CompactionResult:
        """Write the proxy's checkpoint of ``request.messages`` and issue the token that names it.

        Under the session's turn lock, like a turn: the history is reconciled, the summarizer writes the
        checkpoint (a deterministic one when it fails: the client cannot go on without one), and the call
        is traced and observed like every other model call (``CallRecord.compaction``).
        """
        identity, route = request.identity, request.route
        context_id = identity.context_id
        summary_route = self.settings.summary_route(route)
        limits = self.limits_for(route)
        budget = max(256, limits.effective_input_tokens // 10)
        nonce = self.framing_nonce(context_id)
        began = time.time_ns()
        async with TurnLock(self.store.turn_lock(context_id)):
            reconciled = await self.store.reconcile(context_id, identity.scope, request.messages)
            input_limit = self.limits_for(summary_route).effective_input_tokens - budget
            outcome = await write_checkpoint(
                self.backend,
                summary_route,
                request.messages,
                request.previous,
                reconciled.head_hash,
                budget,
                nonce,
                input_limit,
                attempts=self.settings.summary_max_attempts,
            )
            token = await issued_checkpoints.issue(self.store, context_id, outcome.checkpoint)
            turn = await self.store.next_turn(context_id) if self.traces is not None else 0
            message = outcome.checkpoint.message(nonce)
            compaction = RemoteCompaction(
                outcome,
                request.kind,
                summary_route.model_name,
                tokens_before=summary_tokens(request.messages),
                checkpoint_tokens=summary_tokens([message]),
            )
            turn_request = TurnRequest(
                identity,
                "dynamic",
                route,
                limits,
                {"messages": request.messages},
                request.headers,
                reconciled,
                turn,
                ingress={"api": "responses", "request": request.kind},
            )
            if outcome.calls:
                llm_input = dict(outcome.calls[-1]["llmInput"])
            else:  # nothing was sent; the request that would have been
                llm_input = redact_llm_input({**summary_route.litellm_params, "messages": outcome.summary_request})
            record = CallRecord(turn_request, None, llm_input, compaction.tokens_before, compaction=compaction)
            record.started_ns = began
            self._write_trace(record)
        return CompactionResult(token, len(message["content"]) // 4)

    async def issued_checkpoints(self, tokens: Sequence[str]) -> dict[str, IssuedCheckpoint]:
        """The checkpoints this proxy issued among ``tokens`` (in order), each with the message that stands
        in its place in the client's history; tokens it did not issue are left out."""
        found: dict[str, IssuedCheckpoint] = {}
        for token in tokens:
            checkpoint = await issued_checkpoints.issued(self.store, token)
            if checkpoint is not None:
                nonce = self.framing_nonce(issued_checkpoints.token_context(token))
                found[token] = IssuedCheckpoint(checkpoint, checkpoint.message(nonce))
        return found

    async def record_answer(self, identity: SessionIdentity, chain: Sequence[Mapping[str, Any]]) -> str:
        """Store ``chain`` (a request's messages and the answer it got) under the session's lock; returns its
        head hash (a stored response names it, so ``previous_response_id`` continues exactly that chain)."""
        async with TurnLock(self.store.turn_lock(identity.context_id)):
            reconciled = await self.store.reconcile(identity.context_id, identity.scope, chain)
        return reconciled.head_hash

    async def count_tokens(
        self, route: ModelRoute, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
    ) -> int:
        """The route's estimate of ``messages`` and ``tools``: the estimator the assembly budgets with (the
        route's calibrated one by default), so a client that plans with it agrees with the proxy's pressure."""
        estimator = (await self.calibrator.accounting(route)).estimator
        return sum(estimator.count_message(message) for message in messages) + estimator.count_tools(tools)

    async def _first_request(
        self,
        body: dict[str, Any],
        identity: SessionIdentity,
        route: ModelRoute,
        headers: Mapping[str, str],
        mode: Mode,
        ingress: Mapping[str, Any] | None,
        hashes: Sequence[str],
    ) -> TurnRequest:
        """Store what is new in the request and number its first model call."""
        limits = self.limits_for(route)  # first: a window the output reserve fills is refused before any write
        # One store round trip: reconcile, number the call (on its branch too, when traced), and read what
        # the assembler and the token accounting need. The branch's turn lock is already held.
        start = await self.store.begin_turn(
            identity.context_id,
            identity.scope,
            body["messages"],
            () if mode == "legacy" else self.assembler.channels,
            branch_counter=BRANCH_TURNS if self.traces is not None else None,
            calibration=self.calibrator.stored_key(route),
            chain_hashes=hashes,
            # What earlier answers taught, written first (a failed begin_turn loses them: a lost sample
            # costs nothing, and one that broke the write must not break the next turn too).
            calibration_updates=self.calibrator.take_pending(),
        )
        return TurnRequest(
            identity,
            mode,
            route,
            limits,
            body,
            headers,
            start.reconciliation,
            start.turn,
            branch=None if start.branch is None else BranchTurn(start.branch.number, start.branch.parent),
            ingress=ingress,
            tokens=self.calibrator.accounting_with(route, start.calibration, body["messages"], hashes),
            view=start.view,
        )

    async def _answer(self, request: TurnRequest) -> Answer:
        """Call the model until it answers without a proxy-owned tool (or the round limit is reached)."""
        rounds = 0
        while True:
            call_tag.begin_round(rounds)  # record and replay: which call this is (proxy/provider/call_tag.py)
            reply = await self._call(request)
            answer, calls = reply.answer, reply.proxy_calls()
            offered = self.steps is not None  # proxy tools are only offered by an assembler that also runs them
            if calls and offered and rounds < self.settings.max_tool_rounds and not isinstance(answer, LiveStream):
                assert self.steps is not None  # ``offered``; here for the type checker
                rounds += 1
                await self.steps.run_proxy_step(request, answer.message, calls, reply.visible_history)
                self.observer.proxy_tool_calls(request, [call["function"]["name"] for call in calls])
                # Each proxy-owned round is a model call of its own: its own turn number and trace file.
                request = replace(
                    request,
                    turn=await self.store.next_turn(request.identity.context_id),
                    branch=await self._next_branch_turn(request),
                    round=rounds,
                    view=None,  # the round wrote to the store: the assembler reads it again
                )
                continue
            if calls:  # past the round limit: the client must never see a tool it does not know
                answer = _without_proxy_calls(reply, rounds if offered else 1)
            if rounds:
                # The steps taken for this answer become part of the branch that continues with it.
                await self._link_steps(request, answer)
            return answer

    async def _link_steps(self, request: TurnRequest, answer: Answer) -> None:
        assert self.steps is not None  # checked by the caller; here for the type checker
        try:
            await self.steps.link_proxy_steps(request, None if isinstance(answer, LiveStream) else answer.message)
        except BaseException:
            if isinstance(answer, LiveStream):
                await answer.aclose()  # not handed to anyone: close the provider call and write its trace
            raise

    async def _next_branch_turn(self, request: TurnRequest) -> BranchTurn | None:
        if request.branch is None:
            return None
        head = request.reconciliation.head_hash
        return await next_branch_turn(self.store, request.identity.context_id, head, request.branch)

    async def _call(self, request: TurnRequest) -> _Reply:
        """One model call; after a normalized overflow in dynamic mode, one forced retry."""
        try:
            return await self._attempt(request, recovery=0)
        except ContextOverflow as overflow:
            if request.mode != "dynamic":
                raise
            return await self._retry_after_overflow(request, overflow)

    async def _retry_after_overflow(self, request: TurnRequest, overflow: ContextOverflow) -> _Reply:
        """Exactly one retry, after one forced pressure pass; a second overflow is surfaced, never looped."""
        self._limits.learn(request.route, overflow.limit, overflow.sent_tokens)
        limits = self.limits_for(request.route)
        if overflow.limit is not None and overflow.limit < limits.model_max_tokens:
            # This request's own retry takes the statement as it is (it can only hurt this request);
            # what other requests keep of it is RouteLimits' decision above.
            limits = limits.with_model_max(overflow.limit, source="provider_error")
        # view=None: the first attempt may have written (a checkpoint, previews), so the retry reads again.
        forced = replace(request, limits=limits, forced=True, stated_limit=overflow.limit, view=None)
        try:
            return await self._attempt(forced, recovery=1, reason=overflow.provider_message)
        except ContextOverflow as second:
            raise ContextOverflow(
                "The request still exceeds the model's context window after one forced compaction retry: "
                + (second.provider_message or second.message),
                limit=second.limit,
                provider_message=second.provider_message,
            ) from second
        except AssemblyFailed as failed:
            # The minimum does not fit the window the provider stated: still an overflow to the client
            # (so SDKs and agents that handle overflow recognize it), not a bad request of its own.
            raise ContextOverflow(
                "The request exceeds the model's context window and even the forced compaction retry cannot "
                f"fit it: {failed.message}",
                limit=overflow.limit,
                provider_message=overflow.provider_message,
            ) from failed

    async def _attempt(self, request: TurnRequest, recovery: int, reason: str = "") -> _Reply:
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
        llm_input = build_llm_input(request.body, request.route, sent)
        # The usage of a streamed answer is the calibration's only source for it: in dynamic mode the
        # proxy asks for it and keeps it from a client that did not (shadow and legacy send what the
        # client sent, so they learn only when the client asked).
        strip_usage = sent is not None and bool(request.body.get("stream")) and not _asks_usage(llm_input)
        if strip_usage:
            llm_input["stream_options"] = {**(llm_input.get("stream_options") or {}), "include_usage": True}
        if request.mode == "shadow" and candidate is not None:  # record and replay compare shadow candidates
            call_tag.offer_shadow_candidate(lambda: build_llm_input(request.body, request.route, candidate))
        record = CallRecord(
            request,
            candidate,
            llm_input,
            _client_tokens(request.body, self._sizes(request)),
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
                await self.calibrator.observe(request.route, llm_input, record.usage, _counter(request))
                answer = Completion(response)
            elif proxy_tools:
                buffered = [chunk async for chunk in await self.backend.stream(llm_input)]
                record.usage = usage_of(buffered)
                await self.calibrator.observe(request.route, llm_input, record.usage, _counter(request))
                answer = BufferedStream([kept for c in buffered if (kept := _client_chunk(c, strip_usage)) is not None])
            else:
                chunks = await self.backend.stream(llm_input)
                answer, live = LiveStream(self._finish_stream(chunks, record, strip_usage)), True
            return _Reply(answer, proxy_tools, visible)
        except ProxyError as exc:
            record.provider_error = exc.body()["error"]
            record.provider_status = exc.status
            if isinstance(exc, ContextOverflow):
                # Counted as the assembly counted it (the route's calibrated estimator), so RouteLimits
                # judges the provider's statement against the same figure the window was filled by.
                exc.sent_tokens = _estimated_size(llm_input, exc.counts_output, self._sizes(request))
            raise
        finally:
            record.provider_ms = round((time.perf_counter() - started) * 1000, 3)
            if not live:
                self._write_trace(record)

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
                _client_tokens(request.body, self._sizes(request)),
                recovery,
                reason,
                assembly_error=exc,
            )
            failed.started_ns = began
            self._write_trace(failed)
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
            record.usage = usage
            await self.calibrator.observe(record.request.route, record.llm_input, usage, _counter(record.request))
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
                self._write_trace(record)

    def _sizes(self, request: TurnRequest) -> TokenEstimator:
        """The counter of what a call sends (the trace's ``clientTokens``, an overflow's size): the turn's
        own estimator (calibrated by default), as the candidate is counted, so the report compares like
        with like; its memo already knows the client's messages by chain hash and what the assembly counted."""
        counter = _counter(request)
        if counter is None:
            counter = TurnEstimator(self.calibrator.conservative)
            counter.name_messages(*_named(request))
        return counter

    def _write_trace(self, record: CallRecord) -> None:
        self.observer.model_call(record)  # the one observation point of a model call, traces on or off
        if self.traces is not None:
            request = record.request
            self.traces.write(request.identity.context_id, request.turn, trace_json(record), recovery=record.recovery)


def _named(request: TurnRequest) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The client's messages and their chain hashes."""
    return request.body["messages"], request.reconciliation.chain_hashes


def _counter(request: TurnRequest) -> TurnEstimator | None:
    """The turn's own counter (``TokenAccounting.estimator``), when the request has its accounting."""
    return request.tokens.estimator if request.tokens is not None else None


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


def _without_proxy_calls(reply: _Reply, rounds: int) -> Answer:
    """The answer with its proxy-owned calls removed: the client must never see a tool it does not know."""
    answer = reply.answer
    assert not isinstance(answer, LiveStream)  # a live stream offered no proxy tool, so it has no such call
    message = answer.message
    kept = [c for c in message.get("tool_calls") or [] if c["function"]["name"] not in reply.proxy_tools]
    message.pop("tool_calls", None)
    if kept:
        message["tool_calls"] = kept
    elif not message.get("content"):
        message["content"] = f"[context-proxy: the model was still calling proxy-owned tools after {rounds} rounds]"
    if isinstance(answer, Completion):
        response = copy.deepcopy(answer.response)
        response["choices"][0]["message"] = {**response["choices"][0]["message"], **message}
        if not kept:
            response["choices"][0]["message"].pop("tool_calls", None)
        response["choices"][0]["finish_reason"] = "tool_calls" if kept else "stop"
        return Completion(response)
    return BufferedStream(synthesize(answer.chunks, message))


def build_llm_input(body: dict[str, Any], route: ModelRoute, candidate: Candidate | None) -> dict[str, Any]:
    """The keyword arguments for ``litellm.acompletion``: the client's allow-listed fields (see
    ``proxy.kernel.client_params``), the assembled messages and tools when a candidate is sent, and the route's
    ``litellm_params`` last. Empty tool lists are omitted (OpenAI rejects ``tools: []``).
    """
    llm_input = client_arguments(body, route.allowed_client_params)
    if candidate is not None:
        llm_input["messages"] = candidate.messages
        if candidate.tools:
            llm_input["tools"] = candidate.tools
        else:
            llm_input.pop("tools", None)
            llm_input.pop("tool_choice", None)
            llm_input.pop("parallel_tool_calls", None)
    return with_route(llm_input, route.litellm_params)


def _estimated_size(llm_input: dict[str, Any], counts_output: bool, estimator: TokenEstimator) -> int:
    """What the provider was sent, in tokens estimated by ``estimator``; with the requested output when
    the provider said it counted that against the window."""
    size = sum(counts_of(estimator, [m for m in llm_input.get("messages") or [] if isinstance(m, dict)]))
    size += estimator.count_tools(llm_input.get("tools") or [])
    if counts_output:
        requested = llm_input.get("max_completion_tokens") or llm_input.get("max_tokens")
        size += requested if isinstance(requested, int) else 0
    return size


def _client_tokens(body: Mapping[str, Any], estimator: TokenEstimator) -> int:
    """What the client's own request costs (estimated like ``estimatedTokens``): what a passthrough would
    send, so a report can set it against the candidate in every mode."""
    return _estimated_size({"messages": body.get("messages"), "tools": body.get("tools")}, False, estimator)
