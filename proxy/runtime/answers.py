"""What a turn answers, and the lock that answer may outlive the turn with.

An answer is one of two kinds (``Answer``): a whole completion, or a live stream relayed as it comes
(round by round when the model calls the proxy's own tools: ``proxy/runtime/rounds.py``).
``TurnService.run`` (``proxy/runtime/service.py``) releases the branch's ``TurnLock`` when the turn
returns, unless the answer took it over (``outlive``): a live stream owns the lock and releases it
when it ends, fails or is closed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from proxy.kernel.errors import SessionConflict
from proxy.runtime.session_identity import SessionIdentity
from proxy.session.store import SessionBusy

Release = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Completion:
    """A whole (non-streaming) answer: a chat completion, and for a native call (``runtime/native.py``) the
    provider's own answer, which the client gets (``response`` is its chat view, for the turn's bookkeeping)."""

    response: dict[str, Any]
    native: dict[str, Any] | None = None

    @property
    def message(self) -> dict[str, Any]:
        """The assistant message of the first choice."""
        return dict(self.response["choices"][0]["message"])

    def outlive(self, lock: TurnLock) -> None:
        """Nothing to hold: the answer is complete when the turn returns."""


class LiveStream(AsyncIterator[dict[str, Any]]):
    """A stream relayed as the provider sends it: the one kind of answer that holds the turn lock while
    the client reads it. It releases the lock when it ends, when reading it fails for any reason (a
    cancellation included), and when it is closed unread; ``aclose`` is safe to call twice."""

    def __init__(self, chunks: AsyncIterator[dict[str, Any]]) -> None:
        self._chunks = chunks
        self._release: Release | None = None

    def outlive(self, lock: TurnLock) -> None:
        """Own ``lock`` from now on: the turn returns while this stream is still being read."""
        self._release = lock.hand_over()

    async def __anext__(self) -> dict[str, Any]:
        try:
            return await self._chunks.__anext__()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Close the relay (the provider call, the trace), then release the lock."""
        try:
            aclose = getattr(self._chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            release, self._release = self._release, None
            if release is not None:
                await release()


Answer = Completion | LiveStream


@dataclass
class TurnResult:
    """A turn's answer (one of the two kinds) with the context headers.

    ``working`` is what the turn worked with (its request: the decoded history, the turn's memos), kept
    for the caller to drop once the answer is sent: freeing a long history's objects takes milliseconds,
    which the client then does not wait for."""

    identity: SessionIdentity
    mode: str
    answer: Answer
    working: object = None

    @property
    def headers(self) -> dict[str, str]:
        """``x-context-id`` and ``x-context-mode``, sent with every answer."""
        return {"x-context-id": self.identity.context_id, "x-context-mode": self.mode}


class TurnLock:
    """The turn lock of one branch, held by the turn until it returns or a live stream takes it over."""

    def __init__(self, lock: AbstractAsyncContextManager[None]) -> None:
        self._lock = lock
        self._held = False
        self._handed_over = False

    async def __aenter__(self) -> TurnLock:
        try:
            await self._lock.__aenter__()
        except SessionBusy as exc:
            raise SessionConflict(str(exc)) from exc
        self._held = True
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._handed_over:
            await self._release()

    def hand_over(self) -> Release:
        """Give up releasing at the end of the turn; the caller releases with what this returns."""
        self._handed_over = True
        return self._release

    async def _release(self) -> None:
        if self._held:
            self._held = False
            await self._lock.__aexit__(None, None, None)
