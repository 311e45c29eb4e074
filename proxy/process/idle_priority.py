"""Background maintenance runs on the CPU the requests leave idle.

Two threads keep the process healthy between requests: the SQLite store's WAL checkpointer
(``session/sqlite_checkpoints.py``) and the heap trimmer (``heap_trim.py``). Each burst is a few to
tens of milliseconds of work, and they run whenever their timer fires, often beside a turn. On a
two-core machine the turn's event loop, the store's thread and the client already share the cores, so
a checkpoint beside a turn slowed it by up to twice the checkpoint's length: in bench part 2, at 1,000
messages warm, the slowest two or three of a hundred requests were the ones a checkpoint or a trim
overlapped, and p99 came out at 2.2-2.4x p50. At nice 19 such a thread weighs 15 against a normal
thread's 1,024 in Linux's scheduler: it runs on a core no request wants, and when a request waits on it
(the trimmer holds malloc's arena lock while it trims one) that core is idle, so it runs then too. The
same runs with both threads lowered put p99 at about 1.6x p50.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

IDLE_NICE = 19  # the lowest priority an unprivileged thread can give itself


def lower_this_thread() -> None:
    """Run the calling thread at ``IDLE_NICE`` from now on (Linux only: elsewhere ``setpriority`` takes a
    process, not a thread, and lowering the whole proxy would slow the requests instead)."""
    if sys.platform != "linux":
        return
    with contextlib.suppress(OSError):  # a sandbox may refuse it: the thread then just runs as before
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), IDLE_NICE)
