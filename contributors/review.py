"""Review projection: reviews requested and submitted (``submit_review``, ``request_review`` by
default), as a hidden data message. Scopes main (acts on reviews) and reviewer (writes them).

Options: ``tools``: list of tool names replacing the defaults.
"""

from __future__ import annotations

from typing import ClassVar

from contributors.projection import ProjectionFactory, RecordProjection
from proxy.context.types import Scope


class Review(RecordProjection):
    """The ``review.state`` hidden message."""

    id = "review"
    channel = "review"
    default_tools = ("submit_review", "request_review")
    priority = 40
    scopes: ClassVar[frozenset[Scope]] = frozenset({"main", "reviewer"})


factory = ProjectionFactory(Review)
