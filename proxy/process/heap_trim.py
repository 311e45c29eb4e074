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
Waiting for a pause in the traffic, as the WAL checkpointer does, was tried: under steady large traffic
it kept more resident (50 MiB of growth against 37 in
``test_resident_memory_levels_off_under_many_large_distinct_tool_outputs``).

Returned pages cost the turn that touches them again: a page fault each, about 4.5 microseconds on
this machine's VMs. A 1,000-message turn that followed a trim took 15 ms longer to read its body (3,300
faults: the 13 MiB the trim had returned) and a 5,000-message one 30 to 50 ms; glibc's own trimming
when ``free`` leaves a large top chunk, and its moving mmap threshold, did the same at 5,000 messages
with no trim at all. Those turns were bench part 2's p99, at twice its p50 in a fast machine phase. So
glibc keeps what is freed (``glibc_keep_freed``: no trimming by ``free``, blocks under 32 MiB from the
arena, one arena for all threads) and the trimmer returns it only once the process holds ``allowance``
bytes more than it did after its last trim: traffic whose working set fits the allowance faults nothing
in after the first trim, and memory that creeps (large, distinct bodies) still goes back within a second
of passing it.
Without glibc (musl, macOS) there is no ``malloc_trim`` and the trimmer does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
from collections.abc import Callable
from typing import Any

from proxy.process.idle_priority import lower_this_thread

LARGE_BODY_BYTES = 1024 * 1024  # a request this large leaves megabytes of freed blocks behind
TRIM_INTERVAL_SECONDS = 1.0  # at most one trim a second: 0.1 to 4 ms of another thread's time each (measured)
# Resident growth since the last trim that makes the next one due. More than traffic moving up to 5,000-
# message histories adds to the working set: at 64 MiB, bench part 2 trimmed once in that step (424 ->
# 374 MiB), the trim held the arena lock for 48 ms beside a turn and the next turn faulted 4,400 pages
# back in, its two slowest warm requests. Bench part 5 (ending at 368 MiB) and the served memory test
# (+37 MiB) came out the same at 64 and at 128.
RESIDENT_ALLOWANCE_BYTES = 128 * 1024 * 1024

# mallopt's parameters (malloc.h) and the values ``glibc_keep_freed`` sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -3, -4, -8
_NEVER = -1  # a trim threshold of -1 (the largest size) turns trimming by ``free`` off
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's largest on 64-bit: a 12 MB body comes from an arena
_ONE_ARENA = 1  # the main arena, for every thread


@functools.cache
def _c_function(name: str, *argtypes: Any) -> Any | None:
    """The C library's function ``name`` taking ``argtypes`` and returning an int, or ``None`` where this
    process's C library has none (not glibc). Looked up once: ``find_library`` runs ``ldconfig``, and
    every app start (tests start hundreds) asks for the same two."""
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library("c")), name)
    except (OSError, AttributeError, TypeError):  # no C library found, or one without the function
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function


def glibc_trim() -> Callable[[], object] | None:
    """``malloc_trim(0)`` of the C library this process runs on, or ``None`` when it has none."""
    trim = _c_function("malloc_trim", ctypes.c_size_t)
    return None if trim is None else lambda: trim(0)


def glibc_keep_freed(*, map_none: bool = False) -> bool:
    """Make glibc keep freed memory for the process's next allocations, the trimmer being the one that
    returns it: ``free`` never trims an arena's top, and the mmap threshold stays at 32 MiB instead of
    following the largest block freed (a block it maps is unmapped when freed, faulted in when made
    again); and every thread allocates from the main arena: a thread's own arena keeps its top when
    ``free`` never trims, and ``malloc_trim`` returns only the free blocks inside it, not its top (a
    request-parse worker's decoded strings would stay resident for good). The threads take turns on
    the GIL anyway; side by side, one arena cost no latency we could measure. ``map_none``: no block is
    mapped at all, the largest too (orjson's document buffer for a 12 MB body is 92 MB); for a process that
    never trims, where resident memory may stay at its peak. Whether the C library took the settings
    (``False`` without glibc)."""
    mallopt = _c_function("mallopt", ctypes.c_int, ctypes.c_int)
    if mallopt is None:
        return False
    settings = [(_M_TRIM_THRESHOLD, _NEVER), (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX), (_M_ARENA_MAX, _ONE_ARENA)]
    if map_none:
        settings.append((_M_MMAP_MAX, 0))
    return all(mallopt(parameter, value) == 1 for parameter, value in settings)


def resident_bytes() -> int:
    """This process's resident memory (Linux's ``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class HeapTrimmer:
    """Trims the heap once a while after large bodies were read, when resident memory has grown by
    ``allowance`` since the last trim; ``note_body`` is called per request."""

    def __init__(
        self,
        trim: Callable[[], object] | None,
        *,
        keep_freed: Callable[[], object] | None = None,
        resident: Callable[[], int] = resident_bytes,
        interval: float = TRIM_INTERVAL_SECONDS,
        large_bytes: int = LARGE_BODY_BYTES,
        allowance: int = RESIDENT_ALLOWANCE_BYTES,
    ) -> None:
        self._trim = trim
        self._keep_freed = keep_freed  # applied when the thread starts: only a trimmer returns memory then
        self._resident = resident
        self.interval = interval
        self.large_bytes = large_bytes
        self.allowance = allowance
        self.trims = 0
        self._after_last_trim: int | None = None  # resident bytes right after the last trim
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
        if self._keep_freed is not None:
            self._keep_freed()
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
            if self._grown():
                self._trim()
                self.trims += 1
                self._after_last_trim = self._resident()

    def _grown(self) -> bool:
        """Whether the process holds ``allowance`` bytes more than right after the last trim (the first
        trim is always due). Memory that fell below that level since lowers it: the allowance counts
        from the least the process has held."""
        resident = self._resident()
        if self._after_last_trim is None or resident > self._after_last_trim + self.allowance:
            return True
        self._after_last_trim = min(self._after_last_trim, resident)
        return False
