"""The report page at scale: write a folder of synthetic traces, time ``context-proxy report`` on it.

Run: ``.venv/bin/python -m bench.report_page [--sessions 100] [--turns 50] [--output-bytes 1500]``
(the default is 5,000 trace files). Each session is a shadow run whose client resends its whole,
growing history (a tool output of ``--output-bytes`` per step) and whose candidate keeps the last 20
messages, so files grow as real traces do. Goal: under 30 s and a page under 20 MB for 5,000 files.
Not part of ``python -m bench``: it measures the report, not the proxy.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.report.build import write_report


def _trace(session: int, turn: int, history: list[dict[str, Any]]) -> dict[str, Any]:
    candidate = [history[0], *history[-20:]]
    client = sum(len(json.dumps(m)) for m in history) // 4
    sections = [
        {
            "id": "identity",
            "title": "Identity",
            "source": "identity",
            "protected": True,
            "order": 0,
            "slot": 0,
            "text": "You are a lab agent. " * 20,
        },
        {
            "id": "capabilities",
            "title": "Capabilities",
            "source": "capabilities",
            "protected": False,
            "order": 0,
            "slot": 30,
            "text": "Tools offered in this call: run_step, read_tool_output.",
        },
    ]
    return {
        "schemaVersion": 5,
        "contextId": f"bench-{session:04d}",
        "contextIdSource": "header:x-session-id",
        "turn": turn,
        "mode": "shadow",
        "scope": "main",
        "model": "bench-model",
        "selectedPath": "dynamic",
        "budgets": {
            "modelMaxTokens": 32000,
            "outputReserveTokens": 2000,
            "contextWindowTokens": None,
            "effectiveInputTokens": 30000,
            "source": "config",
        },
        "session": {"headHash": f"{turn:064x}", "knownMessages": len(history) - 2, "newMessages": 2, "forked": False},
        "contributors": [{"id": "identity", "status": "ok", "durationMs": 0.1, "error": "", "rawOutput": {}}],
        "collection": {"sections": sections, "messages": [], "attachments": []},
        "admitted": {
            "sections": sections,
            "messages": [],
            "attachments": [],
            "diagnostics": [],
            "promptTokens": 120,
            "messageTokens": 0,
        },
        "renderedContext": {
            "prompt": "\n".join(s["text"] for s in sections),
            "sectionIds": ["identity", "capabilities"],
            "callHistory": candidate,
            "tools": [],
            "window": {"statistics": {"keptMessages": len(candidate)}, "diagnostics": []},
        },
        "compaction": {
            "reason": "pressure" if turn % 10 == 0 else None,
            "tokensBefore": client,
            "tokensAfter": 0,
            "compactedRefs": [],
            "summarySourceTokens": 0,
            "checkpointTokens": 0,
            "attempts": 0,
            "rejections": [],
            "summarizedMessages": 0,
        },
        "summarizerCalls": [],
        "estimatedTokens": sum(len(json.dumps(m)) for m in candidate) // 4,
        "clientTokens": client,
        "assemblyMs": 3.5,
        "providerMs": 800.0,
        "llmInput": {"model": "openai/bench", "messages": history},
    }


def write_traces(root: Path, sessions: int, turns: int, output_bytes: int) -> int:
    """Write ``sessions`` x ``turns`` trace files under ``root``; returns their total size in bytes."""
    total = 0
    for s in range(sessions):
        history: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a lab agent."},
            {"role": "user", "content": f"Run protocol {s}."},
        ]
        folder = root / f"bench-{s:04d}"
        folder.mkdir(parents=True)
        for t in range(1, turns + 1):
            call = {"id": f"c{t}", "type": "function", "function": {"name": "run_step", "arguments": f'{{"step":{t}}}'}}
            history.append({"role": "assistant", "content": None, "tool_calls": [call]})
            history.append(
                {"role": "tool", "tool_call_id": f"c{t}", "content": f"step {t} of session {s}: " + "x" * output_bytes}
            )
            data = json.dumps(_trace(s, t, history), indent=1).encode()
            (folder / f"turn-{t:04d}.json").write_bytes(data)
            total += len(data)
    return total


def main(argv: list[str] | None = None) -> int:
    """Write the synthetic folder, run the report on it, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--output-bytes", type=int, default=1500)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="report-bench-") as tmp:
        root = Path(tmp) / "traces"
        size = write_traces(root, args.sessions, args.turns, args.output_bytes)
        started = time.perf_counter()
        result = write_report(root, Path(tmp) / "report.html", stderr=io.StringIO())
        seconds = time.perf_counter() - started
    files = args.sessions * args.turns
    print(
        f"{files} trace files ({size / 1e6:.0f} MB) -> page {result.bytes / 1e6:.1f} MB in {seconds:.1f} s "
        f"(goals: < 30 s, < 20 MB: {'met' if seconds < 30 and result.bytes < 20e6 else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
