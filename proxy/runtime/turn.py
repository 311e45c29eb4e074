"""One client request, end to end: lock the branch, reconcile, assemble, call the provider, trace.

The turn lock of the request's branch (its history's head, see ``proxy/runtime/branch.py``) is held
until the answer is complete, for a stream until its last chunk, so two requests with the same
history never interleave their store updates, while runs that only open alike proceed in parallel.
"""

from __future__ import annotations

import copy
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from typing import Any, Protocol

from proxy.client_params import client_arguments, with_route
from proxy.config import Mode, ModelRoute, Settings
from proxy.context.estimators import ConservativeTokenEstimator
from proxy.context.nonce import session_nonce
from proxy.errors import AssemblyFailed, ContextOverflow, ProxyError, SessionConflict
from proxy.identity import SessionIdentity
from proxy.runtime.assembly import Assembler, Candidate, TurnRequest
from proxy.runtime.branch import BranchTurn, branch_of, first_branch_turn, next_branch_turn
from proxy.runtime.limits import ModelLimits, ModelMapLookup, RouteLimits
from proxy.runtime.provider import ProviderBackend
from proxy.runtime.stream_buffer import accumulate, synthesize
from proxy.runtime.trace import TraceWriter
from proxy.runtime.trace_record import CallRecord, trace_json
from proxy.session.reconcile import ChainMemo
from proxy.session.store import Reconciliation, SessionBusy, SessionStore


@dataclass
class TurnResult:
    """A finished non-streaming answer, or an open stream of chunks, with the context headers."""

    identity: SessionIdentity
    mode: str
    response: dict[str, Any] | None = None
    chunks: AsyncIterator[dict[str, Any]] | None = None

    @property
    def headers(self) -> dict[str, str]:
        """``x-context-id`` and ``x-context-mode``, sent with every answer."""
        return {"x-context-id": self.identity.context_id, "x-context-mode": self.mode}


@dataclass
class _Answer:
    """One model call's answer: whole (a response, or a stream read to its end) or a live stream."""

    proxy_tools: frozenset[str]  # proxy-owned tools the model was offered in this call
    visible_history: tuple[dict[str, Any], ...] = ()  # what the model saw when it made these calls
    response: dict[str, Any] | None = None
    buffered: list[dict[str, Any]] | None = None
    live: AsyncIterator[dict[str, Any]] | None = None

    @property
    def message(self) -> dict[str, Any]:
        if self.response is not None:
            return dict(self.response["choices"][0]["message"])
        return accumulate(self.buffered or [])

    def proxy_calls(self) -> list[dict[str, Any]]:
        """The calls of proxy-owned tools in this answer (none for a live stream: nothing was offered)."""
        if self.live is not None or not self.proxy_tools:
            return []
        return [c for c in self.message.get("tool_calls") or [] if c["function"]["name"] in self.proxy_tools]


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


class TurnRunner:
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
    ) -> TurnResult:
        """Serve one validated request; the caller has already authorized and routed it.

        The session lock is released here, whatever happens, unless a live stream took it over: that
        stream then owns it and releases it when it ends, fails or is closed (``_LiveStream``).

        ``ingress`` is what a non-chat ingress records about its translation (for the trace).
        """
        stack = AsyncExitStack()
        branch = branch_of(self._branch_hashes, identity.context_id, body["messages"])
        try:
            await stack.enter_async_context(self.store.turn_lock(identity.context_id, branch))
        except SessionBusy as exc:
            raise SessionConflict(str(exc)) from exc
        handed_over = False
        try:
            result = await self._run_locked(
                stack, body, identity, route, headers or {}, mode or self.settings.mode, ingress
            )
            handed_over = isinstance(result.chunks, _LiveStream)
            return result
        finally:
            if not handed_over:
                await stack.aclose()

    async def _run_locked(
        self,
        stack: AsyncExitStack,
        body: dict[str, Any],
        identity: SessionIdentity,
        route: ModelRoute,
        headers: Mapping[str, str],
        mode: Mode,
        ingress: Mapping[str, Any] | None = None,
    ) -> TurnResult:
        reconciliation = await self.store.reconcile(identity.context_id, identity.scope, body["messages"])
        turn = await self.store.next_turn(identity.context_id)
        limits = self.limits_for(route)
        branch = await self._first_branch_turn(reconciliation)
        request = TurnRequest(
            identity, mode, route, limits, body, headers, reconciliation, turn, branch=branch, ingress=ingress
        )
        result = TurnResult(identity=identity, mode=mode)
        rounds = 0
        while True:
            answer = await self._call(request, stack)
            calls = answer.proxy_calls()
            if not calls:
                return await self._deliver_after_rounds(result, answer, request, rounds)
            if rounds >= self.settings.max_tool_rounds:
                answer = _without_proxy_calls(answer, self.settings.max_tool_rounds)
                return await self._deliver_after_rounds(result, answer, request, rounds)
            rounds += 1
            if self.steps is None:  # proxy tools are only offered by an assembler that also runs them
                return _deliver(result, _without_proxy_calls(answer, rounds))
            await self.steps.run_proxy_step(request, answer.message, calls, answer.visible_history)
            # Each proxy-owned round is a model call of its own: its own turn number and trace file.
            request = replace(
                request,
                turn=await self.store.next_turn(identity.context_id),
                branch=await self._next_branch_turn(request),
            )

    async def _deliver_after_rounds(
        self, result: TurnResult, answer: _Answer, request: TurnRequest, rounds: int
    ) -> TurnResult:
        """The answer, once the proxy steps taken for it are linked to it (later turns of its branch see them)."""
        if rounds and self.steps is not None:
            await self.steps.link_proxy_steps(request, answer.message if answer.live is None else None)
        return _deliver(result, answer)

    async def _first_branch_turn(self, reconciliation: Reconciliation) -> BranchTurn | None:
        """This request's place on its branch, for the trace (not counted when traces are off)."""
        if self.traces is None:
            return None
        return await first_branch_turn(self.store, reconciliation.context_id, reconciliation.chain_hashes)

    async def _next_branch_turn(self, request: TurnRequest) -> BranchTurn | None:
        if request.branch is None:
            return None
        head = request.reconciliation.head_hash
        return await next_branch_turn(self.store, request.identity.context_id, head, request.branch)

    async def _call(self, request: TurnRequest, stack: AsyncExitStack) -> _Answer:
        """One model call; after a normalized overflow in dynamic mode, one forced retry."""
        try:
            return await self._attempt(request, stack, recovery=0)
        except ContextOverflow as overflow:
            if request.mode != "dynamic":
                raise
            return await self._retry_after_overflow(request, stack, overflow)

    async def _retry_after_overflow(
        self, request: TurnRequest, stack: AsyncExitStack, overflow: ContextOverflow
    ) -> _Answer:
        """Exactly one retry, after one forced pressure pass; a second overflow is surfaced, never looped."""
        self._limits.learn(request.route, overflow.limit, overflow.sent_tokens)
        limits = self.limits_for(request.route)
        if overflow.limit is not None and overflow.limit < limits.model_max_tokens:
            # This request's own retry takes the statement as it is (it can only hurt this request);
            # what other requests keep of it is RouteLimits' decision above.
            limits = limits.with_model_max(overflow.limit, source="provider_error")
        forced = replace(request, limits=limits, forced=True, stated_limit=overflow.limit)
        try:
            return await self._attempt(forced, stack, recovery=1, reason=overflow.provider_message)
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

    async def _attempt(self, request: TurnRequest, stack: AsyncExitStack, recovery: int, reason: str = "") -> _Answer:
        """Assemble (unless legacy), call the provider once, and trace this attempt."""
        mode = request.mode
        candidate = None if mode == "legacy" else await self.assembler.assemble(request)
        sent = candidate if mode == "dynamic" else None
        llm_input = build_llm_input(request.body, request.route, sent)
        record = CallRecord(request, candidate, llm_input, recovery, reason)
        answer = _Answer(
            proxy_tools=sent.proxy_tools if sent is not None else frozenset(),
            visible_history=sent.visible_history if sent is not None else (),
        )
        started = time.perf_counter()
        try:
            if not request.body.get("stream"):
                answer.response = await self.backend.complete(llm_input)
            elif answer.proxy_tools:
                answer.buffered = [chunk async for chunk in await self.backend.stream(llm_input)]
            else:
                chunks = await self.backend.stream(llm_input)
                answer.live = _LiveStream(self._finish_stream(chunks, request, record, recovery), stack)
                return answer  # its trace is written when the stream ends
        except ProxyError as exc:
            record.provider_error = exc.body()["error"]
            if isinstance(exc, ContextOverflow):
                exc.sent_tokens = _estimated_size(llm_input, exc.counts_output)
            raise
        finally:
            record.provider_ms = round((time.perf_counter() - started) * 1000, 3)
            if answer.live is None:
                self._write_trace(request, record, recovery)
        return answer

    async def _finish_stream(
        self,
        chunks: AsyncIterator[dict[str, Any]],
        request: TurnRequest,
        record: CallRecord,
        recovery: int,
    ) -> AsyncIterator[dict[str, Any]]:
        """Relay the chunks; the trace is written when the stream ends, fails or is dropped."""
        try:
            async for chunk in chunks:
                yield chunk
        except ProxyError as exc:
            record.provider_error = exc.body()["error"]
            raise
        finally:
            try:
                aclose = getattr(chunks, "aclose", None)
                if aclose is not None:
                    await aclose()
            finally:
                self._write_trace(request, record, recovery)

    def _write_trace(self, request: TurnRequest, record: CallRecord, recovery: int) -> None:
        if self.traces is not None:
            self.traces.write(request.identity.context_id, request.turn, trace_json(record), recovery=recovery)


class _LiveStream(AsyncIterator[dict[str, Any]]):
    """The one kind of answer that still holds the session lock while the client reads it.

    It owns the lock (``stack``): the lock is released when the stream ends, when reading it fails
    for any reason (a cancellation included), and when it is closed unread.
    """

    def __init__(self, chunks: AsyncIterator[dict[str, Any]], stack: AsyncExitStack) -> None:
        self._chunks = chunks
        self._stack = stack

    async def __anext__(self) -> dict[str, Any]:
        try:
            return await self._chunks.__anext__()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Close the relay (the provider call, the trace), then release the lock; safe to call twice."""
        try:
            aclose = getattr(self._chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            await self._stack.aclose()


def _deliver(result: TurnResult, answer: _Answer) -> TurnResult:
    if answer.response is not None:
        result.response = answer.response
    elif answer.buffered is not None:
        result.chunks = _replay(answer.buffered)
    else:
        result.chunks = answer.live
    return result


async def _replay(chunks: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for chunk in chunks:
        yield chunk


def _without_proxy_calls(answer: _Answer, rounds: int) -> _Answer:
    """The answer with its proxy-owned calls removed: the client must never see a tool it does not know."""
    message = answer.message
    kept = [c for c in message.get("tool_calls") or [] if c["function"]["name"] not in answer.proxy_tools]
    message.pop("tool_calls", None)
    if kept:
        message["tool_calls"] = kept
    elif not message.get("content"):
        message["content"] = f"[context-proxy: the model was still calling proxy-owned tools after {rounds} rounds]"
    if answer.response is not None:
        response = copy.deepcopy(answer.response)
        response["choices"][0]["message"] = {**response["choices"][0]["message"], **message}
        if not kept:
            response["choices"][0]["message"].pop("tool_calls", None)
        response["choices"][0]["finish_reason"] = "tool_calls" if kept else "stop"
        return _Answer(answer.proxy_tools, response=response)
    return _Answer(answer.proxy_tools, buffered=synthesize(answer.buffered or [], message))


def build_llm_input(body: dict[str, Any], route: ModelRoute, candidate: Candidate | None) -> dict[str, Any]:
    """The keyword arguments for ``litellm.acompletion``: the client's allow-listed fields (see
    ``proxy.client_params``), the assembled messages and tools when a candidate is sent, and the route's
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


def _estimated_size(llm_input: dict[str, Any], counts_output: bool) -> int:
    """What the provider was sent, in (conservatively estimated) tokens; with the requested output
    when the provider said it counted that against the window."""
    estimator = ConservativeTokenEstimator()
    size = sum(estimator.count_message(m) for m in llm_input.get("messages") or [] if isinstance(m, dict))
    size += estimator.count_tools(llm_input.get("tools") or [])
    if counts_output:
        requested = llm_input.get("max_completion_tokens") or llm_input.get("max_tokens")
        size += requested if isinstance(requested, int) else 0
    return size
