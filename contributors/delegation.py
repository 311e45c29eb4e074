"""Delegation projection: the subagents and tasks the agent handed off (``delegate``, ``spawn_subagent``,
``task`` by default), as a hidden data message. Scope main: the agent that delegates.

Options: ``tools``: list of tool names replacing the defaults.
"""

from __future__ import annotations

from typing import ClassVar

from contributors.projection import ProjectionFactory, RecordProjection
from proxy.context.types import Scope


class Delegation(RecordProjection):
    """The ``delegation.state`` hidden message."""

    id = "delegation"
    channel = "delegation"
    default_tools = ("delegate", "spawn_subagent", "task")
    priority = 60
    scopes: ClassVar[frozenset[Scope]] = frozenset({"main"})


factory = ProjectionFactory(Delegation)
