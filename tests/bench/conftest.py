"""``bench/`` is a folder of scripts, not an installed package: make it importable from the repo root."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
