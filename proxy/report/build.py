"""``context-proxy report``: read a trace folder (with a progress bar) and write the self-contained page."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from proxy.kernel.tenancy import team_of
from proxy.report.page import static_report
from proxy.report.progress import ProgressBar
from proxy.report.traces import TraceFolder, trace_files

__all__ = ["STATIC_TEXT_CAP", "ReportResult", "read_folder", "write_report"]

# Longest text of one message, section or item kept in the static page: every turn's whole input is
# there (each distinct message once), but one 2 MB tool output in it would not be worth the page size.
STATIC_TEXT_CAP = 4_000
# The embedded texts' budget: past it, long texts are cut shorter (down to 250 characters) so the page
# stays under 20 MB whatever the folder holds; the turn table and the numbers are never cut.
VALUES_BUDGET = 8_000_000


@dataclass(frozen=True)
class ReportResult:
    """What was written: the page's size, the files read and how long it took."""

    path: Path
    files: int
    sessions: int
    unreadable: int
    bytes: int
    seconds: float


def read_folder(
    root: Path, files: list[Path], *, with_details: bool, cap: int, progress: ProgressBar | None = None
) -> TraceFolder:
    """The trace ``files`` under ``root`` read into a ``TraceFolder``."""
    folder = TraceFolder(root)
    for path in files:
        folder.add(path, with_details, cap)
        if progress is not None:
            progress.step()
    return folder


def _fit(folder: TraceFolder, budget: int) -> None:
    cap = STATIC_TEXT_CAP
    while cap > 250 and sum(table.size() for table in folder.values.values()) > budget:
        cap //= 2
        for table in folder.values.values():
            table.recap(cap)


def write_report(
    traces: Path, out: Path, stderr: TextIO | None = None, cap: int = STATIC_TEXT_CAP, team: str | None = None
) -> ReportResult:
    """Read ``traces`` and write the report page to ``out`` (the progress bar on ``stderr``); with ``team``,
    only that team's sessions (``default``: the master key's)."""
    started = time.perf_counter()
    if not traces.is_dir():
        raise FileNotFoundError(f"no trace folder at {traces}")
    files = trace_files(traces)
    if team is not None:  # a session's folder is named by its context id, which names its team
        files = [path for path in files if team_of(path.parent.name) == team]
    progress = ProgressBar(stderr or sys.stderr, len(files), "reading traces")
    folder = read_folder(traces, files, with_details=True, cap=cap, progress=progress)
    progress.finish(f", {len(folder.unreadable)} unreadable" if folder.unreadable else "")
    _fit(folder, VALUES_BUDGET)
    title = f"Context proxy report: {traces.name}" + (f", team {team}" if team is not None else "")
    page = static_report(folder, title).encode("utf-8")
    out.parent.mkdir(parents=True, exist_ok=True)
    # The page holds what the traces hold (prompts, tool results): private like them.
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(page)
    sessions = len({t.context_id for t in folder.turns})
    return ReportResult(
        out, len(folder.turns), sessions, len(folder.unreadable), len(page), time.perf_counter() - started
    )
