"""Which session a turn belongs to: the context id, where it came from, and the agent scope.

The ingresses resolve it from what a client sends (``identify`` in ``proxy/ingress/front_door.py``); the
turn service, its traces and its observers carry it.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.context.types import SCOPES, Scope

__all__ = ["SCOPES", "Scope", "SessionIdentity"]


@dataclass(frozen=True)
class SessionIdentity:
    """The context id (also the trace folder name), where it came from, and the agent scope."""

    context_id: str
    source: str  # "header:<name>", "body:<field>" or "fingerprint"
    scope: Scope
