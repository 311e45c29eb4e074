"""The contracts of the context package in one place: value types, protocols and the declared plugin bases.

Messages are plain OpenAI chat message dicts (``{"role", "content", "tool_calls", "tool_call_id"}``)
everywhere; this package never sees wire models, the store or the provider client.

A contributor package is written either to the declared bases (:class:`ContributorFactory`,
:class:`Contributor`: every optional member declared with its default, so mypy checks a subclass) or to
the protocol form (:class:`ContextContributorFactory`, :class:`ContextContributor`: a plain class that
imports nothing from the proxy), which the registry adapts once to the bases (``proxy/context/adapter.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from pydantic import BaseModel

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
    effective input limit, so a contributor can size what it offers. ``options`` are this contributor's
    own operator options (its part of the YAML config's ``contributors:`` section), validated once at
    start-up: an instance of the factory's ``options_model`` when it declares one, else a read-only
    mapping. The collector hands each contributor its own; no contributor sees another's.
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
    options: Any = field(default_factory=lambda: _frozen_map(None))

    def __post_init__(self) -> None:
        # Contributors run concurrently on the same request: hand each a view it cannot mutate.
        object.__setattr__(self, "history", tuple(self.history))
        object.__setattr__(self, "tools", tuple(self.tools))
        for name in ("metadata", "headers", "state"):
            value = getattr(self, name)
            if not isinstance(value, MappingProxyType):
                object.__setattr__(self, name, _frozen_map(value))
        # A validated options model is frozen by its own config; a plain mapping becomes a read-only view.
        if isinstance(self.options, Mapping) and not isinstance(self.options, MappingProxyType):
            object.__setattr__(self, "options", _frozen_map(self.options))

    def with_options(self, options: Any) -> ContributionRequest:
        """This request with ``options`` as its contributor's own (what the collector hands each contributor).
        The other fields are already read-only views and are shared, not made again: ``dataclasses.replace``
        ran ``__init__`` and ``__post_init__`` over every field, most of what starting a contributor's run cost."""
        if isinstance(options, Mapping) and not isinstance(options, MappingProxyType):
            options = _frozen_map(options)
        request = object.__new__(type(self))
        request.__dict__.update(self.__dict__, options=options)
        return request


# Message-budget priorities (lower first). The proxy's run-state projections that must survive a long
# list (the plan, the notice that a skill left the context) sit below what any package may declare.
DEFAULT_PRIORITY = 100
THIRD_PARTY_MIN_PRIORITY = 50


class Contributor(ABC):
    """The declared contributor contract: ``id``, ``scopes`` and ``contribute`` required, the rest defaulted.

    A base class, not a protocol, because a protocol cannot say "optional": here every member the registry
    and the collector read is declared with its type and default, so mypy checks a subclass's override
    against it (a class attribute ``priority = 40``, a property, or an attribute annotated in the subclass
    and set in ``__init__``). The registry checks the values again at composition, since a package's
    annotations bind only an author who runs mypy.
    """

    @property
    @abstractmethod
    def id(self) -> str:
        """Unique among the scope's contributors; matches ``ID_PATTERN``."""

    @property
    @abstractmethod
    def scopes(self) -> frozenset[Scope] | Sequence[Scope]:
        """The scopes this contributor serves (``main``, ``subagent``, ``reviewer``)."""

    @property
    def protected(self) -> bool:
        """A failing protected contributor fails the turn; an optional one becomes a diagnostic.

        Honoured only for the proxy's own contributors and factories an operator composes in code.
        """
        return False

    @property
    def priority(self) -> int:
        """Message-budget priority, lower admitted first; a package's is held at ``THIRD_PARTY_MIN_PRIORITY``."""
        return DEFAULT_PRIORITY

    @property
    def owns_client_instructions(self) -> bool:
        """It renders the client's system/developer messages into the prompt (honoured when protected only)."""
        return False

    @property
    def runs_inline(self) -> bool:
        """Its ``contribute`` never awaits: the collector runs it in the pipeline's task, untimed."""
        return False

    @abstractmethod
    async def contribute(self, request: ContributionRequest) -> ContributorOutput | Mapping[str, Any]:
        """This contributor's output for one call: a ``ContributorOutput`` or a mapping of the same keys."""


class ContributorFactory(ABC):
    """The declared factory contract: ``id`` and ``create`` required, the optional members defaulted.

    What a package registers under the entry-point group: builds its contributor for a scope, or ``None``
    to stay out of it. A base class for the reason :class:`Contributor` is one.
    """

    @property
    @abstractmethod
    def id(self) -> str:
        """Unique among factories; matches ``ID_PATTERN``. Also the key of its ``contributors:`` config."""

    @abstractmethod
    def create(self, scope: Scope) -> Contributor | None:
        """A new contributor for ``scope``, or ``None`` to stay out of that scope.

        Called once per run (a session branch) and scope, on the run's first turn in a process; the
        instance serves that run only, for as long as the process keeps it (``RunRegistries``). It must
        not rely on memory across turns: what must last goes through the store and its channels."""

    @property
    def options_model(self) -> type[BaseModel] | None:
        """A pydantic model (``extra="forbid"``) of the ``contributors.<id>`` config, validated once at start-up.

        Errors name ``contributors.<id>.<field>``; ``None``: the options stay a read-only mapping.
        """
        return None

    def validate_options(self, raw: Mapping[str, Any]) -> None:
        """The older hand-written check of the raw options, used only without an ``options_model``.

        Raise ``ValueError`` naming ``contributors.<id>.<field>`` to refuse them; the default accepts any.
        """
        return None

    def tools(self, options: Any) -> Sequence[ProxyTool]:
        """The proxy-owned tools this package offers the model under its validated ``options``; none by default."""
        return ()

    def channels(self, options: Any) -> Sequence[StateChannel]:
        """The run-state channels this package derives under its validated ``options``; none by default."""
        return ()


@runtime_checkable
class ContextContributor(Protocol):
    """The protocol form of :class:`Contributor`: what a package that imports nothing from the proxy writes.

    The other members of :class:`Contributor` (``priority``, ``owns_client_instructions``, ``runs_inline``,
    and ``protected`` too, always read with a default) may be missing from a plain object. The registry
    adapts such an object once (``proxy/context/adapter.py``) and from then on reads it through
    :class:`Contributor` only. ``contribute`` may return plain dicts: a package need not import our types.
    """

    @property
    def id(self) -> str: ...

    @property
    def scopes(self) -> frozenset[Scope] | Sequence[Scope]: ...

    @property
    def protected(self) -> bool:
        """A failing protected contributor fails the turn; an optional one becomes a diagnostic."""
        ...

    async def contribute(self, request: ContributionRequest) -> ContributorOutput | Mapping[str, Any]: ...


@runtime_checkable
class ContextContributorFactory(Protocol):
    """The protocol form of :class:`ContributorFactory`: a plain class with ``id`` and ``create``.

    Its optional members (``options_model``, ``validate_options``, ``tools``, ``channels``) are those of
    :class:`ContributorFactory`, with the same meaning; a plain object may have none of them. The registry
    adapts such a factory, and each contributor it creates, once (``proxy/context/adapter.py``); a
    ``ContributorFactory`` fits this protocol too and is taken as it is.

    These two names stay protocols beside the bases rather than becoming them: they describe what the
    registry accepts at the door, structurally (an entry point's object is checked against this one at
    discovery), and a package written to them imports nothing from the proxy. Were they the bases, that
    check and every annotation naming them would reject the documented duck-typed form.
    """

    @property
    def id(self) -> str: ...

    def create(self, scope: Scope) -> ContextContributor | None: ...


@dataclass(frozen=True)
class DeclaredCall:
    """One tool call of an assistant message, arguments parsed (JSON, or the raw text when not JSON)."""

    index: int  # of the declaring assistant message in the history
    call_id: str
    name: str
    arguments: Any


@runtime_checkable
class StateChannel(Protocol):
    """One run-state channel, derived from the canonical history by the package that owns its tools.

    ``observe`` sees every declared call in declared order with its successful result text (``None``:
    no result yet, or a failure) and returns the channel's next value; ``diagnose`` notes why a call that
    looked like state was ignored. ``judge`` rewrites the value for what the model will really see
    (visibility of a body, progress since a call); return the value unchanged when that means nothing.
    """

    @property
    def name(self) -> str: ...

    def initial(self) -> Any: ...

    def observe(self, value: Any, call: DeclaredCall, result: str | None, diagnose: Callable[[str], None]) -> Any: ...

    def judge(self, value: Any, visible: Sequence[Mapping[str, Any]]) -> Any: ...


@runtime_checkable
class ToolSession(Protocol):
    """What a proxy-owned tool may keep durably for its session (backed by the session store)."""

    async def revisions(self) -> Mapping[str, str]:
        """Name -> revision of what this session read at a frozen revision (the first read of a name)."""
        ...

    async def record_revision(self, name: str, revision: str) -> None:
        """Record that this session read ``name`` at ``revision`` (idempotent)."""
        ...

    async def get(self, key: str) -> Any | None:
        """A JSON value the tool kept for this session under ``key``."""
        ...

    async def put(self, key: str, value: Any) -> None:
        """Keep a JSON value for this session under ``key``."""
        ...


@dataclass(frozen=True)
class ToolContext:
    """What a proxy tool may look at: the session, its canonical history, the client's tools, run state."""

    context_id: str
    history: Sequence[Mapping[str, Any]]
    client_tools: Sequence[Mapping[str, Any]]
    state: Mapping[str, Any]
    session: ToolSession | None = None  # None where nothing is stored (unit tests, a dry run)


@runtime_checkable
class ProxyTool(Protocol):
    """A tool the proxy offers the model beside the client's, runs itself, and never shows the client.

    ``schema`` is the OpenAI tool object (``{"type": "function", "function": {"name", ...}}``);
    ``needs_references`` tools are offered only in sessions that work with tools (the client declares tools,
    or its history has a tool result), from their first call on: never added by a compaction, which would
    change the tool list (the head of the provider's cached prefix) mid-session. A client tool of the same
    name wins: the proxy's is then not offered. ``run`` gets the raw JSON arguments and returns the result
    text; a failure is a text starting ``Error:`` the model can read.
    """

    @property
    def name(self) -> str: ...

    @property
    def schema(self) -> Mapping[str, Any]: ...

    @property
    def needs_references(self) -> bool: ...

    def offered(self, context: ToolContext) -> bool: ...

    async def run(self, context: ToolContext, arguments: str) -> str: ...


@runtime_checkable
class ClientToolGate(Protocol):
    """A proxy tool that keeps some client tools out of the offer until it lets them in (``find_tools``)."""

    def withheld(self, context: ToolContext) -> frozenset[str]:
        """Names of the client's tools not to offer in this call."""
        ...


@runtime_checkable
class TokenEstimator(Protocol):
    """Counts tokens; ``count_message`` includes the message's framing overhead."""

    def count_text(self, text: str) -> int: ...

    def count_message(self, message: Mapping[str, Any]) -> int: ...

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int: ...


@runtime_checkable
class PrefixTokenEstimator(TokenEstimator, Protocol):
    """A ``TokenEstimator`` that can also count a history message named by its chain hash, so a resent
    history's unchanged prefix is looked up by the names reconciliation already gave it instead of
    being hashed again (``CachingEstimator``)."""

    def count_message_at(self, chain_hash: str, message: Mapping[str, Any]) -> int:
        """``count_message(message)`` for the history message whose chain hash is ``chain_hash``."""
        ...


def tool_name(tool: Mapping[str, Any]) -> str:
    """An OpenAI tool object's function name (``""`` when it has none)."""
    function = tool.get("function")
    name = function.get("name") if isinstance(function, Mapping) else tool.get("name")
    return name if isinstance(name, str) else ""
