"""Which model call of a client request is running: the turn itself, a proxy-tool round, the
summarizer or the overflow retry.

Record and replay (``proxy/replay/``) match a recorded provider exchange to the call that makes it
again by this tag. It travels in a ``ContextVar`` so that the turn service and the summarizer only say what
they are about to do (a line each) and nothing between them and the backend has to pass it on.
Without a recorder nobody reads it; setting a context variable costs nanoseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Literal

CallKind = Literal["turn", "tool_round", "summarizer", "overflow_retry"]


@dataclass(frozen=True)
class CallTag:
    """A model call's place in its client request: its kind and the proxy-tool round it belongs to."""

    kind: CallKind = "turn"
    round: int = 0  # 0: the client's own turn; k: the k-th proxy-owned tool round

    @property
    def key(self) -> str:
        """A stable name for matching: ``turn``, ``tool_round:2``, ``summarizer:0``, ``overflow_retry:1``."""
        return "turn" if self.kind == "turn" else f"{self.kind}:{self.round}"


_TAG: ContextVar[CallTag | None] = ContextVar("context_proxy_call_tag", default=None)  # None: the turn itself
# In shadow mode the provider gets the client's input; the candidate the proxy would have sent is
# offered here, built only if a recorder takes it.
_SHADOW: ContextVar[Callable[[], dict[str, Any]] | None] = ContextVar("context_proxy_shadow_candidate", default=None)


def current_tag() -> CallTag:
    """The tag of the model call about to be made."""
    return _TAG.get() or CallTag()


def begin_round(rounds: int) -> None:
    """The turn service starts the client's turn (0) or proxy-tool round ``rounds``."""
    _TAG.set(CallTag("turn" if rounds == 0 else "tool_round", rounds))


def begin_attempt(recovery: int) -> None:
    """The turn service starts an attempt of the current round: the first (0) or the overflow retry."""
    round_ = current_tag().round
    _TAG.set(
        CallTag("overflow_retry", round_) if recovery else CallTag("turn" if round_ == 0 else "tool_round", round_)
    )
    _SHADOW.set(None)


def offer_shadow_candidate(build: Callable[[], dict[str, Any]]) -> None:
    """In shadow mode: how to build the input the proxy would have sent (only a recorder builds it)."""
    _SHADOW.set(build)


def take_shadow_candidate() -> dict[str, Any] | None:
    """The shadow candidate of the current attempt, built now (``None`` outside shadow mode)."""
    build = _SHADOW.get()
    return build() if build is not None else None


@contextmanager
def summarizer_call() -> Iterator[None]:
    """Marks the summarizer's model call (inside whatever round assembles it)."""
    token = _TAG.set(replace(current_tag(), kind="summarizer"))
    shadow = _SHADOW.set(None)
    try:
        yield
    finally:
        _SHADOW.reset(shadow)
        _TAG.reset(token)
