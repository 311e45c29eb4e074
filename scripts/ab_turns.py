"""A/B of two commits' proxies on what part 8 sends: the same requests, alternating, one scripted provider.

Starts the bench's scripted provider and two proxies as the bench starts them (``bench/servers.py``): A
from another checkout (a ``git worktree`` of the commit to compare with), B from this one. Then, round by
round in alternating order, sends each proxy the same turn and the provider the same chat request
directly, and prints the p50s, the added p50 of each proxy and B's added over A's. Interleaving makes
the two comparable on a shared, noisy machine where two separate bench runs are not.

It also prints each proxy's CPU time per round (its threads', from ``/proc``, over the timed rounds):
everything the proxy does for a round, the work after the answer is sent included. On a busy machine it
moves far less than a p50 does, so a change of a few percent shows there first.

- ``later`` (the default): an agent-shaped session's second turn (its first sent just before, untimed),
  as part 8's ``later`` cases;
- ``first``: an agent-shaped session's first turn, as part 8's ``agent`` cases;
- ``answer``: a tiny turn the provider answers in 120 streamed chunks, as part 8's ``answer`` cases;
  always streamed.

    git worktree add /tmp/base HEAD~1
    python scripts/ab_turns.py /tmp/base --rounds 40 [--stream] [--api chat|messages|responses] [--shape answer]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.agent import _body, timed_request  # noqa: E402  (the repo's bench, found through sys.path)
from bench.agent_shapes import APIS, endpoint  # noqa: E402
from bench.servers import our_proxy, scripted_provider, write_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="the checkout proxy A runs from")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--api", choices=APIS, default="chat")
    parser.add_argument("--shape", choices=("later", "first", "answer"), default="later")
    args = parser.parse_args()
    stream = args.stream or args.shape == "answer"
    if args.shape == "later":
        first, turn = _body("agent", args.api, stream), _body("agent", args.api, stream, later=True)
        direct = _body("agent", "chat", stream, later=True)
    else:
        shape = "agent" if args.shape == "first" else "answer"
        first, turn, direct = b"", _body(shape, args.api, stream), _body(shape, "chat", stream)
    scratch = Path(tempfile.mkdtemp(prefix="ab-turns-"))
    with scripted_provider(scratch) as provider:
        config = write_config(scratch, provider.url)
        base_env = {"PYTHONPATH": str(args.base.resolve())}
        with (
            our_proxy(scratch, config, "dynamic", extra_env=base_env, name="A") as a,
            our_proxy(scratch, config, "dynamic", name="B") as b,
            httpx.Client(timeout=120.0) as client,
        ):
            url = {"A": a.url + endpoint(args.api), "B": b.url + endpoint(args.api)}
            taken: dict[str, list[float]] = {"A": [], "B": [], "direct": []}
            warm = 5
            cpu_before: dict[str, float] = {}
            for index in range(warm + args.rounds):
                if index == warm:
                    cpu_before = {"A": process_cpu_ms(a.pid), "B": process_cpu_ms(b.pid)}
                order = ("A", "B") if index % 2 == 0 else ("B", "A")
                sample = {"direct": timed_request(client, provider.url + endpoint("chat"), "chat", direct, stream, "d")}
                for name in order:
                    session = f"ab-{name}-{index}"
                    if first:
                        timed_request(client, url[name], args.api, first, stream, session)
                    sample[name] = timed_request(client, url[name], args.api, turn, stream, session)
                if index >= warm:
                    for name, (_, last) in sample.items():
                        taken[name].append(last)
            cpu = {"A": process_cpu_ms(a.pid) - cpu_before["A"], "B": process_cpu_ms(b.pid) - cpu_before["B"]}
    p50 = {name: statistics.median(values) for name, values in taken.items()}
    added = {name: p50[name] - p50["direct"] for name in ("A", "B")}
    kind = "stream" if stream else "json"
    print(f"{args.shape} {args.api} {kind}, {args.rounds} rounds; direct p50 {p50['direct']:.2f} ms")
    for name in ("A", "B"):
        print(
            f"  {name}: p50 {p50[name]:.2f} ms, added {added[name]:.2f} ms = {added[name] / p50['direct']:.2f}x direct;"
            f" CPU {cpu[name] / args.rounds:.2f} ms a round"
        )
    print(f"  B/A added: {added['B'] / added['A']:.3f}; B/A CPU: {cpu['B'] / cpu['A']:.3f}")


def process_cpu_ms(pid: int) -> float:
    """The CPU time a process's live threads have run so far, in milliseconds: the scheduler's own count in
    nanoseconds (``/proc/<pid>/task/*/schedstat``), not ``/proc/<pid>/stat``'s 10 ms ticks, which gave two
    proxies the same figure round after round. A thread that ended is not counted (the proxy's are kept)."""
    total = 0
    for thread in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{thread}/schedstat", encoding="ascii") as schedstat:
                total += int(schedstat.read().split()[0])
        except FileNotFoundError:  # the thread ended between the listing and the read
            continue
    return total / 1e6


if __name__ == "__main__":
    main()
