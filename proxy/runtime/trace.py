"""Per-turn trace files: ``<trace-dir>/<context-id>/turn-0001.json`` (0600, folders 0700).

Traces hold user messages, tool results and full prompts: private local debugging data. Credentials
are removed from the recorded ``llmInput`` before anything is written (``redaction.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from proxy.runtime.redaction import redact_llm_input

__all__ = ["SCHEMA_VERSION", "TraceWriter", "redact_llm_input", "trace_file_name"]

SCHEMA_VERSION = 5


def trace_file_name(turn: int, recovery: int = 0) -> str:
    """``turn-0001.json``, or ``turn-0001-recovery-1.json`` for a forced retry of that turn."""
    suffix = f"-recovery-{recovery}" if recovery else ""
    return f"turn-{turn:04d}{suffix}.json"


class TraceWriter:
    """Writes one private JSON file per model call."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, context_id: str, turn: int, record: dict[str, Any], recovery: int = 0) -> Path:
        """Write ``record`` atomically (never over an earlier file of another attempt) and return its path."""
        folder = self.root / context_id
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        os.chmod(folder, 0o700)
        path = folder / trace_file_name(turn, recovery)
        temporary = folder / f".{path.name}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"schemaVersion": SCHEMA_VERSION, **record}, handle, ensure_ascii=False, indent=1, default=str)
        os.replace(temporary, path)
        return path
