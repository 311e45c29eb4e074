"""One client request, end to end: lock the session, reconcile, assemble, call the provider, trace.

The session's turn lock is held until the answer is complete, for a stream until its last chunk, so
two requests of one session never interleave their store updates.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from typing import Any

from proxy.config import ModelRoute, Settings
from proxy.errors import ContextOverflow, ProxyError, SessionConflict
from proxy.identity import SessionIdentity
from proxy.runtime.assembly import Assembler, Candidate, TurnRequest
from proxy.runtime.limits import ModelLimits, ModelMapLookup, resolve_limits
from proxy.runtime.provider import ProviderBackend
from proxy.runtime.trace import TraceWriter, redact_llm_input
from proxy.session.store import SessionBusy, SessionStore


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
    ) -> None:
        self.settings = settings
        self.store = store
        self.assembler = assembler
        self.backend = backend
        self.traces = traces
        self._model_map = model_map
        self._limits: dict[str, ModelLimits] = {}

    def limits_for(self, route: ModelRoute) -> ModelLimits:
        """The route's limits, resolved once, then corrected by what providers state in overflow errors."""
        limits = self._limits.get(route.model_name)
        if limits is None:
            limits = self._limits[route.model_name] = resolve_limits(self.settings, route, self._model_map)
        return limits

    def _remember_stated_limit(self, route: ModelRoute, stated: int | None) -> None:
        limits = self.limits_for(route)
        if stated is not None and stated < limits.model_max_tokens:
            self._limits[route.model_name] = limits.with_model_max(stated, source="provider_error")

    async def run(self, body: dict[str, Any], identity: SessionIdentity, route: ModelRoute) -> TurnResult:
        """Serve one validated request; the caller has already authorized and routed it."""
        stack = AsyncExitStack()
        try:
            await stack.enter_async_context(self.store.turn_lock(identity.context_id))
        except SessionBusy as exc:
            raise SessionConflict(str(exc)) from exc
        try:
            result = await self._run_locked(stack, body, identity, route)
        except BaseException:
            await stack.aclose()
            raise
        if result.chunks is None:
            await stack.aclose()  # a stream releases the lock when it ends
        return result

    async def _run_locked(
        self, stack: AsyncExitStack, body: dict[str, Any], identity: SessionIdentity, route: ModelRoute
    ) -> TurnResult:
        mode = self.settings.mode
        reconciliation = await self.store.reconcile(identity.context_id, identity.scope, body["messages"])
        turn = await self.store.next_turn(identity.context_id)
        request = TurnRequest(identity, mode, route, self.limits_for(route), body, reconciliation, turn)
        result = TurnResult(identity=identity, mode=mode)
        try:
            return await self._attempt(request, result, stack, recovery=0)
        except ContextOverflow as overflow:
            if mode != "dynamic":
                raise
            return await self._retry_after_overflow(request, result, stack, overflow)

    async def _retry_after_overflow(
        self, request: TurnRequest, result: TurnResult, stack: AsyncExitStack, overflow: ContextOverflow
    ) -> TurnResult:
        """Exactly one retry, after one forced pressure pass; a second overflow is surfaced, never looped."""
        self._remember_stated_limit(request.route, overflow.limit)
        forced = replace(request, limits=self.limits_for(request.route), forced=True, stated_limit=overflow.limit)
        try:
            return await self._attempt(forced, result, stack, recovery=1, reason=overflow.provider_message)
        except ContextOverflow as second:
            raise ContextOverflow(
                "The request still exceeds the model's context window after one forced compaction retry: "
                + (second.provider_message or second.message),
                limit=second.limit,
                provider_message=second.provider_message,
            ) from second

    async def _attempt(
        self, request: TurnRequest, result: TurnResult, stack: AsyncExitStack, recovery: int, reason: str = ""
    ) -> TurnResult:
        """Assemble (unless legacy), call the provider once, and trace this attempt."""
        mode = request.mode
        candidate = None if mode == "legacy" else await self.assembler.assemble(request)
        llm_input = build_llm_input(request.body, request.route, candidate if mode == "dynamic" else None)
        record = _trace_record(request, candidate, llm_input)
        if recovery:
            record["recovery"] = {"attempt": recovery, "reason": "provider_context_overflow", "providerMessage": reason}
        started = time.perf_counter()
        try:
            if request.body.get("stream"):
                chunks = await self.backend.stream(llm_input)
                result.chunks = self._finish_stream(chunks, stack, request, record, recovery)
            else:
                result.response = await self.backend.complete(llm_input)
        except ProxyError as exc:
            record["providerError"] = exc.body()["error"]
            self._write_trace(request, record, recovery)
            raise
        record["providerMs"] = round((time.perf_counter() - started) * 1000, 3)
        if result.chunks is None:
            self._write_trace(request, record, recovery)
        return result

    async def _finish_stream(
        self,
        chunks: AsyncIterator[dict[str, Any]],
        stack: AsyncExitStack,
        request: TurnRequest,
        record: dict[str, Any],
        recovery: int,
    ) -> AsyncIterator[dict[str, Any]]:
        """Relay the chunks; the lock is released and the trace written when the stream ends or is dropped."""
        try:
            async for chunk in chunks:
                yield chunk
        except ProxyError as exc:
            record["providerError"] = exc.body()["error"]
            raise
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
            self._write_trace(request, record, recovery)
            await stack.aclose()

    def _write_trace(self, request: TurnRequest, record: dict[str, Any], recovery: int) -> None:
        if self.traces is not None:
            self.traces.write(request.identity.context_id, request.turn, record, recovery=recovery)


def build_llm_input(body: dict[str, Any], route: ModelRoute, candidate: Candidate | None) -> dict[str, Any]:
    """The keyword arguments for ``litellm.acompletion``: the client's request, routed, with the assembled
    messages and tools when a candidate is sent. Empty tool lists are omitted (OpenAI rejects ``tools: []``).
    """
    llm_input = {key: value for key, value in body.items() if key != "model"}
    llm_input.update(route.litellm_params)
    if candidate is not None:
        llm_input["messages"] = candidate.messages
        if candidate.tools:
            llm_input["tools"] = candidate.tools
        else:
            llm_input.pop("tools", None)
            llm_input.pop("tool_choice", None)
            llm_input.pop("parallel_tool_calls", None)
    return llm_input


def _trace_record(request: TurnRequest, candidate: Candidate | None, llm_input: dict[str, Any]) -> dict[str, Any]:
    limits = request.limits
    return {
        "contextId": request.identity.context_id,
        "contextIdSource": request.identity.source,
        "turn": request.turn,
        "mode": request.mode,
        "scope": request.identity.scope,
        "model": request.route.model_name,
        "selectedPath": "legacy" if candidate is None else candidate.record.get("path", "dynamic"),
        "budgets": {
            "modelMaxTokens": limits.model_max_tokens,
            "outputReserveTokens": limits.output_reserve_tokens,
            "contextWindowTokens": limits.context_window_tokens,
            "effectiveInputTokens": limits.effective_input_tokens,
            "source": limits.source,
        },
        "session": {
            "headHash": request.reconciliation.head_hash,
            "knownMessages": request.reconciliation.known_count,
            "newMessages": len(request.reconciliation.new_messages),
            "forked": request.reconciliation.forked,
        },
        "renderedContext": None
        if candidate is None
        else {"messages": candidate.messages, "tools": candidate.tools, **candidate.record},
        "compaction": None,
        "llmInput": redact_llm_input(llm_input),
    }
