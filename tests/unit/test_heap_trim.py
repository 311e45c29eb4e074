"""The heap trimmer: a trim after large bodies, at most one per interval, none for small traffic."""

from __future__ import annotations

import threading
import time

from proxy.heap_trim import HeapTrimmer, glibc_trim


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
    trims = _Trims()
    trimmer = HeapTrimmer(trims, interval=0.3, large_bytes=1)
    trimmer.start()
    try:
        for _ in range(20):
            trimmer.note_body(10)
        assert trims.wait()
        time.sleep(0.5)  # longer than the interval: nothing was read since, so nothing is due
        assert trims.calls == 1
        trimmer.note_body(10)  # a later large body is trimmed after again
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
