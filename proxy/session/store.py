"""The session store contract: what every backend (SQLite, PostgreSQL) provides.

A session is one conversation, named by its context id; runs that open alike share one and are its
branches. Its transcript is content-addressed: every
stored message is keyed by the chain hash of the prefix it ends (see ``proxy/kernel/canonical.py``), so the same
history sent again is recognised without guessing, an edited or regenerated history forks a new
branch at the first divergent message, and nothing a client ever sent is overwritten.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.kernel.canonical import HistoryEntry

SECRET_BYTES = 32  # of every secret a store makes (``SessionStore.secret``)


class StoreError(Exception):
    """A store operation failed."""


class SessionBusy(StoreError):
    """The turn lock of a session's branch (or the whole session's) could not be had within the configured wait."""

    def __init__(
        self, context_id: str, waited_seconds: float, holder: str = "another turn on the same history"
    ) -> None:
        super().__init__(f"session {context_id!r} is busy with {holder} (waited {waited_seconds:.1f}s)")
        self.context_id = context_id
        self.waited_seconds = waited_seconds


class UnknownSession(StoreError):
    """A write that needs an existing session named one the store has never seen."""

    def __init__(self, context_id: str) -> None:
        super().__init__(f"session {context_id!r} is unknown (reconcile its messages first)")
        self.context_id = context_id


@dataclass(frozen=True)
class CalibrationUpdate:
    """One ``update_calibration`` call, made later (``begin_turn`` applies it in its transaction)."""

    route_key: str
    group: str
    update: Callable[[Any | None], Any]
    keep: int | None = None


@dataclass(frozen=True)
class Reconciliation:
    """How a request's messages relate to what the store already knew."""

    context_id: str
    head_hash: str  # chain hash of the request's last message
    known_count: int  # leading request messages that were already stored
    new_messages: list[HistoryEntry]  # the rest, now stored, in order
    forked: bool  # the request left the branch the session last continued
    created: bool  # the session did not exist before this request
    chain_hashes: tuple[str, ...] = ()  # of every request message, in order (the last is head_hash)


@dataclass(frozen=True)
class BranchState:
    """A state channel's value and the prefix it was written at."""

    chain_hash: str
    value: Any


@dataclass(frozen=True)
class BranchView:
    """What the store holds for one request's branch, read together: each asked-for state channel's value
    at the nearest prefix of the request's chain that has one (chain hash ``""``, session-wide, is the
    root of every chain), and every checkpoint of the session by the chain hash it covers."""

    states: Mapping[str, BranchState] = field(default_factory=dict)  # channels without a value are absent
    checkpoints: Mapping[str, dict[str, Any]] = field(default_factory=dict)

    def value(self, channel: str) -> Any | None:
        """The channel's value along the branch, or ``None``."""
        found = self.states.get(channel)
        return None if found is None else found.value


@dataclass(frozen=True)
class BranchCount:
    """A counter along a chain (see ``SessionStore.begin_turn``): this call is the ``number``-th, after the
    one counted at ``parent`` (``None`` for the first)."""

    number: int
    parent: str | None


@dataclass(frozen=True)
class TurnStart:
    """Everything a turn needs from the store before its first model call, from one transaction."""

    reconciliation: Reconciliation
    turn: int  # the session's model-call counter after this call was counted
    view: BranchView  # the branch state and checkpoints along the request's chain
    branch: BranchCount | None = None  # with ``branch_counter``: this call's place on its chain
    calibration: Any | None = None  # with ``calibration``: the route's stored token calibration


@dataclass(frozen=True)
class SkillRef:
    """A durable record that a skill body was read into a session, at a frozen revision."""

    name: str
    revision: str
    chain_hash: str  # the tool-result message that carried the body


@dataclass(frozen=True)
class SessionSummary:
    """One stored session, as ``SessionStore.sessions`` lists it."""

    context_id: str
    scope: str
    messages: int  # stored messages of every branch
    updated_at: str  # ISO 8601, when a request last reached the session


@dataclass(frozen=True)
class KeyRecord:
    """A team's virtual key as the store holds it: never the key, only its SHA-256 (``proxy/session/keys.py``)."""

    key_id: str  # stable over rotations: how operators name the key
    key_hash: str  # hex SHA-256 of the current key
    team: str
    alias: str | None = None
    models: tuple[str, ...] = ()  # the model names it may use; empty: every model
    rpm: int | None = None  # requests per minute
    tpm: int | None = None  # tokens sent to the provider per minute
    expires_at: str | None = None  # ISO 8601 (UTC)
    created_at: str = ""
    revoked_at: str | None = None


def tool_output_ref(chain_hash: str) -> str:
    """The ``read_tool_output`` reference of the tool message stored under ``chain_hash``."""
    return f"to_{chain_hash[:16]}"


class SessionStore(Protocol):
    """Persistence of sessions. Every method is safe to call concurrently, for different sessions and for
    different branches of one session."""

    async def open(self) -> None:
        """Connect and apply pending schema migrations (idempotent)."""

    async def close(self) -> None:
        """Release connections."""

    def turn_lock(self, context_id: str, branch: str = "") -> AbstractAsyncContextManager[None]:
        """Serialize the turns of one branch of a session; raises ``SessionBusy`` after the configured wait.

        ``branch`` is the chain hash of the request's last message: requests with the same history
        share it and take turns, requests whose histories differ hold different locks and run at once.
        While ``delete_session`` of the session runs, every branch waits.
        """

    async def reconcile(self, context_id: str, scope: str, messages: Sequence[Mapping[str, Any]]) -> Reconciliation:
        """Store the request's new suffix (one transaction) and its tool bodies; return where it continues."""

    async def begin_turn(
        self,
        context_id: str,
        scope: str,
        messages: Sequence[Mapping[str, Any]],
        channels: Sequence[str] = (),
        *,
        branch_counter: str | None = None,
        calibration: str | None = None,
        chain_hashes: Sequence[str] | None = None,
        calibration_updates: Sequence[CalibrationUpdate] = (),
    ) -> TurnStart:
        """Start a model turn in ONE transaction (one round trip): reconcile the request as ``reconcile``
        does, count the call with ``next_turn``, and read the ``branch_view`` of ``channels`` along the
        request's chain. ``calibration_updates`` are applied first, in order, as ``update_calibration``
        applies one (the samples earlier answers taught, written with this turn instead of after theirs).

        ``branch_counter`` names a state channel that counts calls along a chain: its value at the
        nearest prefix *before* the request's head (the root ``""`` excluded) plus one is written at the
        head and returned as ``TurnStart.branch``. ``calibration`` is a route key whose stored token
        calibration is returned too. ``chain_hashes``: the request's chain hashes when the caller already
        computed them with ``proxy.session.reconcile.request_hashes`` (the turn service does, to name the
        branch it locks), so a long history is not hashed twice.
        """

    async def transcript(self, context_id: str, head_hash: str) -> list[HistoryEntry]:
        """The branch ending at ``head_hash``, oldest first (empty for an unknown head)."""

    async def tool_output(self, context_id: str, ref: str) -> str | None:
        """A stored tool body by reference; ``None`` when the reference is not this session's."""

    async def next_turn(self, context_id: str) -> int:
        """Increment and return the session's model-call counter (1 for the first call)."""

    async def put_internal_steps(
        self, context_id: str, anchor_hash: str, messages: Sequence[Mapping[str, Any]]
    ) -> None:
        """Record proxy-owned tool steps (assistant call + tool results) taken after ``anchor_hash``."""

    async def internal_steps(self, context_id: str, anchor_hash: str) -> list[dict[str, Any]]:
        """The proxy-owned steps recorded after ``anchor_hash``, in order."""

    async def put_checkpoint(self, context_id: str, covers_hash: str, checkpoint: Mapping[str, Any]) -> None:
        """Store a resident checkpoint keyed by the chain hash of the last message it covers."""

    async def put_state(self, context_id: str, chain_hash: str, channel: str, value: Any) -> None:
        """Store a state channel's value as of the prefix ``chain_hash``."""

    async def state(self, context_id: str, chain_hash: str, channel: str) -> Any | None:
        """A state channel's value as of the prefix ``chain_hash``, or ``None``."""

    async def branch_view(self, context_id: str, chain_hashes: Sequence[str], channels: Sequence[str]) -> BranchView:
        """The ``channels`` along ``chain_hashes`` (a request's prefixes, oldest first) and the checkpoints.

        This is branch state: a value written at a request's head is seen by the requests that extend
        that head, and never by a request on another branch. ``begin_turn`` returns the same view.
        """

    async def put_skill_ref(self, context_id: str, ref: SkillRef) -> None:
        """Record that a skill body was read (idempotent)."""

    async def skill_refs(self, context_id: str) -> list[SkillRef]:
        """The session's skill references, oldest first."""

    async def sessions(self) -> list[SessionSummary]:
        """Every stored session, the most recently updated first."""

    async def delete_session(self, context_id: str) -> bool:
        """Delete every row the session owns (messages, tool outputs, steps, checkpoints, state channels, skill
        refs, the session itself) in one transaction; ``True`` when there was any.

        Waits, up to the store's lock wait, until no turn of any branch of the session runs, and keeps new
        ones out until it is done; ``SessionBusy`` when turns kept it waiting that long. The deployment's
        shared rows (secrets, token calibration) stay.
        """

    async def secret(self, name: str) -> bytes:
        """The deployment's secret ``name``: made once with ``secrets.token_bytes(SECRET_BYTES)`` by whichever
        process asks first, then the same for every process and replica on this store."""

    async def calibration(self, route_key: str) -> Any | None:
        """The token calibration stored for a route (JSON), or ``None``; shared by every replica."""

    async def update_calibration(
        self, route_key: str, group: str, update: Callable[[Any | None], Any], keep: int | None = None
    ) -> Any:
        """Replace a route's calibration by ``update(current)`` in one transaction (concurrent updates of one
        route never lose each other's samples) and return it. With ``keep``, only the ``keep`` most recently
        updated routes of ``group`` are kept (routes named by clients must not grow the table)."""

    async def put_key(self, record: KeyRecord) -> None:
        """Store a new virtual key (its hash); ``StoreError`` when its id or hash is taken."""

    async def key_by_hash(self, key_hash: str) -> KeyRecord | None:
        """The key whose current hash is ``key_hash`` (revoked ones included), or ``None``."""

    async def keys(self) -> list[KeyRecord]:
        """Every virtual key, revoked ones included, oldest first."""

    async def rotate_key(self, key_id: str, new_hash: str) -> bool:
        """Replace a live key's hash (the old key stops); ``False`` when there is no live key ``key_id``."""

    async def revoke_key(self, key_id: str, revoked_at: str) -> bool:
        """Mark a live key revoked; ``False`` when there is no live key ``key_id``."""
