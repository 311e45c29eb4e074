"""Per-turn trace files: ``<trace-dir>/<context-id>/turn-0001.json``, a team's under
``<trace-dir>/teams/<team>/<context-id>/`` (files 0600, folders 0700).

Traces hold user messages, tool results and full prompts: private local debugging data. Credentials
are removed from the recorded ``llmInput`` before anything is written (``redaction.py``).

Writing a trace is best-effort: a trace that cannot be written (a full or unwritable folder, a value
that cannot be encoded) is logged and counted in ``TraceWriter.failures``, and the answer it
describes goes out unchanged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from proxy.kernel.tenancy import trace_folder
from proxy.provider.redaction import redact_llm_input

__all__ = ["SCHEMA_VERSION", "TraceWriter", "redact_llm_input", "trace_file_name"]

log = logging.getLogger("context_proxy.trace")

SCHEMA_VERSION = 5


def trace_file_name(turn: int, recovery: int = 0) -> str:
    """``turn-0001.json``, or ``turn-0001-recovery-1.json`` for a forced retry of that turn."""
    suffix = f"-recovery-{recovery}" if recovery else ""
    return f"turn-{turn:04d}{suffix}.json"


class TraceWriter:
    """Writes one private JSON file per model call; counts the writes that failed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.failures = 0

    def write(self, context_id: str, turn: int, record: dict[str, Any], recovery: int = 0) -> Path | None:
        """Write ``record`` atomically (never over an earlier file of another attempt) and return its path;
        ``None`` (logged, counted) when it could not be written."""
        folder = self.root / trace_folder(context_id)  # a team's under teams/<team>/
        path = folder / trace_file_name(turn, recovery)
        temporary = folder / f".{path.name}.tmp"
        try:
            # Encoded before any file is touched: a value that cannot be encoded leaves nothing behind.
            text = json.dumps({"schemaVersion": SCHEMA_VERSION, **record}, ensure_ascii=False, indent=1, default=str)
            data = text.encode("utf-8")
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            for made in (self.root, *reversed(folder.relative_to(self.root).parents[:-1]), folder):
                os.chmod(self.root / made, 0o700)
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(temporary, path)
        except (OSError, ValueError, TypeError, RecursionError) as exc:  # UnicodeError is a ValueError
            self.failures += 1
            log.warning("trace %s not written (%d failed so far): %s", path, self.failures, exc)
            _discard(temporary)
            return None
        return path


def _discard(path: Path) -> None:
    with contextlib.suppress(OSError):  # the folder itself is unusable: there is nothing to clean up
        path.unlink(missing_ok=True)
