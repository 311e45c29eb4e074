"""Review projection: reviews requested and submitted (``submit_review``, ``request_review`` by
default), as a hidden data message. Scopes main (acts on reviews) and reviewer (writes them).

Options: ``tools``: list of tool names replacing the defaults.
"""

from __future__ import annotations

from typing import ClassVar

from contributors.base import Factory
from contributors.projection import RecordProjection
from proxy.context.state import REVIEW
from proxy.context.types import Scope


class Review(RecordProjection):
    """The ``review.state`` hidden message."""

    id = "review"
    channel = REVIEW
    scopes: ClassVar[frozenset[Scope]] = frozenset({"main", "reviewer"})


factory = Factory(Review)
