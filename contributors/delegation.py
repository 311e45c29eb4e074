"""Delegation projection: the subagents and tasks the agent handed off (``delegate``, ``spawn_subagent``,
``task`` by default), as a hidden data message. Scope main: the agent that delegates.

Options: ``tools``: list of tool names replacing the defaults.
"""

from __future__ import annotations

from typing import ClassVar

from contributors.base import Factory
from contributors.projection import RecordProjection
from proxy.context.state import DELEGATION
from proxy.context.types import Scope


class Delegation(RecordProjection):
    """The ``delegation.state`` hidden message."""

    id = "delegation"
    channel = DELEGATION
    scopes: ClassVar[frozenset[Scope]] = frozenset({"main"})


factory = Factory(Delegation)
