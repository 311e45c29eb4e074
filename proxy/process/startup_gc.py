"""The collector's view of start-up: what exists once the app has started is frozen out of collections.

Importing litellm leaves about 378,000 objects the cyclic collector tracks, and they live as long as
the process. Every full collection walks all of them again: at thousands of messages a request makes
enough objects to trigger one on about 4 requests in 10, a 225-250 ms stall each time. ``gc.freeze()``
moves everything alive at that moment into a permanent generation that collections skip, so a full
collection walks only what requests made since.

No ``gc.collect()`` first: it would cost a full walk at every start (tests start hundreds of apps), and
what it would free is a little start-up garbage, kept instead until the app stops.

The young generation's threshold goes up with the freeze, from 700 to ``YOUNG_THRESHOLD``: a turn of a
long history makes tens of thousands of containers that live until it ends (the decoded body, its
copies, the turn's memos) and that reference counting frees then. At 700 the collector ran about ten
young and one older collection per 1,000-message turn, walking what was still in use and moving it into
older generations to be walked again; at 10,000 a 5,000-message turn still ran four or five young
collections and every other turn an older one, 15 to 40 ms a turn. At 100,000 a turn of up to about
5,000 messages runs none. What survives turns is collected once the client has its answer instead
(``collect_after_turn``, called when a chat answer, whole or streamed, is sent): a young collection as soon as
``AFTER_TURN_YOUNG`` objects have survived, which walks only those, so the young generation starts each
turn nearly empty. Only cyclic garbage waits longer for its collection, and the turn's one cycle that
held megabytes (httpx's response and its stream, which keep the provider request's body) is broken
where the pool's stream closes, and where litellm's SDK routes get their answer (``provider/pool.py``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 100_000  # new tracked objects between young collections (CPython's default is 700)
AFTER_TURN_YOUNG = 10_000  # objects left over from turns that a sent answer collects


def collect_after_turn() -> None:
    """A young collection when ``AFTER_TURN_YOUNG`` objects have survived since the last one (call it once
    a turn's own objects are freed: it then walks what outlives turns, not what a turn still uses)."""
    if gc.isenabled() and gc.get_count()[0] >= AFTER_TURN_YOUNG:
        gc.collect(0)


@contextmanager
def frozen_start_up() -> Iterator[None]:
    """Freeze what is alive now for the app's life; unfreeze it when the app stops.

    The collector is one per process: when another app of this process already froze (tests, replicas
    run side by side in one process), that freeze covers the start-up objects and this one does nothing.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], YOUNG_THRESHOLD), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()  # what the app made stays collectable after it stops (a test process goes on)
