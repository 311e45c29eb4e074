"""The heap trimmer: a trim after large bodies, at most one per interval, none for small traffic, and
after the first only once resident memory has grown by the allowance; glibc keeps what is freed until
a trim returns it."""

from __future__ import annotations

import ctypes
import ctypes.util
import subprocess
import sys
import threading
import time

from proxy.process.heap_trim import HeapTrimmer, glibc_keep_freed, glibc_trim, resident_bytes

MIB = 1024 * 1024


class _Trims:
    """A trim function that counts its calls and lets a test wait for the next one."""

    def __init__(self) -> None:
        self.calls = 0
        self._called = threading.Event()

    def __call__(self) -> int:
        self.calls += 1
        self._called.set()
        return 1

    def wait(self, seconds: float = 5.0) -> bool:
        called = self._called.wait(seconds)
        self._called.clear()
        return called


class _Resident:
    """A resident-memory reading a test sets (``level``), in bytes."""

    def __init__(self, level: int = 300 * MIB) -> None:
        self.level = level

    def __call__(self) -> int:
        return self.level


def test_a_large_body_is_followed_by_one_trim() -> None:
    trims = _Trims()
    trimmer = HeapTrimmer(trims, interval=0.05, large_bytes=1000)
    trimmer.start()
    try:
        trimmer.note_body(1000)
        assert trims.wait(), "no trim after a large body"
        assert trims.calls == 1 and trimmer.trims == 1
    finally:
        trimmer.stop()


def test_small_bodies_never_trim() -> None:
    trims = _Trims()
    trimmer = HeapTrimmer(trims, interval=0.02, large_bytes=1000)
    trimmer.start()
    try:
        for _ in range(50):
            trimmer.note_body(999)
        assert not trims.wait(0.3)
        assert trims.calls == 0
    finally:
        trimmer.stop()


def test_large_bodies_within_an_interval_share_one_trim() -> None:
    trims, resident = _Trims(), _Resident()
    trimmer = HeapTrimmer(trims, resident=resident, interval=0.3, large_bytes=1, allowance=10 * MIB)
    trimmer.start()
    try:
        for _ in range(20):
            trimmer.note_body(10)
        assert trims.wait()
        time.sleep(0.5)  # longer than the interval: nothing was read since, so nothing is due
        assert trims.calls == 1
        resident.level += 11 * MIB  # grown past the allowance: a later large body is trimmed after again
        trimmer.note_body(10)
        assert trims.wait()
        assert trims.calls == 2
    finally:
        trimmer.stop()


def test_after_the_first_trim_another_waits_until_resident_memory_grew_by_the_allowance() -> None:
    trims, resident = _Trims(), _Resident()
    trimmer = HeapTrimmer(trims, resident=resident, interval=0.02, large_bytes=1, allowance=64 * MIB)
    trimmer.start()
    try:
        trimmer.note_body(10)
        assert trims.wait(), "the first large body is always followed by a trim"
        resident.level += 60 * MIB  # a working set that fits the allowance: its pages stay resident
        for _ in range(5):
            trimmer.note_body(10)
            assert not trims.wait(0.1)
        assert trims.calls == 1
        resident.level += 5 * MIB  # 65 MiB over the level right after the trim
        trimmer.note_body(10)
        assert trims.wait()
        assert trims.calls == 2
    finally:
        trimmer.stop()


def test_the_allowance_counts_from_the_least_resident_level_since_the_last_trim() -> None:
    trims, resident = _Trims(), _Resident(300 * MIB)
    trimmer = HeapTrimmer(trims, resident=resident, interval=0.02, large_bytes=1, allowance=64 * MIB)
    trimmer.start()
    try:
        trimmer.note_body(10)
        assert trims.wait()
        resident.level = 250 * MIB  # memory went back by itself (the store's cache shrank, say)
        trimmer.note_body(10)
        assert not trims.wait(0.1)
        resident.level = 320 * MIB  # 70 MiB over 250, though only 20 over the level after the trim
        trimmer.note_body(10)
        assert trims.wait()
        assert trims.calls == 2
    finally:
        trimmer.stop()


def test_stop_ends_the_thread_and_a_trimmer_without_malloc_trim_does_nothing() -> None:
    trims = _Trims()
    trimmer = HeapTrimmer(trims, interval=10.0, large_bytes=1)
    trimmer.start()
    trimmer.note_body(5)  # due, but stopping wins over the interval's wait
    started = time.monotonic()
    trimmer.stop()
    assert time.monotonic() - started < 2 and trims.calls == 0
    assert not any(thread.name == "heap-trim" for thread in threading.enumerate())

    idle = HeapTrimmer(None, interval=0.01, large_bytes=1)
    idle.start()
    idle.note_body(5)
    idle.stop()
    assert idle.trims == 0


def test_this_machines_c_library_trims() -> None:
    # Linux with glibc (this project's machines): the real call, which returns 1 when it released memory
    # and 0 when there was none to release.
    trim = glibc_trim()
    assert trim is not None
    assert trim() in (0, 1)


def test_glibc_keeps_a_freed_block_resident_until_a_trim_returns_it() -> None:
    # The real C library: a 16 MiB block (under the 32 MiB mmap threshold ``glibc_keep_freed`` sets)
    # comes from the arena and stays resident when freed, instead of being unmapped or trimmed by free.
    assert glibc_keep_freed()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    libc.free.argtypes, libc.free.restype = [ctypes.c_void_p], None
    size = 16 * MIB
    block = libc.malloc(size)
    assert block
    ctypes.memset(block, 1, size)  # touched: its pages are resident
    touched = resident_bytes()
    libc.free(block)
    kept = resident_bytes()
    assert kept > touched - size // 2, f"free returned the block: {touched // MIB} -> {kept // MIB} MiB"
    trim = glibc_trim()
    assert trim is not None
    trim()
    assert resident_bytes() < kept - size // 2, "the trim did not return the freed block"


_WORKER_FREES = """
import ctypes, ctypes.util, threading
from proxy.process.heap_trim import glibc_keep_freed, glibc_trim, resident_bytes
assert glibc_keep_freed()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
libc.free.argtypes, libc.free.restype = [ctypes.c_void_p], None
touched = []
def allocate_touch_free():  # what a request-parse worker does with a large body's strings
    blocks = [libc.malloc(1 << 20) for _ in range(32)]
    for block in blocks:
        ctypes.memset(block, 1, 1 << 20)
    touched.append(resident_bytes())
    for block in blocks:
        libc.free(block)
worker = threading.Thread(target=allocate_touch_free)
worker.start()
worker.join()
glibc_trim()()
print(touched[0] - resident_bytes())
"""


def test_memory_a_worker_thread_freed_is_returned_by_a_trim() -> None:
    # In an arena of its own, a thread's freed blocks merge into that arena's top, which neither free (it
    # never trims now) nor malloc_trim returns: ``glibc_keep_freed`` puts every thread on the main arena.
    # A fresh process, as the proxy's is when its app starts: glibc takes the arena limit only for arenas
    # not made yet, and this test process has made some (its earlier tests' threads).
    done = subprocess.run([sys.executable, "-c", _WORKER_FREES], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    returned = int(done.stdout)
    assert returned > 16 * MIB, f"the trim returned {returned // MIB} MiB of the 32 MiB the worker freed"
