"""Fixtures the turn-service tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.session.sqlite import SqliteSessionStore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteSessionStore]:
    """A real SQLite store in the test's folder, with a short lock timeout so a stuck lock fails fast."""
    opened = SqliteSessionStore(tmp_path / "store.db", lock_timeout_seconds=0.2)
    await opened.open()
    yield opened
    await opened.close()
