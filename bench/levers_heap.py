"""The heap lever (issue 18): what a large turn pays for the pages a heap trim returned just before it.

``proxy/process/heap_trim.py`` returns freed memory only once resident memory has grown by its allowance, where
it used to trim after every large body (at most once a second). A trim's pages are faulted back in by
the next turn that touches as much memory: this times that turn's body read (the socket's pieces joined,
then decoded and checked) right after a trim (before) against the same read with the memory kept
(after), alternated in one process with glibc keeping freed memory (``glibc_keep_freed``) both ways.
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from typing import Any

from proxy.edge.request_body import decode_body
from proxy.process.heap_trim import glibc_keep_freed, glibc_trim

MESSAGES = 1_000
PIECE = 65_536  # what uvicorn hands the app per read of a large body


def heap_kept_lever(messages: int = MESSAGES, repeats: int = 15) -> dict[str, Any]:
    """Median body read of a ``messages``-message chat request after a trim (before) and without (after)."""
    from bench.assembly import TOOLS, make_history

    raw = json.dumps({"model": "test-model", "messages": make_history(messages), "tools": TOOLS}).encode()
    trim = glibc_trim()
    if trim is None or not glibc_keep_freed():
        raise RuntimeError("no glibc here: the heap trimmer does nothing, so there is no lever to time")

    def read(trimmed: bool) -> tuple[float, int]:
        if trimmed:
            trim()  # what the trimmer did after the previous large body
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        started = time.perf_counter()
        pieces = [raw[at : at + PIECE] for at in range(0, len(raw), PIECE)]
        body = decode_body(b"".join(pieces))
        elapsed = time.perf_counter() - started
        del pieces, body  # freed before the next read, as a turn's body is when it ends
        return elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults

    read(trimmed=False)  # the first read makes the process's working set
    before, after = [], []
    for _ in range(repeats):  # alternated: the machine's drift falls on both alike
        before.append(read(trimmed=True))
        after.append(read(trimmed=False))
    return {
        "lever": "freed memory kept until it grows",
        "before_ms": round(statistics.median(ms for ms, _ in before) * 1000, 3),
        "after_ms": round(statistics.median(ms for ms, _ in after) * 1000, 3),
        "what": f"median of {repeats}, alternated: reading a {messages:,}-message body ({len(raw):,} bytes: pieces "
        "joined, decoded and checked) right after malloc_trim(0) (before) against with the freed memory kept (after)",
        "messages": messages,
        "page_faults_before": statistics.median(faults for _, faults in before),
        "page_faults_after": statistics.median(faults for _, faults in after),
    }


if __name__ == "__main__":  # python -m bench.levers_heap: the figure alone
    print(json.dumps(heap_kept_lever(), indent=1))
