"""Part 5: the proxy's resident memory under many large, distinct tool outputs: a plateau, not growth.

Agents resend their whole history every turn, and each turn adds a tool output the proxy has never
seen. Anything the proxy keeps per message (a token-count cache, the chain memo of each session) must
be bounded by bytes, or resident memory grows with the traffic instead of levelling off. The client
here runs ``sessions`` agents round-robin, each turn appending one ``tool_bytes`` tool output
(distinct per session and step) and resending the session's whole history, every other turn streamed;
the proxy's RSS is read from ``/proc/<pid>/status`` at regular points.

The outputs are base64-like lines of letters: distinct bytes for every cache, yet cheap for the token
estimator (a few pieces per line), so the run measures memory rather than estimation speed.
"""

from __future__ import annotations

import hashlib
import string
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.servers import MASTER_KEY, MODEL

TOOL_OUTPUT_BYTES = 200_000
PLATEAU_MIB = 400.0
LINE_CHARS = 76
# Every byte value onto a letter: shake_256's bytes become letters-only lines.
_LETTERS = bytes(string.ascii_letters.encode()[i % 52] for i in range(256))
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "fetch_blob",
            "description": "Fetch a data blob of the sample.",
            "parameters": {"type": "object", "properties": {"sample": {"type": "string"}}},
        },
    }
]


def tool_output(session: int, step: int, size: int = TOOL_OUTPUT_BYTES) -> str:
    """A deterministic ``size``-byte output, distinct for every (session, step)."""
    header = f"# fetch_blob session={session} step={step}\n"
    raw = hashlib.shake_256(header.encode()).digest(max(0, size - len(header)))
    letters = raw.translate(_LETTERS).decode("ascii")
    lines = [letters[i : i + LINE_CHARS] for i in range(0, len(letters), LINE_CHARS + 1)]
    return header + "\n".join(lines)


def history(session: int, turns: int, size: int = TOOL_OUTPUT_BYTES) -> list[dict[str, Any]]:
    """The whole history an agent resends at its ``turns``-th turn: one tool step per earlier turn."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You analyse data blobs. Fetch one blob per step."},
        {"role": "user", "content": f"Analyse the blobs of sample S{session:04d}."},
    ]
    for step in range(turns):
        call_id = f"call_{session}_{step}"
        arguments = f'{{"sample": "S{session:04d}-{step}"}}'
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "fetch_blob", "arguments": arguments}}
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": tool_output(session, step, size)})
    return messages


def rss_mib(pid: int) -> float:
    """The process's resident set size in MiB (``VmRSS`` of ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def run_memory(
    proxy_url: str,
    pid: int,
    *,
    requests: int,
    sessions: int,
    tool_bytes: int = TOOL_OUTPUT_BYTES,
    samples: int = 10,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Send ``requests`` turns over ``sessions`` sessions; RSS before, at ``samples`` points, and after."""
    start = rss_mib(pid)
    points: list[dict[str, float]] = []
    failures = 0
    every = max(1, requests // samples)
    started = time.perf_counter()
    headers = {"authorization": f"Bearer {MASTER_KEY}"}
    with httpx.Client(base_url=proxy_url, headers=headers, timeout=120.0) as http:
        for number in range(requests):
            session, turn = number % sessions, number // sessions + 1
            # Every other turn streamed, as coding agents stream every call: what a stream keeps is measured too.
            stream = number % 2 == 1
            body = {"model": MODEL, "messages": history(session, turn, tool_bytes), "tools": TOOLS, "stream": stream}
            answer = http.post("/v1/chat/completions", json=body, headers={"x-session-id": f"memory-{session}"})
            failures += answer.status_code != 200 or (stream and not answer.content.endswith(b"data: [DONE]\n\n"))
            if (number + 1) % every == 0 or number + 1 == requests:
                points.append({"requests": number + 1, "rss_mib": round(rss_mib(pid), 1)})
                if progress is not None:
                    progress(f"memory: {number + 1} requests, RSS {points[-1]['rss_mib']} MiB")
    end = points[-1]["rss_mib"] if points else start
    # Growth over the second half: a plateau shows as close to zero whatever the request count.
    half = next((p["rss_mib"] for p in points if p["requests"] >= requests // 2), end)
    return {
        "requests": requests,
        "sessions": sessions,
        "tool_output_bytes": tool_bytes,
        "failures": failures,
        "start_rss_mib": round(start, 1),
        "end_rss_mib": end,
        "peak_rss_mib": max([start, *(p["rss_mib"] for p in points)]),
        "second_half_growth_mib": round(end - half, 1),
        "plateau_goal_mib": PLATEAU_MIB,
        "points": points,
        "seconds": round(time.perf_counter() - started, 1),
    }


def measure(
    scratch: Path, *, requests: int, sessions: int, tool_bytes: int = TOOL_OUTPUT_BYTES, samples: int = 10
) -> dict[str, Any]:
    """Start the scripted provider and ``python -m proxy serve`` (dynamic, traces off) and run the part."""
    import sys

    from bench import servers

    # The window holds a few whole outputs, so later turns also run the compactor (previews of old outputs).
    window = 8 * (tool_bytes // 4 * 3 + 1_000)
    with (
        servers.scripted_provider(scratch, "ok") as provider,
        servers.our_proxy(
            scratch, servers.write_config(scratch, provider.url, window), "dynamic", name="proxy-memory"
        ) as proxy,
    ):
        result = run_memory(
            proxy.url,
            proxy.pid,
            requests=requests,
            sessions=sessions,
            tool_bytes=tool_bytes,
            samples=samples,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    result["window_tokens"] = window
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.memory``: this part alone, with its sizes as options (prints JSON)."""
    import argparse
    import json
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--sessions", type=int, default=150)
    parser.add_argument("--tool-bytes", type=int, default=TOOL_OUTPUT_BYTES)
    parser.add_argument("--samples", type=int, default=10)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="context-proxy-memory-") as scratch:
        result = measure(
            Path(scratch),
            requests=args.requests,
            sessions=args.sessions,
            tool_bytes=args.tool_bytes,
            samples=args.samples,
        )
    print(json.dumps(result, indent=1))
    return 0 if result["failures"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
