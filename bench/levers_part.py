"""Part 7: one line per performance lever of issue 18, saying what it saved.

A lever is a public function named ``*_lever`` in ``bench/levers.py``, ``bench/levers_store.py``,
``bench/fast_path.py`` or any other ``bench/levers_*.py``. It takes no argument and returns
``{"lever": name, "before_ms": x, "after_ms": y, "what": "what was timed"}``: the same work timed
without and with the lever. Each runs in its own interpreter, so one lever's process state
(``gc.freeze``, caches, imported modules) never leaks into another's figures or into the other parts.
The levers the issue names are always listed: one whose function does not exist yet is reported as
"not measured", never given a number.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TIMEOUT_SECONDS = 600

# (module, function) -> label: the levers issue 18 asks for, in the order the report lists them.
EXPECTED = {
    ("bench.fast_path", "fast_path_lever"): "litellm fast path",
    ("bench.levers", "orjson_lever"): "orjson parse/encode",
    ("bench.levers", "gc_freeze_lever"): "gc.freeze after start-up",
    ("bench.levers_store", "begin_turn_lever"): "begin_turn: one store round trip",
    ("bench.levers_store", "prefix_reuse_lever"): "prefix token-count reuse",
}
KEYS = ("lever", "before_ms", "after_ms", "what")


def _module_path(module: str, folder: Path = HERE) -> Path:
    """``bench.name`` -> ``<folder>/name.py``."""
    return folder / f"{module.removeprefix('bench.')}.py"


def _lever_functions(path: Path) -> list[str]:
    """Top-level ``*_lever`` functions of a module file, read without importing it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.endswith("_lever")
        and not node.name.startswith("_")  # a private helper, not a lever
    ]


def discover(folder: Path = HERE) -> list[tuple[str, str, bool]]:
    """(module, function, exists) for every expected lever, then every other ``*_lever`` in ``folder``."""
    modules = ["bench.fast_path", "bench.levers", "bench.levers_store"]
    modules += sorted(f"bench.{p.stem}" for p in folder.glob("levers_*.py") if p.stem != "levers_part")
    found: dict[str, list[str]] = {}
    for module in dict.fromkeys(modules):
        path = _module_path(module, folder)
        found[module] = _lever_functions(path) if path.exists() else []
    out = [(module, function, function in found[module]) for module, function in EXPECTED]
    out += [
        (module, function, True)
        for module, functions in found.items()
        for function in functions
        if (module, function) not in EXPECTED
    ]
    return out


def validate(result: Any) -> dict[str, Any]:
    """The lever's result, checked against the interface; raises ``ValueError`` when it does not fit."""
    if not isinstance(result, dict) or any(key not in result for key in KEYS):
        raise ValueError(f"a lever must return a dict with {', '.join(KEYS)}; got {result!r:.300}")
    before, after = result["before_ms"], result["after_ms"]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in (before, after)):
        raise ValueError(f"before_ms and after_ms must be non-negative numbers; got {before!r}, {after!r}")
    return {
        "lever": str(result["lever"]),
        "status": "measured",
        "before_ms": float(before),
        "after_ms": float(after),
        "saved_ms": round(float(before) - float(after), 3),
        "what": str(result["what"]),
    }


def label(module: str, function: str) -> str:
    """The lever's name in the report when it gave none (not measured, failed)."""
    return EXPECTED.get((module, function), f"{module}.{function}")


def run_one(module: str, function: str, env: dict[str, str]) -> dict[str, Any]:
    """Run one lever in its own interpreter; a failure is reported with its own words, never as a number."""
    code = (
        "import importlib, json, sys\n"
        f"result = getattr(importlib.import_module({module!r}), {function!r})()\n"
        "sys.stdout.write('\\nLEVER-RESULT ' + json.dumps(result) + '\\n')\n"
    )
    name = label(module, function)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"lever": name, "status": "failed", "why": f"no answer within {TIMEOUT_SECONDS} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("LEVER-RESULT ")]
    if done.returncode != 0 or not lines:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        return {"lever": name, "status": "failed", "why": f"exit {done.returncode}: {tail[-500:]}"}
    try:
        return validate(json.loads(lines[-1].removeprefix("LEVER-RESULT ")))
    except ValueError as exc:  # json.JSONDecodeError is a ValueError too
        return {"lever": name, "status": "failed", "why": str(exc)}


def run_levers() -> dict[str, Any]:
    """Every lever's line for the report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCIENCE_AGENT_", "CONTEXT_PROXY_"))}
    env |= {"PYTHONPATH": str(REPO), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    levers = []
    for module, function, exists in discover():
        if exists:
            levers.append(run_one(module, function, env))
        else:
            levers.append(
                {
                    "lever": label(module, function),
                    "status": "not measured",
                    "why": f"{function}() is not in bench/{_module_path(module).name} yet",
                }
            )
    return {"levers": levers}
