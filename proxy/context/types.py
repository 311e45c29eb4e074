"""The contracts of the context package in one place: value types and protocols.

Messages are plain OpenAI chat message dicts (``{"role", "content", "tool_calls", "tool_call_id"}``)
everywhere; this package never sees wire models, the store or the provider client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

Scope: TypeAlias = Literal["main", "subagent", "reviewer"]
SCOPES: tuple[Scope, ...] = ("main", "subagent", "reviewer")
Trust: TypeAlias = Literal["trusted_data", "untrusted_data"]
TRUST_LEVELS: tuple[Trust, ...] = ("trusted_data", "untrusted_data")
Level: TypeAlias = Literal["info", "warning", "error"]
Message: TypeAlias = dict[str, Any]

# An ID goes into an XML-like attribute of a hidden message and into trace keys; keep it plain.
ID_PATTERN = r"[A-Za-z0-9_.:-]{1,128}"


@dataclass(frozen=True)
class Section:
    """A structured piece of the system prompt.

    ``slot`` groups sections (lower slots render first and are admitted first), ``order`` sorts within a
    slot; ``protected`` sections (identity, governance, run contract) are never cut. ``source`` is the
    contributor ID; the collector fills it in when a contributor leaves it empty.
    """

    id: str
    text: str
    slot: int = 100
    order: int = 0
    protected: bool = False
    title: str = ""
    source: str = ""


@dataclass(frozen=True)
class ContextMessage:
    """A call-local hidden user message: sent with this one call, never stored in the session."""

    id: str
    content: str
    source: str = ""
    role: str = "user"  # anything else is rejected by the collector; kept as data so that it can be


@dataclass(frozen=True)
class Attachment:
    """Data for the model, wrapped in a hidden message with explicit ``source`` and ``trust``."""

    id: str
    content: str
    trust: Trust = "untrusted_data"
    source: str = ""


@dataclass(frozen=True)
class Diagnostic:
    """A note for the trace: something admitted, cut, dropped, rejected or failed."""

    level: Level
    code: str
    message: str
    source: str = ""


@dataclass(frozen=True)
class ContributorOutput:
    """What one contributor gives for one call. Everything is optional."""

    sections: tuple[Section, ...] = ()
    messages: tuple[ContextMessage, ...] = ()
    attachments: tuple[Attachment, ...] = ()
    diagnostics: tuple[Diagnostic, ...] = ()


def _frozen_map(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True)
class ContributionRequest:
    """Everything a contributor may look at for one call (read-only views).

    ``history`` is the model-visible canonical history (after compaction); ``state`` maps a structured
    channel name (``plan``, ``skills``, ``artifacts``...) to its current value; ``budget_tokens`` is the
    effective input limit, so a contributor can size what it offers. ``options`` maps a contributor ID to
    the operator's options for it (the YAML config's ``contributors:`` section); each contributor
    validates its own.
    """

    scope: Scope
    context_id: str
    history: Sequence[Mapping[str, Any]] = ()
    tools: Sequence[Mapping[str, Any]] = ()
    metadata: Mapping[str, Any] = field(default_factory=lambda: _frozen_map(None))
    headers: Mapping[str, str] = field(default_factory=lambda: _frozen_map(None))
    state: Mapping[str, Any] = field(default_factory=lambda: _frozen_map(None))
    model: str = ""
    turn: int = 0
    budget_tokens: int = 0
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: _frozen_map(None))

    def __post_init__(self) -> None:
        # Contributors run concurrently on the same request: hand each a view it cannot mutate.
        object.__setattr__(self, "history", tuple(self.history))
        object.__setattr__(self, "tools", tuple(self.tools))
        for name in ("metadata", "headers", "state"):
            value = getattr(self, name)
            if not isinstance(value, MappingProxyType):
                object.__setattr__(self, name, _frozen_map(value))
        # One level deeper than the others: each contributor's own options are a read-only view too.
        options = {str(k): _frozen_map(v) for k, v in (self.options or {}).items()}
        object.__setattr__(self, "options", MappingProxyType(options))


@runtime_checkable
class ContextContributor(Protocol):
    """Provides sections, messages, attachments and diagnostics for the scopes it declares."""

    @property
    def id(self) -> str: ...

    @property
    def scopes(self) -> frozenset[Scope] | Sequence[Scope]: ...

    @property
    def protected(self) -> bool:
        """A failing protected contributor fails the turn; an optional one becomes a diagnostic."""
        ...

    async def contribute(self, request: ContributionRequest) -> ContributorOutput: ...


@runtime_checkable
class ContextContributorFactory(Protocol):
    """What a package registers: builds its contributor for a scope, or ``None`` to stay out of it."""

    @property
    def id(self) -> str: ...

    def create(self, scope: Scope) -> ContextContributor | None: ...


@runtime_checkable
class TokenEstimator(Protocol):
    """Counts tokens; ``count_message`` includes the message's framing overhead."""

    def count_text(self, text: str) -> int: ...

    def count_message(self, message: Mapping[str, Any]) -> int: ...

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int: ...
