"""``proxy.process.idle_priority``: the maintenance threads (WAL checkpoints, heap trims) run at the lowest CPU
priority, and only they do: the thread serving requests keeps its own."""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest

from proxy.process.heap_trim import HeapTrimmer
from proxy.process.idle_priority import IDLE_NICE, lower_this_thread
from proxy.session.sqlite_wal import Checkpointer

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread priorities are Linux's")


def _nice(native_id: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, native_id)


def _nice_of_thread(name: str, seconds: float = 5.0) -> int | None:
    """The nice value of the running thread called ``name`` once it has lowered itself (None: no such thread)."""
    give_up = time.monotonic() + seconds
    while time.monotonic() < give_up:
        found = [t for t in threading.enumerate() if t.name == name and t.native_id is not None]
        if found and _nice(found[0].native_id) == IDLE_NICE:  # type: ignore[arg-type]
            return IDLE_NICE
        time.sleep(0.01)
    return _nice(found[0].native_id) if found else None  # type: ignore[arg-type]


def test_a_lowered_thread_runs_at_idle_priority_and_the_caller_keeps_its_own() -> None:
    before = _nice(threading.get_native_id())
    seen: list[int] = []

    def lowered() -> None:
        lower_this_thread()
        seen.append(_nice(threading.get_native_id()))

    worker = threading.Thread(target=lowered)
    worker.start()
    worker.join()
    assert seen == [IDLE_NICE]
    assert _nice(threading.get_native_id()) == before, "the whole process was lowered, not one thread"


def test_the_wal_checkpointer_thread_runs_at_idle_priority(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
    before = _nice(threading.get_native_id())
    checkpointer = Checkpointer(path, quiet=0.01)
    checkpointer.start()
    try:
        assert _nice_of_thread("session-sqlite-checkpoint") == IDLE_NICE
    finally:
        checkpointer.stop()
    assert _nice(threading.get_native_id()) == before


def test_the_heap_trimmer_thread_runs_at_idle_priority() -> None:
    trimmer = HeapTrimmer(lambda: 1, interval=0.01)
    trimmer.start()
    try:
        assert _nice_of_thread("heap-trim") == IDLE_NICE
    finally:
        trimmer.stop()
