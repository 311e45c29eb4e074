"""``context-proxy replay``: replay, print the verdict, write the page, choose the exit code."""

from __future__ import annotations

import sys
from pathlib import Path

from proxy.kernel.config import ConfigError, Settings
from proxy.replay.page import render
from proxy.replay.replay import replay
from proxy.replay.verdict import judge


def run_replay(folders: list[Path], settings: Settings, out: Path | None, max_changed: int | None) -> int:
    """Replay ``folders`` with ``settings``; 0 when no turn failed and at most ``max_changed`` changed."""
    if max_changed is not None and max_changed < 0:
        raise ConfigError(f"--max-changed={max_changed} must be 0 or more")
    try:
        verdict = judge(replay(folders, settings))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for turn in verdict.turns:
        if turn.status != "identical":
            delta = turn.tokens_after - turn.tokens_before
            why = "; ".join(turn.reasons)
            print(f"{turn.session} turn {turn.number}: {turn.status} ({why}; tokens {delta:+,}) {turn.error}".rstrip())
    print(verdict.summary())
    if out is not None:
        out.write_text(render(verdict), encoding="utf-8")
        print(f"verdict page: {out}", file=sys.stderr)
    return verdict.exit_code(max_changed)
