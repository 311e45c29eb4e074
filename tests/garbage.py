"""What the cyclic collector would find: for tests that show an object is freed by reference counting."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_finds(*types: type) -> Iterator[list[object]]:
    """Yield a list that, once the block ends, holds the objects of ``types`` only a collection freed.

    The collector is stopped for the block, and what the collection at its end finds is kept in
    ``gc.garbage`` (``DEBUG_SAVEALL``) to be looked at, then cleared. Other threads (a provider's) may
    leave garbage of their own; only objects of ``types`` are listed."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    found: list[object] = []
    try:
        yield found
        gc.collect()
        found.extend(o for o in gc.garbage if isinstance(o, types))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
