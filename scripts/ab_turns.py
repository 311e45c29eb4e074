"""A/B of two commits' proxies on what part 8 sends: the same requests, alternating, one scripted provider.

Starts the bench's scripted provider and two proxies as the bench starts them (``bench/servers.py``): A
from another checkout (a ``git worktree`` of the commit to compare with), B from this one. Then, round by
round in alternating order, sends each proxy the same turn and the provider the same chat request
directly, and prints the p50s, the added p50 of each proxy and B's added over A's. Interleaving makes
the two comparable on a shared, noisy machine where two separate bench runs are not.

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
            for index in range(warm + args.rounds):
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
    p50 = {name: statistics.median(values) for name, values in taken.items()}
    added = {name: p50[name] - p50["direct"] for name in ("A", "B")}
    kind = "stream" if stream else "json"
    print(f"{args.shape} {args.api} {kind}, {args.rounds} rounds; direct p50 {p50['direct']:.2f} ms")
    for name in ("A", "B"):
        print(
            f"  {name}: p50 {p50[name]:.2f} ms, added {added[name]:.2f} ms = {added[name] / p50['direct']:.2f}x direct"
        )
    print(f"  B/A added: {added['B'] / added['A']:.3f}")


if __name__ == "__main__":
    main()
