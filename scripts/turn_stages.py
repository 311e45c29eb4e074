"""Where a later agent turn's wall time goes inside our proxy: the p50 of each stage, timed in ``serve``.

``stack_floor.py`` says how much of a later turn is the serving stack and how much is the proxy's own
work; this says which of the proxy's stages that work is in. It runs ``python -m proxy serve`` as the
bench runs it (``bench/servers.py``) with a timer around each stage below, sends it the first turn of a
new session and then that session's later turn, round after round (part 8's ``later`` case, one at a
time), and prints each stage's p50 over the later turns, beside the client's p50 and the direct call's.
The stages nest as listed (the indented ones are inside the one above them); what a stage's line does
not cover is the work between its parts (the rest of the handler: reading and checking the body,
bookkeeping, the answer's encoding).

    python scripts/turn_stages.py --rounds 300 [--api chat|messages|responses]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.agent import _body, timed_request  # noqa: E402  (the repo's bench, found through sys.path)
from bench.agent_shapes import APIS, endpoint  # noqa: E402
from bench.servers import our_proxy, scripted_provider, write_config  # noqa: E402

# (label, module, attribute path, depth): each timed around every call, in the ``serve`` process.
STAGES = (
    ("the ingress's handler", "proxy.ingress.chat.adapter", "ChatIngress.create", 0),
    ("front door: the turn", "proxy.ingress.front_door", "FrontDoor.run", 1),
    ("begin the turn (the store's transaction)", "proxy.session.sqlite", "SqliteSessionStore.begin_turn", 2),
    ("assembly", "proxy.runtime.session_assembler", "SessionAssembler.assemble", 2),
    ("the pipeline", "proxy.context.pipeline", "ContextPipeline.assemble", 3),
    ("the provider call", "proxy.provider.litellm_backend", "LiteLLMBackend.complete", 2),
    ("its POST (the provider's own time in it)", "proxy.provider.fast.openai", "post_json", 3),
)
_OTHER_HANDLERS = (
    ("proxy.ingress.messages.adapter", "MessagesIngress.create"),
    ("proxy.ingress.responses.adapter", "ResponsesIngress.create"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--api", choices=APIS, default="chat")
    parser.add_argument("--timed", type=Path, help=argparse.SUPPRESS)  # run serve with timers, write them here
    args, rest = parser.parse_known_args()
    if args.timed is not None:
        serve_timed(args.timed, rest)
    else:
        measure(args.rounds, args.api)


def measure(rounds: int, api: str) -> None:
    first, later = _body("agent", api, False), _body("agent", api, False, later=True)
    direct_body = _body("agent", "chat", False, later=True)
    scratch = Path(tempfile.mkdtemp(prefix="turn-stages-"))
    timings = scratch / "stages.json"
    launcher = [sys.executable, str(Path(__file__).resolve()), "--timed", str(timings)]
    client_ms: list[float] = []
    direct_ms: list[float] = []
    warm = 10
    with scripted_provider(scratch) as provider:
        config = write_config(scratch, provider.url)
        with our_proxy(scratch, config, "dynamic", launcher=launcher) as ours, httpx.Client(timeout=120.0) as client:
            url = ours.url + endpoint(api)
            for index in range(warm + rounds):
                direct = timed_request(client, provider.url + endpoint("chat"), "chat", direct_body, False, "direct")
                timed_request(client, url, api, first, False, f"stages-{index}")
                taken = timed_request(client, url, api, later, False, f"stages-{index}")
                if index >= warm:
                    client_ms.append(taken[1])
                    direct_ms.append(direct[1])
    stages = json.loads(timings.read_text(encoding="utf-8"))  # written when serve stopped
    direct_p50 = statistics.median(direct_ms)
    width = max(2 * depth + len(label) for label, _, _, depth in STAGES) + 1
    print(f"later agent turn, {api} json, {rounds} rounds, p50 wall time (ms)")
    print(f"  {'the client sees':<{width}} {statistics.median(client_ms):7.2f}   (the direct call: {direct_p50:.2f})")
    for label, _, _, depth in STAGES:
        calls = stages.get(label, [])
        later_calls = calls[1::2][warm:]  # each stage runs once a turn: first turn, later turn, ...
        if len(later_calls) < rounds:
            print(f"  {'  ' * depth}{label}: timed {len(calls)} times, not once a turn; left out")
            continue
        print(f"  {'  ' * depth}{label:<{width - 2 * depth}} {statistics.median(later_calls):7.2f}")


def serve_timed(out: Path, argv: list[str]) -> None:
    """``python -m proxy`` with ``argv``, each stage timed; the timings are written to ``out`` when it stops."""
    import importlib

    from proxy import cli

    taken: dict[str, list[float]] = {label: [] for label, *_ in STAGES}
    # Patched before the app is built: the routes take the handlers, and the modules their functions, then.
    for label, module_name, path, _ in STAGES:
        module = importlib.import_module(module_name)
        owner_name, _, name = path.rpartition(".")
        owner: Any = getattr(module, owner_name) if owner_name else module
        setattr(owner, name, _timed(getattr(owner, name), taken[label]))
    for module_name, path in _OTHER_HANDLERS:  # the Messages and Responses handlers count as the chat one
        owner = getattr(importlib.import_module(module_name), path.split(".")[0])
        owner.create = _timed(owner.create, taken[STAGES[0][0]])
    try:
        cli.main(argv)
    finally:
        out.write_text(json.dumps(taken), encoding="utf-8")


def _timed(function: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
    @functools.wraps(function)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await function(*args, **kwargs)
        finally:
            into.append((time.perf_counter() - started) * 1000)

    return timed


if __name__ == "__main__":
    main()
