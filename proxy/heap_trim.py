"""Giving freed heap memory back to the operating system after large requests.

A 1,000-message history is megabytes: a turn decodes it, copies parts of it through the stages, encodes
it again for the provider, then frees all of it. glibc's malloc keeps what was freed in its arenas (each
thread that allocates, the request-parse workers and the event loop, has its own), and once a large
block has been freed it raises its mmap threshold, so later large blocks come from those arenas too.
Resident memory then creeps up with traffic of large, distinct bodies while the Python heap stays flat:
in bench part 5 (3,000 requests of 200 KB tool outputs) RSS rose 85 MiB over the second half with 28
MiB traced by tracemalloc, and held level once the free pages were returned. ``malloc_trim(0)`` returns
the free pages of every arena.

``HeapTrimmer`` calls it on a thread of its own at the lowest CPU priority (ctypes releases the GIL for
the call, and ``idle_priority.py`` keeps it off the cores requests use), at most once per ``interval``
seconds and only after a body of at least ``large_bytes`` was read: small traffic never pays for it.
The pages a trim returns are faulted back in by the next large turn (10 to 50 ms at 1,000 to 5,000
messages), whenever the trim ran. Waiting for a pause in the traffic, as the WAL checkpointer does, was
tried: it spares no turn that cost, and under steady large traffic it kept more resident (50 MiB of
growth against 37 in ``test_resident_memory_levels_off_under_many_large_distinct_tool_outputs``), so a
trim still follows a large body within the second.
Without glibc (musl, macOS) there is no ``malloc_trim`` and the trimmer does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable

from proxy.idle_priority import lower_this_thread

LARGE_BODY_BYTES = 1024 * 1024  # a request this large leaves megabytes of freed blocks behind
TRIM_INTERVAL_SECONDS = 1.0  # at most one trim a second: 0.1 to 4 ms of another thread's time each (measured)


def glibc_trim() -> Callable[[], object] | None:
    """``malloc_trim(0)`` of the C library this process runs on, or ``None`` when it has none."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):  # no C library found, or one without malloc_trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


class HeapTrimmer:
    """Trims the heap once a while after large bodies were read; ``note_body`` is called per request."""

    def __init__(
        self,
        trim: Callable[[], object] | None,
        *,
        interval: float = TRIM_INTERVAL_SECONDS,
        large_bytes: int = LARGE_BODY_BYTES,
    ) -> None:
        self._trim = trim
        self.interval = interval
        self.large_bytes = large_bytes
        self.trims = 0
        self._due = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def note_body(self, size: int) -> None:
        """A request body of ``size`` bytes was read: a large one makes a trim due."""
        if size >= self.large_bytes:
            self._due.set()

    def start(self) -> None:
        """Start the trimming thread (nothing to do without ``malloc_trim``)."""
        if self._trim is None or self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="heap-trim", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; a trim in progress finishes first."""
        self._stopping.set()
        self._due.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        assert self._trim is not None  # started only with one
        lower_this_thread()  # a trim runs on the CPU requests leave idle (idle_priority.py)
        while True:
            self._due.wait()
            # Wait first: the turn that read the body frees it when it ends; later large bodies within the
            # interval are covered by the same trim.
            if self._stopping.wait(self.interval):
                return
            self._due.clear()
            self._trim()
            self.trims += 1
