"""The runtime's ``Assembler`` for dynamic and shadow modes: loads the session, runs the pipeline,
persists what the pipeline decided (a new checkpoint, which bodies are previewed).

Proxy-owned tool steps are not in the client's history (the client never saw them); they are stored
under a key of their own request and put back in place here, so the model keeps seeing them. A later
request finds them through the answer they led to: when the request ends, the branch state at the
chain hash of (its head, the answer the client got) links its head to its steps. Two identical
requests (two pass@k runs' first turns) therefore never replay each other's steps, unless the model
also answered both identically, when the two runs are the same history from then on. An answer
relayed live (``proxy/runtime/rounds.py``) is linked once the client has it all; the client holds every
round's text in one message, so the provider's own last round stands in its place for the model.

What the pipeline decided (which bodies are previewed, when summarizing may be tried again, where
proxy steps were taken) is branch state: written at the request's head and read from the nearest
prefix of the request's own chain that has it. Runs that open alike (one fingerprint, many branches)
each see their own decisions, and a client that rewinds sees the state as of the point it rewound to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from proxy.context.checkpoint import Checkpoint, is_checkpoint_message
from proxy.context.nonce import session_nonce
from proxy.context.pipeline import AssemblyInput, ContextPipeline
from proxy.context.previews import READ_TOOL_OUTPUT, is_preview
from proxy.context.state import RunStateMemo, StateConfig
from proxy.context.types import ToolContext, tool_name
from proxy.kernel.canonical import HistoryEntry, chain_hash, content_text
from proxy.kernel.config import ModelRoute, Settings
from proxy.kernel.native import NATIVE
from proxy.provider.base import ProviderBackend
from proxy.provider.redaction import without_credentials
from proxy.runtime.assembly import Candidate, CandidateRecord, SummaryBackoff, TurnRequest
from proxy.runtime.proxy_tools import ProxyToolbox, StoreToolSession
from proxy.runtime.summarizer import ModelSummarizer
from proxy.session.store import BranchView, SessionStore, tool_output_ref

PREVIEWED_REFS = "compaction.previewed_refs"
INTERNAL_ANCHORS = "internal_steps.anchors"  # {chain hash a step followed: its steps' key}
INTERNAL_ANSWERS = "internal_steps.answers"  # {chain hash of a client's answer: the provider's last round}
SUMMARY_RETRY_AFTER = "compaction.summary_retry_after"
# After a summarization fails (the model errs or writes an unusable checkpoint), the deterministic
# trimming stands and summarizing is not tried again until the history has grown this much
# (SCIENCE_AGENT_SUMMARY_RETRY_AFTER_MESSAGES): otherwise every later turn would pay for the same failing model call.
# What ``assemble`` reads of the branch state. Values earlier releases kept session-wide (chain hash "")
# are read as the root of every chain (the store's ``branch_view``).
_CHANNELS = (PREVIEWED_REFS, SUMMARY_RETRY_AFTER, INTERNAL_ANCHORS, INTERNAL_ANSWERS)
# The result a client's call gets when it came in one answer with proxy-owned calls (a reasoning answer).
NOT_RUN = "Not run: the proxy ran your other calls in this answer first. Call {name} again if you still need it."


class SessionAssembler:
    """Assembles a turn's model input from the store through the context pipeline."""

    def __init__(
        self,
        settings: Settings,
        store: SessionStore,
        pipeline: ContextPipeline,
        toolbox: ProxyToolbox,
        backend: ProviderBackend,
        summary_route: Callable[[ModelRoute], ModelRoute],
        state_config: StateConfig,
        framing_secret: bytes,
    ) -> None:
        self._settings = settings
        self._store = store
        self._pipeline = pipeline
        self._toolbox = toolbox
        self._backend = backend
        self._summary_route = summary_route
        self._run_states = RunStateMemo(state_config)  # a resent history's calls are folded once
        self._framing_secret = framing_secret

    @property
    def channels(self) -> Sequence[str]:
        """The branch state ``assemble`` reads (``TurnRequest.view``)."""
        return _CHANNELS

    async def assemble(self, request: TurnRequest) -> Candidate:
        """The assembled candidate for this turn; also persists checkpoints and previewed references."""
        context_id = request.identity.context_id
        view = await self._view(request)
        history = await self.history(request, view)
        context = self._tool_context(request, history)
        proxy_tools = self._toolbox.offered(context)
        withheld = self._toolbox.withheld(context)
        tools = [dict(tool) for tool in context.client_tools if tool_name(tool) not in withheld]
        tools += [dict(tool.schema) for tool in proxy_tools]
        checkpoints, unreadable = _readable_checkpoints(view.checkpoints)
        previewed = view.value(PREVIEWED_REFS) or []
        limits = request.limits
        retry_after = view.value(SUMMARY_RETRY_AFTER)
        may_summarize = request.forced or retry_after is None or len(history) >= retry_after
        summarizer = ModelSummarizer(self._backend, self._summary_route(request.route))
        nonce = session_nonce(self._framing_secret, context_id)
        output = await self._pipeline.assemble(
            AssemblyInput(
                scope=request.identity.scope,
                context_id=context_id,
                model=request.route.model_name,
                turn=request.turn,
                history=history,
                tools=tools,
                reader=self._toolbox.session_name(READ_TOOL_OUTPUT, context.client_tools) or READ_TOOL_OUTPUT,
                limit=limits.effective_input_tokens,
                nonce=nonce,
                metadata=_mapping(request.body.get("metadata")),
                headers=without_credentials(request.headers),
                state=context.state,
                checkpoints=checkpoints,
                previewed_refs=list(previewed),
                forced=request.forced,
                stated_limit=request.stated_limit,
                output_reserve=limits.output_reserve_tokens,
                window=limits.window_tokens,
                estimator=request.tokens.estimator if request.tokens is not None else None,
            ),
            summarizer if may_summarize else None,
        )
        summary_failed = bool(summarizer.calls) and output.new_checkpoint is None
        if summary_failed or (retry_after is not None and output.new_checkpoint is not None):
            next_try = len(history) + self._settings.summary_retry_after_messages if summary_failed else None
            await self._store.put_state(context_id, _head(request), SUMMARY_RETRY_AFTER, next_try)
        if output.new_checkpoint is not None:
            checkpoint = output.new_checkpoint
            await self._store.put_checkpoint(context_id, checkpoint.covers_hash, checkpoint.to_record())
        if list(output.previewed_refs) != list(previewed):
            await self._store.put_state(context_id, _head(request), PREVIEWED_REFS, list(output.previewed_refs))
        record = CandidateRecord(
            pipeline=output.record,
            summarizer_calls=tuple(summarizer.calls),
            summary_backoff=None if may_summarize or retry_after is None else SummaryBackoff(retry_after, len(history)),
            store_diagnostics=tuple(f"stored checkpoint {key} is unreadable and was ignored" for key in unreadable),
        )
        return Candidate(
            messages=output.messages,
            tools=output.tools or None,
            record=record,
            proxy_tools=frozenset(tool.name for tool in proxy_tools) & {tool_name(tool) for tool in output.tools},
            visible_history=tuple(output.visible_history),  # copied where a proxy step reads it
            cache_breakpoints=_stable_ends(output.messages, nonce),
        )

    def _tool_context(
        self, request: TurnRequest, history: list[HistoryEntry], visible: tuple[dict[str, Any], ...] | None = None
    ) -> ToolContext:
        messages = [item.message for item in history]
        return ToolContext(
            context_id=request.identity.context_id,
            history=messages,
            client_tools=list(request.body.get("tools") or []),
            state=self._run_states.derive(request.identity.context_id, history, visible),
            session=StoreToolSession(self._store, request.identity.context_id, request.reconciliation.head_hash),
        )

    async def run_proxy_step(
        self,
        request: TurnRequest,
        message: dict[str, Any],
        calls: list[dict[str, Any]],
        visible: tuple[dict[str, Any], ...],
    ) -> None:
        """Run the model's proxy-owned calls and store the step after the request's last message.

        Client calls made in the same answer are dropped: the model made them without the results it
        asked for, and it is asked again right away with those results in place (an answer carrying the
        provider's reasoning is kept whole instead, see below). Tools judge what is "still in context" (a
        skill body) against ``visible``, the history the model actually saw.
        """
        history = await self.history(request, await self._view(request))
        # The window's own messages until now: copied here, where a proxy step reads them, rather than on
        # every turn (a thousand dicts at 1,000 messages) for the few whose model calls a proxy tool.
        context = self._tool_context(request, history, tuple(dict(m) for m in visible))
        if not _carries_reasoning(message):
            step: list[dict[str, Any]] = [{"role": "assistant", "content": message.get("content"), "tool_calls": calls}]
            for call in calls:
                result = await self._toolbox.run(context, call)
                step.append({"role": "tool", "tool_call_id": call["id"], "content": result})
            await self.record_internal_step(request, step)
            return
        # Signed thinking or an encrypted reasoning item is valid only as the provider wrote it, and a
        # reasoning item must stay with the call it preceded: the answer is kept whole, client calls
        # included. Those get a result saying they were not run, so every call stays answered and the
        # model, asked again, makes them again.
        ours = {call["id"] for call in calls}
        step = [dict(message)]
        for call in message.get("tool_calls") or []:
            if call["id"] in ours:
                result = await self._toolbox.run(context, call)
            else:
                result = NOT_RUN.format(name=call["function"]["name"])
            step.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        await self.record_internal_step(request, step)

    async def history(self, request: TurnRequest, view: BranchView) -> list[HistoryEntry]:
        """The canonical history of this request, with proxy-owned steps put back in place.

        The request carries the branch it continues (reconciliation just stored it and named every
        prefix), so the transcript is not read back; only the proxy's own steps come from the store,
        and only where ``view`` (the branch state) anchors some or this request has taken rounds.
        """
        context_id = request.identity.context_id
        hashes = request.reconciliation.chain_hashes
        messages = request.body["messages"]
        anchors = _anchors(view)
        own = _own_steps_key(request)
        head = hashes[-1] if request.round else None  # this request's own rounds so far (none before its first)
        if not anchors and head is None:  # nearly every turn: no proxy step anywhere, one pass
            return [
                HistoryEntry(m, h, tool_output_ref(h) if m.get("role") == "tool" else None)
                for m, h in zip(messages, hashes, strict=True)
            ]
        answers = _mapping(view.value(INTERNAL_ANSWERS))
        items: list[HistoryEntry] = []
        for message, prefix in zip(messages, hashes, strict=True):
            ref = tool_output_ref(prefix) if message.get("role") == "tool" else None
            if prefix in answers:  # a live stream's rounds the client has as one answer: the provider's own
                message = answers[prefix]
            items.append(HistoryEntry(message, prefix, ref))
            if prefix not in anchors and prefix != head:
                continue  # nearly every message: no proxy step follows it
            keys = [anchors[prefix]] if prefix in anchors else []
            if prefix == head:
                keys.append(own)
            previous = prefix
            for key in keys:
                for step in await self._store.internal_steps(context_id, key):
                    previous = chain_hash(previous, step)  # a stable name, so checkpoints can cover it
                    items.append(HistoryEntry(step, previous))
        return items

    async def record_internal_step(self, request: TurnRequest, messages: list[dict[str, Any]]) -> None:
        """Store a proxy-owned tool step of this request, after its last message, where its next rounds see it."""
        await self._store.put_internal_steps(request.identity.context_id, _own_steps_key(request), messages)

    async def link_proxy_steps(
        self, request: TurnRequest, answer: dict[str, Any], stands_for: dict[str, Any] | None = None
    ) -> None:
        """Make this request's proxy steps part of the branch that continues with ``answer`` (the message the
        client got). ``stands_for``: the provider's last message, when the client got another one (a live
        stream's rounds relayed as one answer, ``proxy/runtime/rounds.py``): the model sees its own last
        round there, after its steps, rather than every round's text again."""
        view = await self._view(request)
        anchors = _anchors(view)
        anchors[_head(request)] = _own_steps_key(request)
        at = chain_hash(_head(request), answer)
        await self._store.put_state(request.identity.context_id, at, INTERNAL_ANCHORS, anchors)
        if stands_for is not None and stands_for != answer:
            answers = dict(_mapping(view.value(INTERNAL_ANSWERS)))
            answers[at] = stands_for
            await self._store.put_state(request.identity.context_id, at, INTERNAL_ANSWERS, answers)

    async def _view(self, request: TurnRequest) -> BranchView:
        """The branch state as of this request's chain: read with the turn, else (a later round or attempt,
        which must see what the earlier ones wrote) read now."""
        if request.view is not None:
            return request.view
        return await self._store.branch_view(
            request.identity.context_id, request.reconciliation.chain_hashes, _CHANNELS
        )


def _stable_ends(messages: Sequence[Mapping[str, Any]], nonce: str) -> tuple[int, ...]:
    """Where what stays byte-stable until the next compaction ends: the system prompt, the latest checkpoint and
    the latest preview (their indices in ``messages``; ``proxy/kernel/cache_marks.py`` puts prompt-cache
    breakpoints there). Previews are made oldest first and re-applied unchanged, so the next compaction
    changes the prompt only after the latest one: marked, what comes before it is still read from the cache
    then, where a client's moving mark (always on its newest message) was written only past that point."""
    ends: list[int] = []
    leading = 0
    while leading < len(messages) and messages[leading].get("role") == "system":
        leading += 1
    if leading:
        ends.append(leading - 1)
    checkpoints = [i for i, message in enumerate(messages) if is_checkpoint_message(message, nonce)]
    if checkpoints:
        ends.append(checkpoints[-1])
    stable = max(ends, default=-1)
    latest_preview = next(
        (
            i
            for i in range(len(messages) - 1, stable, -1)
            if messages[i].get("role") == "tool" and is_preview(content_text(messages[i].get("content")))
        ),
        None,
    )
    if latest_preview is not None:
        ends.append(latest_preview)
    return tuple(ends)


def _carries_reasoning(message: Mapping[str, Any]) -> bool:
    """Whether an answer holds the provider's own reasoning (a native answer, litellm's thinking blocks)."""
    return NATIVE in message or bool(message.get("thinking_blocks"))


def _anchors(view: BranchView) -> dict[str, str]:
    stored = view.value(INTERNAL_ANCHORS)
    if isinstance(stored, list):  # an earlier release: steps keyed by the chain hash they followed
        return {anchor: anchor for anchor in stored if isinstance(anchor, str)}
    return dict(stored) if isinstance(stored, dict) else {}


def _head(request: TurnRequest) -> str:
    """Where this turn's branch state is written: the chain hash of the request's last message."""
    return request.reconciliation.head_hash


def _own_steps_key(request: TurnRequest) -> str:
    """The key this request's proxy steps are stored under: unique to the request, stable over its rounds."""
    return f"{_head(request)}/{request.request_id}"


def _readable_checkpoints(stored: Mapping[str, Any]) -> tuple[list[Checkpoint], list[str]]:
    """The stored checkpoints that parse; one damaged record must not fail every later turn."""
    readable, unreadable = [], []
    for key, record in stored.items():
        try:
            readable.append(Checkpoint.from_record(record))
        except (KeyError, TypeError, ValueError):
            unreadable.append(key)
    return readable, unreadable


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
