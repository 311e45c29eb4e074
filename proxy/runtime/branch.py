"""Which branch of a session a turn is on: the key its turn lock is taken on, and its place in the branch.

A session (one context id) is a tree of branches: runs that open with the same system and user
message share a fingerprint, and a client that forks or edits its history adds branches under its
own session id. Turns are serialized per branch, not per session. A branch is named by the chain hash
of the request's last message (its head):

- the same history sent twice (a retry, or the identical first request of ten pass@k runs) has one
  head, so those requests take turns and never interleave their store updates; a request that waits
  longer than the lock wait is a real conflict and gets ``409 session_busy``;
- runs whose histories differ (from the first answer or tool result on) have different heads and run
  at the same time, each writing its branch state at its own head (see ``proxy/runtime/session_assembler.py``).

Locking on the stored message a request extends instead would be decided by a store read made before
the lock (racy), and would also serialize every run's second turn: their requests differ, but all
extend the same stored opening until the first of them stores its answer.

Traces keep the session's numbering (``turn-NNNN.json``, unique per context id, so concurrent
branches never collide on a file), and each trace records where on its branch it was made: the n-th
model call along the request's own chain, and the head of the call before it on that chain. A
reader follows ``parentHeadHash`` from a run's last trace back to its first to read one run alone.
Identical requests are the same point of the same branch: each is numbered as the call after what
precedes their common head (ten identical first requests are each call 1), never one after another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.session.store import SessionStore

# Model calls made along a chain, as of the head they were made at. A request's first call is counted by
# the store's ``begin_turn`` (``branch_counter``: one more than the nearest count before its head, so an
# identical earlier request is a sibling, not a parent), its proxy rounds by ``next_branch_turn``.
BRANCH_TURNS = "trace.branch_turns"


@dataclass(frozen=True)
class BranchTurn:
    """A model call's place on its branch: the n-th along the request's chain, after ``parent_head``."""

    number: int
    parent_head: str | None  # the head of the previous model call on this chain; None for the first

    def record(self) -> dict[str, Any]:
        """The trace's ``session.branch`` object."""
        return {"turn": self.number, "parentHeadHash": self.parent_head}


def branch_of(chain_hashes: Sequence[str]) -> str:
    """The branch a request's turn locks, given its chain hashes (``request_hashes``): its last message's."""
    return chain_hashes[-1]


async def next_branch_turn(store: SessionStore, context_id: str, head: str, previous: BranchTurn) -> BranchTurn:
    """The call after ``previous`` in the same request (a proxy-owned tool round), recorded at ``head``."""
    turn = BranchTurn(previous.number + 1, head)
    await store.put_state(context_id, head, BRANCH_TURNS, turn.number)
    return turn
