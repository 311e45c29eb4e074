"""The SQLite store's files on disk: private to the user, and used by one process at a time.

The store holds every transcript and tool output, so its folder is 0700 and its files (the database,
its ``-wal`` and ``-shm``, the lock file) 0600; looser modes found at start are tightened and logged.
SQLite creates ``-wal`` and ``-shm`` with the database file's mode, which is why creating the
database file 0600 before SQLite opens it is enough for them.

Turns of a session are serialized by an in-process lock (see ``sqlite.py``), so a second process on
the same file would interleave its writes with ours unseen. An exclusive ``flock`` on a lock file
beside the database, taken when the store opens and held until it closes, refuses that second
process with a message saying what to do instead. The kernel drops the lock when its process dies, so
a crash never leaves the folder locked.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
from pathlib import Path

from proxy.session.store import StoreError

log = logging.getLogger("context_proxy.store")

FOLDER_MODE = 0o700
FILE_MODE = 0o600
SIDE_FILES = ("-wal", "-shm", "-journal")


class DataFolderInUse(StoreError):
    """Another process has this SQLite store open; the message says what to do instead."""

    def __init__(self, message: str, database: Path, holder: str) -> None:
        super().__init__(message)
        self.database = database
        self.holder = holder  # who has it, as the message says: "another process (pid 123)"


def private_folder(folder: Path) -> None:
    """Create ``folder`` 0700 if missing, else tighten it to 0700 when group or others have access."""
    try:
        folder.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
        _tighten(folder, FOLDER_MODE)
    except OSError as exc:
        raise StoreError(f"sqlite session store: cannot make {folder} private: {exc}") from exc


def private_database(path: Path) -> None:
    """Create the database file 0600 if missing; tighten it and its side files when they are looser."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE))
        for candidate in (path, *(path.with_name(path.name + suffix) for suffix in SIDE_FILES)):
            if candidate.exists():
                _tighten(candidate, FILE_MODE)
    except OSError as exc:
        raise StoreError(f"sqlite session store: cannot make {path} private: {exc}") from exc


def _tighten(path: Path, mode: int) -> None:
    current = stat.S_IMODE(path.stat().st_mode)
    if current & ~mode:
        os.chmod(path, current & mode)
        log.warning("tightened %s from %s to %s: the store holds private transcripts", path, oct(current), oct(mode))


class ProcessLock:
    """An exclusive ``flock`` on ``<database>.lock``, held from ``acquire`` to ``release``."""

    def __init__(self, database: Path) -> None:
        self.database = database
        self.path = database.with_name(database.name + ".lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock without waiting; ``DataFolderInUse`` when another process (or store) holds it."""
        if self._fd is not None:
            return
        try:
            # os.open's descriptors are not inherited by child processes, so a subprocess can never
            # keep the lock alive after this process ends.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        except OSError as exc:
            raise StoreError(f"sqlite session store: cannot open the lock file {self.path}: {exc}") from exc
        try:
            _tighten(self.path, FILE_MODE)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(_read_pid(fd))
            os.close(fd)
            raise DataFolderInUse(self._in_use_message(holder), self.database, holder) from None
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"sqlite session store: cannot lock {self.path}: {exc}") from exc
        # The holder's pid, for the message a refused process prints; informative only, never trusted.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def check(self) -> None:
        """Take and drop the lock at once: ``DataFolderInUse`` if another process holds it now."""
        self.acquire()
        self.release()

    def release(self) -> None:
        """Drop the lock (closing the descriptor releases it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _in_use_message(self, holder: str) -> str:
        return (
            f"the SQLite session store {self.database} is in use by {holder}: one process serves a SQLite data "
            "folder, since turns are serialized in memory. Stop the other process, give this one its own "
            "SCIENCE_AGENT_DATA_DIR, or run several replicas on the PostgreSQL store "
            "(CONTEXT_PROXY_STORE_URL=postgresql://..., see docs/deployment.md)."
        )


def _holder(pid: int | None) -> str:
    return f"another process (pid {pid})" if pid is not None and pid != os.getpid() else "another store"


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
