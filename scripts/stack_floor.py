"""What a later agent turn costs on our serving stack with nothing of ours in it, beside what it costs us.

Issue 42's later-turn goal (added p50 <= 3x the direct call's time) asks how much of a turn is the stack
every Python proxy here would pay and how much is the proxy's own work. This starts, beside the bench's
scripted provider and our proxy (``bench/servers.py``), two *floor* servers: uvicorn as ``serve`` runs
it (uvloop, httptools), a bare ASGI app, and the provider call over the same pooled client as the fast
path (``proxy/provider/pool.py``: httpx on litellm's aiohttp transport). ``plain`` relays the bytes;
``json`` also decodes and re-encodes the request and the answer with orjson, the least a proxy that reads
what it forwards does. Each round sends every server the first turn of a new session (untimed), then
its later turn (timed, its CPU counted as ``ab_turns.py`` counts it), and the provider the later turn's
chat request directly, in a rotated order. ``ours legacy`` is our proxy in legacy mode: everything a turn
does (the body read and checked, the store's turn, the provider call through litellm's steps, the trace's
bookkeeping) but the assembly, which sends the client's own request; between it and ``ours`` is what the
assembly costs.

    python scripts/stack_floor.py --rounds 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ab_turns import process_cpu_ms  # noqa: E402  (beside this script)

from bench.agent import _body, timed_request  # noqa: E402  (the repo's bench, found through sys.path)
from bench.agent_shapes import endpoint  # noqa: E402
from bench.servers import _base_env, _serve, our_proxy, scripted_provider, write_config  # noqa: E402
from proxy.provider.scripted import free_port  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # run a floor server on this port
    parser.add_argument("--provider", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_floor(args.serve, args.provider, args.json)
    else:
        compare(args.rounds)


def compare(rounds: int) -> None:
    first, later = _body("agent", "chat", False), _body("agent", "chat", False, later=True)
    scratch = Path(tempfile.mkdtemp(prefix="stack-floor-"))
    with scripted_provider(scratch) as provider:
        config = write_config(scratch, provider.url)
        floors = {}
        with (
            _floor(scratch, provider.url, json_too=False) as floors["floor plain"],
            _floor(scratch, provider.url, json_too=True) as floors["floor json"],
            our_proxy(scratch, config, "legacy", name="ours-legacy") as legacy,
            our_proxy(scratch, config, "dynamic", name="ours") as ours,
            httpx.Client(timeout=120.0) as client,
        ):
            servers = {**floors, "ours legacy": legacy, "ours": ours}
            names = list(servers)
            taken: dict[str, list[float]] = {name: [] for name in [*names, "direct"]}
            cpu = dict.fromkeys(names, 0.0)
            warm = 10
            for index in range(warm + rounds):
                direct = timed_request(client, provider.url + endpoint("chat"), "chat", later, False, "direct")
                shift = index % len(names)
                for name in names[shift:] + names[:shift]:
                    url, session = servers[name].url + endpoint("chat"), f"floor-{name}-{index}"
                    timed_request(client, url, "chat", first, False, session)
                    before = process_cpu_ms(servers[name].pid)
                    last = timed_request(client, url, "chat", later, False, session)[1]
                    if index >= warm:
                        taken[name].append(last)
                        cpu[name] += process_cpu_ms(servers[name].pid) - before
                if index >= warm:
                    taken["direct"].append(direct[1])
    p50 = {name: statistics.median(values) for name, values in taken.items()}
    print(f"later agent turn, chat json, {rounds} rounds; direct p50 {p50['direct']:.2f} ms")
    for name in names:
        added = p50[name] - p50["direct"]
        print(
            f"  {name}: p50 {p50[name]:.2f} ms, added {added:.2f} ms = {added / p50['direct']:.2f}x direct;"
            f" CPU {cpu[name] / rounds:.2f} ms a later turn (its work after the answer may fall outside)"
        )


def _floor(scratch: Path, provider_url: str, *, json_too: bool) -> Any:
    port = free_port()
    command = [sys.executable, __file__, "--serve", str(port), "--provider", provider_url]
    command += ["--json"] if json_too else []
    return _serve(f"floor-{'json' if json_too else 'plain'}", command, _base_env(), port, scratch)


def serve_floor(port: int, provider_url: str, json_too: bool) -> None:
    """A floor server: health for ``bench.servers``, every POST relayed to the provider's chat endpoint."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import orjson
    import uvicorn

    from proxy.provider.fast.surface import load
    from proxy.provider.pool import litellm_client

    clients: list[httpx.AsyncClient] = []  # made on the server's loop, on the first request

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "GET":  # /health/liveliness
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        if not clients:
            clients.append(litellm_client(load()))
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if json_too:
            body = orjson.dumps(orjson.loads(body))
        headers = {"content-type": "application/json", "authorization": "Bearer floor"}
        answer = await clients[0].post(f"{provider_url}/v1/chat/completions", content=body, headers=headers)
        out = orjson.dumps(orjson.loads(answer.content)) if json_too else answer.content
        start = {"type": "http.response.start", "status": answer.status_code}
        await send(start | {"headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", loop="uvloop", http="httptools", lifespan="off")


if __name__ == "__main__":
    main()
