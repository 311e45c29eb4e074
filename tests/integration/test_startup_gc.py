"""The app freezes its start-up objects out of the cyclic collector (issue 18, point 2).

Run in a fresh interpreter, so nothing else in the test process has frozen or created objects first:
the real app with its real litellm backend and SQLite store goes through its lifespan.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import asyncio, gc, json, sys, time
from pathlib import Path
from proxy.app import create_app
from proxy.kernel.config import ModelRoute, Settings

async def main():
    route = ModelRoute(model_name="m", litellm_params={"model": "openai/gpt-4o-mini", "api_key": "sk-test"})
    app = create_app(Settings(data_dir=Path(sys.argv[1]), models=(route,)))
    before, default = gc.get_freeze_count(), gc.get_threshold()
    async with app.router.lifespan_context(app):
        frozen, serving = gc.get_freeze_count(), gc.get_threshold()
        started = time.perf_counter()
        gc.collect()
        collect_ms = (time.perf_counter() - started) * 1000
    print(json.dumps({"before": before, "frozen": frozen, "after": gc.get_freeze_count(), "collect_ms": collect_ms,
                      "default": default, "serving": serving, "restored": gc.get_threshold()}))

asyncio.run(main())
"""


def test_after_start_up_litellm_s_objects_are_frozen_and_unfrozen_when_the_app_stops(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "data")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["before"] == 0
    assert counts["frozen"] > 100_000, counts  # litellm alone leaves ~378,000 tracked objects
    assert counts["after"] == 0, counts
    # While it serves, young collections come after 100,000 new objects instead of 700; then as before.
    assert counts["default"][0] == 700 and counts["serving"] == [100_000, *counts["default"][1:]], counts
    assert counts["restored"] == counts["default"], counts


def test_a_sent_answer_collects_what_outlived_the_turns_once_enough_has() -> None:
    import gc

    from proxy.process.startup_gc import AFTER_TURN_YOUNG, collect_after_turn

    gc.collect()
    kept = [{"n": n} for n in range(AFTER_TURN_YOUNG // 2)]  # survivors, but not enough yet
    before = gc.get_count()[0]
    collect_after_turn()
    assert gc.get_count()[0] >= before  # no collection: the young generation is left as it was
    kept += [{"n": n} for n in range(AFTER_TURN_YOUNG)]
    collect_after_turn()
    assert gc.get_count()[0] < AFTER_TURN_YOUNG // 10  # one young collection walked them (and moved them on)
    assert len(kept) == AFTER_TURN_YOUNG * 3 // 2


async def test_a_streamed_answer_is_followed_as_a_whole_one_is() -> None:
    # A stream's after-hook (chat's and Messages') collects what outlived the turns, as a whole answer's
    # does, then makes the next turn's copies; without the collection a stream-only agent's young
    # generation filled to the threshold, walked in the middle of some later turn.
    import gc

    from proxy.edge.after_answer import after_stream
    from proxy.process.startup_gc import AFTER_TURN_YOUNG

    class Memo:  # only the two members the hook reads of ``ResentRequests``
        wants_spares = True
        made = 0

        def make_spares(self) -> None:
            self.made += 1

    thresholds = gc.get_threshold()
    gc.set_threshold(1_000_000, *thresholds[1:])  # as while serving: no young collection of its own meanwhile
    try:
        gc.collect()
        kept = [{"n": n} for n in range(AFTER_TURN_YOUNG * 3 // 2)]  # survivors of earlier turns
        memo = Memo()
        await after_stream(memo)  # type: ignore[arg-type]
        assert gc.get_count()[0] < AFTER_TURN_YOUNG // 10  # one young collection walked them
        assert memo.made == 1 and len(kept) == AFTER_TURN_YOUNG * 3 // 2
    finally:
        gc.set_threshold(*thresholds)
