"""In-process measures of the cheap-plumbing levers (issue 18, point 2), one function per lever.

Each returns plain numbers in milliseconds (best of ``repeats``, the figure least disturbed by other jobs
on a shared machine) with the lever off and on, and what it saved, for the report to print as a line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from proxy.edge.request_body import _decode_reference, decode_body
from proxy.edge.resent_requests import ResentRequests
from proxy.kernel import jsonio

MESSAGES = 1_000
FILLER = "Step {n}: the readings of instrument ü agree within 0.2 %; the log says {n} rows were kept. "


def chat_body(messages: int = MESSAGES, repeat: int = 30) -> dict[str, Any]:
    """A chat request of ``messages`` messages, about 2.5 kB each at the default ``repeat``."""
    history = [
        {"role": "user" if n % 2 == 0 else "assistant", "content": FILLER.format(n=n) * repeat} for n in range(messages)
    ]
    return {"model": "test-model", "messages": history, "temperature": 0.2, "stream": False}


def orjson_lever(messages: int = MESSAGES, repeats: int = 15) -> dict[str, Any]:
    """Decoding a request body and encoding a body of the same size: the standard library against orjson.

    The decode is the whole edge check (``decode_body``: depth, surrogates, finite numbers) both ways;
    the encode is what Starlette's ``JSONResponse`` did against ``jsonio.dumps``.
    """
    body = chat_body(messages)
    raw = json.dumps(body).encode()  # as the Python SDKs send it: ASCII escapes
    stdlib_parse = _best_ms(lambda: _decode_reference(raw, 64), repeats)
    orjson_parse = _best_ms(lambda: decode_body(raw), repeats)
    stdlib_encode = _best_ms(
        lambda: json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode(), repeats
    )
    orjson_encode = _best_ms(lambda: jsonio.dumps(body), repeats)
    return {
        "lever": "orjson parse/encode",
        "before_ms": round(stdlib_parse + stdlib_encode, 3),
        "after_ms": round(orjson_parse + orjson_encode, 3),
        "what": f"best of {repeats}: decode (the whole edge check) plus encode of a {messages:,}-message chat body "
        f"({len(raw):,} bytes), standard library (before) against orjson (after)",
        "messages": messages,
        "body_bytes": len(raw),
        "stdlib_parse_ms": stdlib_parse,
        "orjson_parse_ms": orjson_parse,
        "stdlib_encode_ms": stdlib_encode,
        "orjson_encode_ms": orjson_encode,
        "saved_ms": round(stdlib_parse + stdlib_encode - orjson_parse - orjson_encode, 3),
    }


_GC_SCRIPT = """
import gc, json, time
from proxy.process.offline import prepare_offline_environment
prepare_offline_environment()
import litellm
def requests_in_flight():
    return [{"role": "user", "content": [{"type": "text", "text": str(n)}]} for n in range(%(live)d)]
def best():
    times = []
    for _ in range(%(repeats)d):
        started = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - started) * 1000)
    return min(times)
live = requests_in_flight()
unfrozen = best()
live = None
gc.freeze()  # what the app does once started: litellm's objects, not the requests' ones
frozen = gc.get_freeze_count()
live = requests_in_flight()
print(json.dumps({"unfrozen_ms": unfrozen, "frozen_ms": best(), "frozen_objects": frozen}))
"""


def gc_freeze_lever(live_objects: int = 5_000, repeats: int = 5) -> dict[str, Any]:
    """A full ``gc.collect()`` in a fresh process that imported litellm, without and with ``gc.freeze()``.

    ``live_objects`` dicts stand in for what requests in flight hold: the objects a collection still walks
    once the start-up ones are frozen. A fresh process, so the bench's own objects are not counted.
    """
    script = _GC_SCRIPT % {"live": live_objects, "repeats": repeats}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "lever": "gc.freeze after start-up",
        "before_ms": round(figures["unfrozen_ms"], 3),
        "after_ms": round(figures["frozen_ms"], 3),
        "what": f"one full gc.collect() in a fresh process that imported litellm, {live_objects:,} live objects, "
        f"without (before) and with (after) gc.freeze() of {figures['frozen_objects']:,} start-up objects",
        "live_objects": live_objects,
        "frozen_objects": figures["frozen_objects"],
        "collect_unfrozen_ms": round(figures["unfrozen_ms"], 3),
        "collect_frozen_ms": round(figures["frozen_ms"], 3),
        "saved_ms": round(figures["unfrozen_ms"] - figures["frozen_ms"], 3),
    }


def validation_reuse_lever(messages: int = MESSAGES, repeats: int = 15) -> dict[str, Any]:
    """The chat edge's decode and checks of a resent history (the previous turn's messages plus two new
    ones): the whole body decoded, every message validated, then digested again by the chain memo
    (before), against the resent prefix recognized by its bytes, neither decoded, validated nor digested
    again, and only the new messages decoded, validated and digested (after, ``proxy/edge/resent_requests.py``
    and ``proxy/edge/known_messages.py``)."""
    from proxy.ingress.chat.wire import parse_chat_request
    from proxy.kernel.canonical import exact_digest

    previous_raw, raw = _resent_bodies(messages)
    resent = ResentRequests()
    edge = _chat_edge(resent)

    def full() -> None:
        whole = decode_body(raw)
        parse_chat_request(whole)
        [exact_digest(message) for message in whole["messages"]]  # the chain memo's own digests

    def reused() -> None:
        edge(previous_raw)  # the previous turn, outside the clock
        resent.make_spares()  # what follows its answer: its request placed
        started = time.perf_counter()
        edge(raw)
        timings.append(time.perf_counter() - started)

    timings: list[float] = []
    before = _best_ms(full, repeats)
    for _ in range(repeats):
        reused()
    after = round(min(timings) * 1000, 3)
    return {
        "lever": "resent prefix neither decoded nor validated again",
        "before_ms": before,
        "after_ms": after,
        "what": f"best of {repeats}: the edge's decode and checks of a resent {messages:,}-message history "
        "(2 new messages), the whole body decoded and every message validated and digested again (before) "
        "against the resent prefix recognized by its bytes and only the new messages decoded, validated and "
        "digested (after)",
        "messages": messages,
        "saved_ms": round(before - after, 3),
    }


def spare_copies_lever(messages: int = MESSAGES, repeats: int = 15) -> dict[str, Any]:
    """The chat edge's decode of a resent history (the previous turn's messages plus two new ones) when
    the turn copies the remembered messages itself (before) against the copy made between the turns
    (``ResentRequests.make_spares``, outside the clock) and taken ready (after)."""
    previous_raw, raw = _resent_bodies(messages)
    resent = ResentRequests()
    edge = _chat_edge(resent)

    def turn(spare: bool) -> float:
        edge(previous_raw)  # the previous turn, outside the clock,
        resent.make_spares()  # its answer sent: its request placed (and a spare made, which ...
        edge(previous_raw)  # ... a retry of it takes: it is remembered again, with no spare yet)
        if spare:
            resent.make_spares()
        started = time.perf_counter()
        edge(raw)
        return time.perf_counter() - started

    before, after = [], []
    for _ in range(repeats):  # alternated: the machine's drift falls on both alike
        before.append(turn(spare=False))
        after.append(turn(spare=True))
    return {
        "lever": "resent copies made between turns",
        "before_ms": round(min(before) * 1000, 3),
        "after_ms": round(min(after) * 1000, 3),
        "what": f"best of {repeats}, alternated: the edge's decode and checks of a resent {messages:,}-message "
        "history (2 new messages), the turn copying the remembered messages itself (before) against the copy "
        "made after the previous answer and taken ready (after)",
        "messages": messages,
    }


def _resent_bodies(messages: int) -> tuple[bytes, bytes]:
    """A turn's chat body over a ``messages``-message history, and the next turn's, which resends it with
    the answer and a new user message."""
    from bench.assembly import TOOLS, make_history

    previous = make_history(messages)
    history = [*previous, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
    body = {"model": "test-model", "messages": history, "tools": TOOLS, "max_tokens": 64}
    return json.dumps({**body, "messages": previous}).encode(), json.dumps(body).encode()


def _chat_edge(resent: ResentRequests) -> Callable[[bytes], None]:
    """What the chat route does with a body (``proxy/app._parse``): decode it through ``resent``, check it,
    remember it."""
    from proxy.edge.known_messages import KnownMessages
    from proxy.ingress.chat.wire import check_chat_request

    known = KnownMessages()

    def edge(raw: bytes) -> None:
        decoded = resent.decode(raw)
        _, digests = check_chat_request(decoded.body, known, decoded.resent, decoded.resent_digests)
        assert digests is not None
        resent.remember(decoded, digests)

    return edge


def _best_ms(work: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 3)


if __name__ == "__main__":  # python -m bench.levers: the figures alone
    print(
        json.dumps(
            {"orjson": orjson_lever(), "gc_freeze": gc_freeze_lever(), "validation": validation_reuse_lever()},
            indent=1,
        )
    )
