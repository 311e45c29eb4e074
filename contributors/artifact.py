"""Artifact projection: what the run wrote (``write_artifact``, ``save_artifact`` by default), as a hidden
data message. All scopes: a reviewer reviews artifacts, a subagent builds on them.

Options: ``tools``: list of tool names replacing the defaults.
"""

from __future__ import annotations

from contributors.projection import ProjectionFactory, RecordProjection


class Artifact(RecordProjection):
    """The ``artifact.state`` hidden message."""

    id = "artifact"
    channel = "artifact"
    default_tools = ("write_artifact", "save_artifact")
    priority = 60


factory = ProjectionFactory(Artifact)
