"""Token accounting per route: which estimator a turn counts with, and what provider answers teach it.

With ``SCIENCE_AGENT_CONTEXT_ESTIMATOR=calibrated`` (the default) a route's counts are tiktoken's
(``o200k_base`` / ``cl100k_base`` by model family) times the route's correction
(``proxy/context/calibration.py``); each answer that reports ``usage.prompt_tokens`` adds a sample,
the provider's count over the local tiktoken count of the exact request sent. The samples live in the
session store, so replicas share them and a restart keeps them; each is written by the next turn's
``begin_turn`` in its transaction (one store round trip per turn), or by ``flush`` when the app stops.
``tiktoken`` counts with tiktoken alone, ``conservative`` with the tokenizer-free upper estimate;
neither learns.

Statistics are kept per configured route (``route:<model_name>``); without a ``model_list``, per
provider model string (``model:<litellm model>``), at most ``UNROUTED_CALIBRATIONS`` of them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from proxy.context.calibration import Calibration, Correction
from proxy.context.estimators import (
    CachingEstimator,
    ConservativeTokenEstimator,
    TiktokenEstimator,
    tiktoken_encoding_for,
)
from proxy.context.turn_estimator import TurnEstimator, counts_of
from proxy.context.types import TokenEstimator
from proxy.kernel.config import ModelRoute, Settings
from proxy.kernel.jsonio import dumps
from proxy.process.offline import prepare_offline_environment
from proxy.provider.tokenizer_endpoint import server_token_count
from proxy.session.store import CalibrationUpdate, SessionStore, StoreError

logger = logging.getLogger(__name__)

# Model strings clients choose (no model_list): any string, so only this many keep a calibration.
UNROUTED_CALIBRATIONS = 32


@dataclass(frozen=True)
class CalibrationSample:
    """What one answer taught a calibrated route, and from what (the trace's ``calibration``): the provider's
    ``usage`` against the local count of the request, the server's tokenizer against tiktoken's count of the
    same text, or nothing (``note`` says why)."""

    source: Literal["usage", "tokenizer", "none"]
    provider_tokens: int | None = None
    local_tokens: int | None = None
    note: str = ""


@dataclass(frozen=True)
class TokenAccounting:
    """How one turn counts tokens (its trace's ``budgets.estimator``, see ``proxy/runtime/trace_record.py``)."""

    estimator: TurnEstimator  # one per turn: every count of the turn shares its memo
    name: str  # calibrated, tiktoken or conservative
    encoding: str | None = None  # the tiktoken encoding, when one is used
    correction: Correction | None = None  # the calibrated correction, when calibrated


class TokenCalibrator:
    """Chooses each route's estimator and learns from the usage its answers report."""

    def __init__(self, settings: Settings, store: SessionStore) -> None:
        self._settings = settings
        self._store = store
        self._configured = {route.model_name for route in settings.models}
        self._conservative = CachingEstimator(ConservativeTokenEstimator())
        self._tiktoken: dict[str, CachingEstimator] = {}  # one cache per encoding, shared by every route
        self._pending: list[CalibrationUpdate] = []  # samples not written yet (see ``observe``)

    @property
    def conservative(self) -> CachingEstimator:
        """The cached tokenizer-free upper estimate (the ``conservative`` setting counts with it)."""
        return self._conservative

    def base(self, route: ModelRoute) -> TokenEstimator | None:
        """The route's uncorrected tiktoken counter (``None`` when the conservative estimator is chosen)."""
        if self._settings.estimator == "conservative":
            return None
        encoding = tiktoken_encoding_for(route.litellm_model)
        cached = self._tiktoken.get(encoding)
        if cached is None:
            prepare_offline_environment()  # tiktoken reads the encodings bundled with litellm, never the network
            cached = self._tiktoken[encoding] = CachingEstimator(TiktokenEstimator(encoding))
        return cached

    def stored_key(self, route: ModelRoute) -> str | None:
        """The store key of the route's calibration, when its accounting reads one (calibrated only)."""
        if self._settings.estimator != "calibrated":
            return None
        return self._key(route)[0]

    async def accounting(self, route: ModelRoute) -> TokenAccounting:
        """The estimator this route's next call counts with (reads the calibration from the store)."""
        key = self.stored_key(route)
        stored = None
        if key is not None:
            await self.flush()  # the samples learnt since the last turn began count too
            try:
                stored = await self._store.calibration(key)
            except StoreError as exc:
                # Counting must not fail a request: without the samples, the start margin is the safe side.
                logger.warning("token calibration of %s unreadable (%s); using the start margin", key, exc)
        return self.accounting_with(route, stored)

    def accounting_with(
        self,
        route: ModelRoute,
        stored: Any | None,
        messages: Sequence[Mapping[str, Any]] = (),
        chain_hashes: Sequence[str] = (),
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> TokenAccounting:
        """How this route's next turn counts, given its ``stored`` calibration (read by the caller, e.g. with
        the turn's ``begin_turn``): a new per-turn memo over the route's cached counter, with the client's
        ``messages`` named by their ``chain_hashes``, so the resent history is looked up by name by every
        count of the turn (assembly, trace, calibration sample) and each message is counted once; and the
        client's ``tools`` named, so their schemas are digested once (``TurnEstimator.name_tools``)."""
        base = self.base(route)
        if base is None:
            accounting = TokenAccounting(TurnEstimator(self._conservative), "conservative")
        elif self._settings.estimator == "tiktoken":
            accounting = TokenAccounting(TurnEstimator(base), "tiktoken", tiktoken_encoding_for(route.litellm_model))
        else:
            correction = Calibration.from_record(stored).correction(self._settings.estimator_start_percent / 100)
            accounting = TokenAccounting(
                TurnEstimator(base, correction.factor),
                "calibrated",
                tiktoken_encoding_for(route.litellm_model),
                correction,
            )
        accounting.estimator.name_messages(messages, chain_hashes)
        accounting.estimator.name_tools(tools)
        return accounting

    async def observe(
        self,
        route: ModelRoute,
        llm_input: Mapping[str, Any],
        usage: Any,
        counter: TurnEstimator | None = None,
    ) -> CalibrationSample | None:
        """Learn from one answer's ``usage`` for the request ``llm_input`` that was sent (calibrated only);
        returns what was learnt and from what, for the trace (``None``: the estimator does not learn).

        ``counter`` is the turn's own (``TokenAccounting.estimator``): its base counts of what the assembly
        already counted are reused, so a long history is not counted again after its call. An answer
        without usage (a llama-cpp-python stream) teaches through the server's tokenizer endpoint when the
        route names one (``tokenizer_url``), never through the proxy's own count alone."""
        if self._settings.estimator != "calibrated":
            return None
        base = self.base(route)
        if base is None:
            return None
        provider_tokens = usage.get("prompt_tokens") if isinstance(usage, Mapping) else None
        if not isinstance(provider_tokens, int) or isinstance(provider_tokens, bool) or provider_tokens <= 0:
            return await self._observe_tokenizer(route, base, llm_input)
        if counter is None or counter.inner is not base:
            counter = TurnEstimator(base)
        local = local_count(counter.unscaled(), llm_input)
        self._sample(route, local, provider_tokens)
        return CalibrationSample("usage", provider_tokens, local)

    async def _observe_tokenizer(
        self, route: ModelRoute, base: TokenEstimator, llm_input: Mapping[str, Any]
    ) -> CalibrationSample:
        """A sample from the server's tokenizer: its count of the request's text against tiktoken's."""
        if route.tokenizer_url is None:
            return CalibrationSample("none", note="the answer carried no usage and the route names no tokenizer_url")
        text = prompt_text(llm_input)
        provider_tokens = await server_token_count(route.tokenizer_url, text, str(llm_input.get("model") or ""))
        if provider_tokens is None:
            return CalibrationSample("none", note=f"the tokenizer endpoint {route.tokenizer_url} did not count")
        local = base.count_text(text)
        self._sample(route, local, provider_tokens)
        return CalibrationSample("tokenizer", provider_tokens, local, "the answer carried no usage")

    def _sample(self, route: ModelRoute, local: int, provider_tokens: int) -> None:
        key, group = self._key(route)

        def update(current: Any) -> Any:
            return Calibration.from_record(current).observe(local, provider_tokens).to_record()

        # Written by the next turn's begin_turn, in its transaction (one store round trip per turn, and
        # none between the answer and the client), or by ``flush``.
        self._pending.append(CalibrationUpdate(key, group, update, None if group == "route" else UNROUTED_CALIBRATIONS))

    def take_pending(self) -> list[CalibrationUpdate]:
        """The samples learnt since the last turn began, oldest first, for ``begin_turn`` to write."""
        pending, self._pending = self._pending, []
        return pending

    async def flush(self) -> None:
        """Write the samples no turn has written yet (a read outside a turn, and on shutdown)."""
        for pending in self.take_pending():
            try:
                await self._store.update_calibration(pending.route_key, pending.group, pending.update, pending.keep)
            except StoreError as exc:
                # The answers are the clients' whatever happens here; a lost sample costs nothing.
                logger.warning("token calibration of %s not stored (%s)", pending.route_key, exc)

    def _key(self, route: ModelRoute) -> tuple[str, str]:
        if route.model_name in self._configured:
            return f"route:{route.model_name}", "route"
        return f"model:{route.litellm_model}", "model"


def local_count(estimator: TokenEstimator, llm_input: Mapping[str, Any]) -> int:
    """The estimator's count of a provider call's messages and tools, as sent."""
    messages = llm_input.get("messages") or []
    total = sum(counts_of(estimator, [m for m in messages if type(m) is dict or isinstance(m, Mapping)]))
    tools = llm_input.get("tools") or []
    return total + estimator.count_tools([t for t in tools if isinstance(t, Mapping)])


def prompt_text(llm_input: Mapping[str, Any]) -> str:
    """The text of a provider call's messages and tools, as a tokenizer endpoint is asked to count it: each
    message's text content, its tool calls' names and arguments, and the tools' JSON."""
    parts: list[str] = []
    for message in llm_input.get("messages") or []:
        if not isinstance(message, Mapping):
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [str(part.get("text")) for part in content if isinstance(part, Mapping) and part.get("text")]
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                parts += [str(function.get("name") or ""), str(function.get("arguments") or "")]
    tools = [tool for tool in llm_input.get("tools") or [] if isinstance(tool, Mapping)]
    if tools:
        parts.append(dumps(tools).decode())
    return "\n".join(part for part in parts if part)
