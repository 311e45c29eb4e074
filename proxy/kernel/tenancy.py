"""Teams: who a request belongs to, and how a team's sessions and traces are named apart from another's.

A team's sessions are ``team.<team>.<id>``: the prefix is part of the context id, so everything keyed by
the context id (messages, tool outputs, checkpoints, preview references, stored responses, recordings)
belongs to the team without a column of its own, and the same session id under two teams is two
sessions. The master key's requests and every session stored before teams existed are the default
team's: their ids carry no prefix. A team's traces go to a folder of its own, ``teams/<team>/``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import PurePath

DEFAULT_TEAM = "default"
TEAM_PREFIX = "team."
TEAMS_FOLDER = "teams"
TEAM_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
_MAX_CONTEXT_ID = 128  # the context-id pattern every layer checks (traces, response ids, checkpoints)


def check_team(name: str) -> str:
    """``name`` when it is a valid team name (lowercase letters, digits, ``-``, ``_``; 1..32); ``ValueError`` else."""
    if not TEAM_NAME.fullmatch(name) or name == DEFAULT_TEAM:
        raise ValueError(
            f"team {name!r} must match {TEAM_NAME.pattern} and not be {DEFAULT_TEAM!r} (the master key's team)"
        )
    return name


def team_context_id(team: str, context_id: str) -> str:
    """The context id ``context_id`` has within ``team``: itself for the default team, else
    ``team.<team>.<id>`` (a hash of the id when that would be longer than a context id may be)."""
    if team == DEFAULT_TEAM:
        return context_id
    prefixed = f"{TEAM_PREFIX}{team}.{context_id}"
    if len(prefixed) <= _MAX_CONTEXT_ID:
        return prefixed
    return f"{TEAM_PREFIX}{team}.sid-{hashlib.sha256(context_id.encode()).hexdigest()[:32]}"


def team_of(context_id: str) -> str:
    """The team a context id belongs to (the default team's ids carry no prefix)."""
    if not context_id.startswith(TEAM_PREFIX):
        return DEFAULT_TEAM
    team, dot, _ = context_id[len(TEAM_PREFIX) :].partition(".")
    return team if dot and TEAM_NAME.fullmatch(team) else DEFAULT_TEAM


def trace_folder(context_id: str) -> PurePath:
    """A session's trace folder under the trace root: ``<id>``, or ``teams/<team>/<id>`` for a team's."""
    team = team_of(context_id)
    if team == DEFAULT_TEAM:
        return PurePath(context_id)
    return PurePath(TEAMS_FOLDER, team, context_id)


@dataclass(frozen=True)
class Limits:
    """What a virtual key may do: its models (empty: all), requests and sent tokens per minute (``None``: no cap)."""

    models: tuple[str, ...] = ()
    rpm: int | None = None
    tpm: int | None = None


@dataclass(frozen=True)
class Principal:
    """Who sent a request: the administrator (the master key, or anyone when none is set) or a team's key."""

    team: str = DEFAULT_TEAM
    key_id: str | None = None  # the virtual key's id; ``None`` for the administrator
    limits: Limits = Limits()

    @property
    def admin(self) -> bool:
        """The master key's holder: every team's sessions and the key API."""
        return self.key_id is None

    def owns(self, context_id: str) -> bool:
        """May this principal read the session ``context_id``? The administrator may read every one."""
        return self.admin or team_of(context_id) == self.team

    def context_id(self, session_id: str) -> str:
        """The context id of the session ``session_id`` as this principal names it."""
        return session_id if self.admin else team_context_id(self.team, session_id)


ADMIN = Principal()
