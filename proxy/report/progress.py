"""A one-line progress bar on the terminal while the report reads trace files.

Drawn only on a terminal: when stderr is a file or a pipe (CI logs), only the final count is written,
so a log holds one line, not thousands of carriage returns.
"""

from __future__ import annotations

import time
from typing import TextIO

__all__ = ["ProgressBar"]

WIDTH = 30


class ProgressBar:
    """Counts ``total`` steps on ``stream``; redraws at most ten times a second."""

    def __init__(self, stream: TextIO, total: int, label: str) -> None:
        self.stream = stream
        self.total = total
        self.label = label
        self.done = 0
        self._live = stream.isatty()
        self._drawn = 0.0

    def step(self) -> None:
        """One more step done."""
        self.done += 1
        now = time.monotonic()
        if self._live and (now - self._drawn >= 0.1 or self.done == self.total):
            self._drawn = now
            filled = WIDTH * self.done // max(self.total, 1)
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] {self.done}/{self.total}")
            self.stream.flush()

    def finish(self, note: str = "") -> None:
        """End the bar's line, with ``note``."""
        prefix = "\r" if self._live else ""
        self.stream.write(f"{prefix}{self.label}: {self.done}/{self.total} files{note}\n")
        self.stream.flush()
