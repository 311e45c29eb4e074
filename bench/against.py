"""An earlier commit of the proxy served beside this one, so parts 1 and 2 measure both in the same run.

``python -m bench --parts 1,2 --against REF`` checks ``REF`` out into a detached git worktree in the
scratch folder and starts its proxy (``python -m proxy serve`` with that worktree first on the path) next
to ours. Part 1 rotates it into its order of paths; part 2 sends each request to the provider, to ours
and to it, one after another. So every comparison is taken under the same machine state, not against an
older report.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PATH_NAME = "dynamic-against"  # the earlier commit's proxy, in dynamic mode like ours


@contextmanager
def checkout(ref: str, scratch: Path) -> Iterator[tuple[Path, str]]:
    """``ref`` checked out (detached) under ``scratch``; yields the folder and the commit's short hash."""
    folder = scratch / "against"
    commit = _git("rev-parse", "--short", ref).strip()
    _git("worktree", "add", "--detach", str(folder), commit)
    try:
        yield folder, commit
    finally:
        _git("worktree", "remove", "--force", str(folder))


def ratio(ours: float, theirs: float) -> float:
    """``ours / theirs`` (infinite when theirs is zero)."""
    return ours / theirs if theirs else float("inf")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout
