"""WAL checkpoints of the SQLite store, off the writer: no turn waits for one.

In WAL mode SQLite appends every commit to the ``-wal`` file and, by default, the commit that takes it
past 1,000 pages also copies those pages into the database and syncs it (an automatic checkpoint):
about 10 ms at the end of whichever turn happens to cross the line, which was one warm turn in ten at
1,000 messages, where a new session's first request writes megabytes. The writer connection turns that
off (``wal_autocheckpoint = 0``) and this thread, on a connection of its own, runs a ``PASSIVE``
checkpoint once the WAL has changed: it copies what no reader still needs while the writer goes on
appending (SQLite allows both at once), and sqlite3 releases the GIL while it works. The thread runs at
the lowest CPU priority (``proxy/process/idle_priority.py``) and waits for a quiet moment, a poll of ``quiet``
seconds in which nothing was written, before it checkpoints: a checkpoint is 15 to 60 ms of copying and
syncing, and even at nice 19 the turn it overlapped was slowed by about as much (bench part 2, 1,000
messages warm: at two checkpoints a second, those turns were the p99). Only writes that never pause for
that long make it run anyway, ``at_most`` seconds after the first write it has not copied. After a
complete checkpoint the writer's next transaction starts the WAL over, and ``journal_size_limit`` then
cuts a file a burst made large back to that size.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from pathlib import Path

from proxy.process.idle_priority import lower_this_thread

logger = logging.getLogger(__name__)

QUIET_SECONDS = 0.25  # a poll this long without a write: the store is between turns
AT_MOST_SECONDS = 10.0  # writes that never pause are checkpointed this long after the first one not copied
WAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024  # what a started-over WAL is cut back to (``journal_size_limit``)


def writer_pragmas(conn: sqlite3.Connection) -> None:
    """The writer's WAL settings: no checkpoint in its commits, a large WAL cut back once started over."""
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT_BYTES}")


class Checkpointer:
    """Checkpoints one database's WAL on a thread of its own; ``start`` after the file is in WAL mode."""

    def __init__(self, path: Path, quiet: float = QUIET_SECONDS, at_most: float = AT_MOST_SECONDS) -> None:
        self.path = path
        self.quiet = quiet
        self.at_most = at_most
        self.checkpoints = 0  # run so far (tests and diagnostics)
        self._wal = path.with_name(path.name + "-wal")
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="session-sqlite-checkpoint", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread (a checkpoint in progress finishes first); closing the store's last connection
        checkpoints what is left."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        lower_this_thread()  # a checkpoint runs on the CPU turns leave idle (proxy/process/idle_priority.py)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
        # The WAL as the last checkpoint left it (none yet: what the store left last time is copied too), and
        # as the last poll saw it.
        copied: tuple[int, int] | None = None
        polled = self._wal_state()
        waiting_since: float | None = None  # when a write not yet copied was first seen
        try:
            while not self._stopping.wait(self.quiet):
                state = self._wal_state()
                quiet, polled = state == polled, state
                if state is None or state == copied:
                    continue  # no WAL, or nothing written since the last checkpoint
                now = time.monotonic()
                waiting_since = now if waiting_since is None else waiting_since
                if not quiet and now - waiting_since < self.at_most:
                    continue  # turns are writing: wait for a pause
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    self.checkpoints += 1
                except sqlite3.Error as exc:  # the next round tries again; the writer is not held up
                    logger.warning("session store checkpoint of %s failed: %s", self.path, exc)
                copied = polled = self._wal_state()
                waiting_since = None
        finally:
            conn.close()

    def _wal_state(self) -> tuple[int, int] | None:
        with contextlib.suppress(FileNotFoundError):
            stat = self._wal.stat()
            return stat.st_mtime_ns, stat.st_size
        return None
