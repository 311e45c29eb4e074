"""The assembler port: how the runtime asks for a model call's input, whatever the mode.

The runtime owns the turn (lock, store, provider, trace); an ``Assembler`` owns what the model sees.
``proxy/runtime/session_assembler.py`` implements it over the pipeline in ``proxy/context``; tests may hand the
app another.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.context.pipeline import AssemblyRecord
from proxy.kernel.config import Mode, ModelRoute
from proxy.runtime.branch import BranchTurn
from proxy.runtime.calibration import TokenAccounting
from proxy.runtime.limits import ModelLimits
from proxy.runtime.native import NativeRequest
from proxy.runtime.session_identity import SessionIdentity
from proxy.session.store import BranchView, Reconciliation


@dataclass(frozen=True)
class TurnRequest:
    """Everything known about one model call before its input is assembled."""

    identity: SessionIdentity
    mode: Mode
    route: ModelRoute
    limits: ModelLimits
    body: dict[str, Any]  # the client's request, as sent
    headers: Mapping[str, str]
    reconciliation: Reconciliation
    turn: int
    forced: bool = False  # a forced pressure pass after a provider overflow
    stated_limit: int | None = None  # the window the provider stated in its overflow message
    branch: BranchTurn | None = None  # where on its branch this call is (traced); None when not counted
    # One client request, the same over its proxy-owned rounds: what keeps its proxy steps its own.
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    ingress: Mapping[str, Any] | None = None  # a non-chat ingress's notes on its translation (for the trace)
    tokens: TokenAccounting | None = None  # how this call counts tokens (the route's calibrated estimator)
    round: int = 0  # the proxy-owned rounds this request has taken before this call
    # The assembler's branch state and checkpoints, read with the turn's ``begin_turn``: valid for the first
    # attempt of the first round only (later calls follow the request's own writes), else ``None``.
    view: BranchView | None = None
    # Set when the provider is sent the client's own API (``runtime/native.py``); None: a chat call.
    native: NativeRequest | None = None
    # litellm arguments an ingress sets itself for a chat call (not the client's: not allow-listed).
    provider_fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SummaryBackoff:
    """Why this call did not try to summarize: an earlier attempt failed and the history has not grown enough."""

    retry_after_messages: int
    history_messages: int


@dataclass(frozen=True)
class CandidateRecord:
    """How a candidate was made: the pipeline's stage record plus what the session assembler added."""

    pipeline: AssemblyRecord
    summarizer_calls: tuple[Mapping[str, Any], ...] = ()
    summary_backoff: SummaryBackoff | None = None
    store_diagnostics: tuple[str, ...] = ()


@dataclass
class Candidate:
    """An assembled model input and the record of how it was made (for the trace)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    record: CandidateRecord | None = None  # None: assembled by something that keeps no record (tests)
    proxy_tools: frozenset[str] = frozenset()  # proxy-owned tools offered in ``tools``
    visible_history: tuple[dict[str, Any], ...] = ()  # the history the model sees (after compaction)
    # Indices of ``messages`` after which the prompt stays byte-stable until the next compaction (the system
    # prompt, the latest checkpoint): where a provider's prompt-cache breakpoints go.
    cache_breakpoints: tuple[int, ...] = ()


class Assembler(Protocol):
    """Builds the model input for a turn."""

    @property
    def channels(self) -> Sequence[str]:
        """The branch-state channels ``assemble`` reads: the turn reads them with its ``begin_turn``."""

    async def assemble(self, request: TurnRequest) -> Candidate:
        """The candidate input for this turn."""
