"""The README's first command, ``context-proxy demo``: it runs offline and shows the window respected."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.demo.run import LONG_RUN_WINDOW

LINE = re.compile(
    r"turn +\d+: client history +[\d,]+ messages, +([\d,]+) tokens -> provider got +\d+ messages, +([\d,]+) tokens"
)


def test_the_demo_outgrows_the_window_and_reads_step_one_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    turns = [(int(client.replace(",", "")), int(sent.replace(",", ""))) for client, sent in LINE.findall(out)]
    assert len(turns) >= 30
    # The client's history outgrows the window many times over; what the provider got never does.
    assert max(client for client, _ in turns) > 10 * LONG_RUN_WINDOW
    assert all(sent < LONG_RUN_WINDOW for _, sent in turns), [sent for _, sent in turns]
    assert "previews" in out and "checkpoint=True" in out
    assert "final answer: Done. Recovered from step 1: FACT-" in out
