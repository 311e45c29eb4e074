"""The turn service: the one front door to a model call. ``run`` serves a client request end to end (lock
the branch, reconcile, assemble, call the provider, trace); ``compact`` writes the proxy's checkpoint of a
history on the client's request (Codex's remote compaction). Nothing else calls a model, writes a trace or
feeds the observers; what an ingress reads besides (a token count, issued checkpoints) it asks here too.

The turn lock of the request's branch (its history's head, see ``proxy/runtime/branch.py``) is held
until the answer is complete, for a stream until its last chunk, so two requests with the same
history never interleave their store updates, while runs that only open alike proceed in parallel.

The answer's two kinds and the ``TurnLock`` a live stream takes over live in
``proxy/runtime/answers.py``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from proxy.context.nonce import session_nonce
from proxy.kernel.config import Mode, ModelRoute, Settings
from proxy.kernel.errors import AssemblyFailed, ContextOverflow
from proxy.kernel.usage import PriceLookup, no_prices
from proxy.provider import call_tag
from proxy.provider.base import ProviderBackend
from proxy.provider.redaction import redact_llm_input
from proxy.runtime import issued_checkpoints
from proxy.runtime.answers import Answer, LiveStream, TurnLock, TurnResult
from proxy.runtime.assembly import Assembler, TurnRequest
from proxy.runtime.branch import BRANCH_TURNS, BranchTurn, branch_of, next_branch_turn
from proxy.runtime.calibration import TokenCalibrator
from proxy.runtime.calls import ModelCalls, Reply, without_proxy_calls
from proxy.runtime.issued_checkpoints import IssuedCheckpoint
from proxy.runtime.limits import ModelLimits, ModelMapLookup, RouteLimits
from proxy.runtime.native import NativeRequest
from proxy.runtime.observers import CallObserver, Observers
from proxy.runtime.remote_compaction import (
    CompactionRequest,
    CompactionResult,
    RemoteCompaction,
    summary_tokens,
    write_checkpoint,
)
from proxy.runtime.rounds import ChatRoundRelay
from proxy.runtime.session_identity import SessionIdentity
from proxy.runtime.trace import TraceWriter
from proxy.runtime.trace_record import CallRecord
from proxy.session.reconcile import ChainMemo, request_hashes
from proxy.session.store import SessionStore


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

    async def link_proxy_steps(
        self, request: TurnRequest, answer: dict[str, Any], stands_for: dict[str, Any] | None = None
    ) -> None:
        """Attach the request's steps to the branch continuing with ``answer`` (the message the client got).
        ``stands_for``: what the provider wrote last, when the client's message differs (a live stream's
        rounds relayed as one answer): the model sees that in its place."""


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
        prices: PriceLookup = no_prices,
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
        self._calls = ModelCalls(settings, assembler, backend, self.calibrator, self.observer, traces, prices)

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
        native: NativeRequest | None = None,
        provider_fields: Mapping[str, Any] | None = None,
    ) -> TurnResult:
        """Serve one validated request; the caller has already authorized and routed it. ``native``: the
        provider is sent the client's own API (``runtime/native.py``), in every mode; ``provider_fields``:
        litellm arguments an ingress sets itself (an Anthropic route spoken to in chat: ``thinking``...).

        ``ingress`` is what a non-chat ingress records about its translation (for the trace); ``digests``
        are the messages' exact digests when the edge computed them (``proxy/edge/known_messages.py``).
        """
        # Named once: the hashes key the branch's turn lock and go on to the store with the request.
        hashes = request_hashes(identity.context_id, body["messages"], self._branch_hashes, digests)
        async with TurnLock(self.store.turn_lock(identity.context_id, branch_of(hashes))) as lock:
            request = await self._first_request(
                body, identity, route, headers or {}, mode or self.settings.mode, ingress, hashes
            )
            if native is not None or provider_fields:
                request = replace(request, native=native, provider_fields=provider_fields or {})
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
            self._calls.record(record)
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
            tokens=self.calibrator.accounting_with(
                route, start.calibration, body["messages"], hashes, _client_tools(body)
            ),
            view=start.view,
        )

    async def _answer(self, request: TurnRequest) -> Answer:
        """Call the model until it answers without a proxy-owned tool (or the round limit is reached)."""
        rounds = 0
        while True:
            call_tag.begin_round(rounds)  # record and replay: which call this is (proxy/provider/call_tag.py)
            reply = await self._call(request)
            answer = reply.answer
            if isinstance(answer, LiveStream):
                if reply.proxy_tools and self.steps is not None:
                    return LiveStream(self._live_rounds(request, reply))
                return answer
            calls = reply.proxy_calls()
            offered = self.steps is not None  # proxy tools are only offered by an assembler that also runs them
            if calls and offered and rounds < self.settings.max_tool_rounds:
                rounds += 1
                request = await self._proxy_round(request, answer.message, calls, reply.visible_history, rounds)
                continue
            if calls:  # past the round limit: the client must never see a tool it does not know
                answer = without_proxy_calls(reply, rounds if offered else 1, request.native)
            if rounds:
                # The steps taken for this answer become part of the branch that continues with it.
                assert self.steps is not None  # rounds were run; here for the type checker
                await self.steps.link_proxy_steps(request, answer.message)
            return answer

    async def _proxy_round(
        self,
        request: TurnRequest,
        message: dict[str, Any],
        calls: list[dict[str, Any]],
        visible: tuple[dict[str, Any], ...],
        rounds: int,
    ) -> TurnRequest:
        """Run the model's proxy-owned calls and name the request of the round that follows."""
        assert self.steps is not None  # only called where proxy tools were offered
        await self.steps.run_proxy_step(request, message, calls, visible)
        self.observer.proxy_tool_calls(request, [call["function"]["name"] for call in calls])
        # Each proxy-owned round is a model call of its own: its own turn number and trace file.
        return replace(
            request,
            turn=await self.store.next_turn(request.identity.context_id),
            branch=await self._next_branch_turn(request),
            round=rounds,
            view=None,  # the round wrote to the store: the assembler reads it again
        )

    async def _live_rounds(self, request: TurnRequest, reply: Reply) -> AsyncIterator[dict[str, Any]]:
        """A stream that stays live while the proxy runs its own tools: each round relayed as it comes, one
        answer to the client (``proxy/runtime/rounds.py``). The steps are linked once the client has it all."""
        assert self.steps is not None  # only called where proxy tools were offered
        names = reply.proxy_tools
        relay = request.native.codec.round_relay(names) if request.native is not None else ChatRoundRelay(names)
        stream = reply.answer
        assert isinstance(stream, LiveStream)  # checked by the caller; here for the type checker
        rounds, dropped = 0, frozenset[str]()
        try:
            while True:
                async for event in stream:
                    for out in relay.feed(event):
                        yield out
                message = relay.round_message()
                calls = [c for c in message.get("tool_calls") or [] if c["function"]["name"] in names]
                if not calls:
                    break
                if relay.client_called or rounds >= self.settings.max_tool_rounds:
                    # A client call already went out (never taken back), or the round limit: the proxy's
                    # calls are left out of the answer.
                    dropped = names
                    break
                rounds += 1
                request = await self._proxy_round(request, message, calls, reply.visible_history, rounds)
                for out in relay.next_round():
                    yield out
                call_tag.begin_round(rounds)
                reply = await self._call(request)
                assert isinstance(reply.answer, LiveStream)  # the request streams: every round does
                stream = reply.answer
            for out in relay.close(dropped):
                yield out
        finally:
            await stream.aclose()
        if rounds:
            await self.steps.link_proxy_steps(request, relay.client_message(), relay.last_message())

    async def _next_branch_turn(self, request: TurnRequest) -> BranchTurn | None:
        if request.branch is None:
            return None
        head = request.reconciliation.head_hash
        return await next_branch_turn(self.store, request.identity.context_id, head, request.branch)

    async def _call(self, request: TurnRequest) -> Reply:
        """One model call; after a normalized overflow in dynamic mode, one forced retry."""
        try:
            return await self._calls.attempt(request, recovery=0)
        except ContextOverflow as overflow:
            if request.mode != "dynamic":
                raise
            return await self._retry_after_overflow(request, overflow)

    async def _retry_after_overflow(self, request: TurnRequest, overflow: ContextOverflow) -> Reply:
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
            return await self._calls.attempt(forced, recovery=1, reason=overflow.provider_message)
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


def _client_tools(body: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    """The request's own tools, for the turn's counter to know them by (``TurnEstimator.name_tools``)."""
    tools = body.get("tools")
    return tools if isinstance(tools, list) and all(type(tool) is dict for tool in tools) else ()
