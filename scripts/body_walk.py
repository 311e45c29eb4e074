"""The walk of a chat request's body through the proxy: which modules see it, in order.

Serves one small ``POST /v1/chat/completions`` through the real app (uvicorn in a thread, the scripted
provider behind it) and profiles the server thread: a *stop* is a call of a function of ``proxy/`` that
receives the request's body as an argument: the decoded dict, a copy of it, its ``messages`` list, or an
object one of whose fields is one of those (a turn's request, a call record).
It prints the modules in the order the body first reaches them, then the counts (stops, modules, the
parameter names the body travels under). Works on any commit since the chat route existed, so a layout
change can be measured before and after: ``PYTHONPATH=<checkout> python scripts/body_walk.py``.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx

MODEL = "body-walk-model"
WITH_MESSAGES = "--with-messages" in sys.argv  # also follow the history list itself into the store and assembly


def _scripted() -> Any:
    """The scripted provider module, wherever this commit keeps it."""
    for name in ("proxy.provider.scripted", "proxy.demo.scripted_provider"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise SystemExit("no scripted provider in this checkout")


def main() -> None:
    """Serve one request and print the body's walk."""
    import proxy
    from proxy.app import create_app

    config_module = next(
        importlib.import_module(name) for name in ("proxy.kernel.config", "proxy.config") if _importable(name)
    )
    scripted = _scripted()
    root = Path(proxy.__file__).parent
    provider = scripted.ScriptedProvider(lambda body: scripted.Reply(content="ok"))
    stops: list[tuple[str, str, str]] = []
    tracked: dict[int, object] = {}

    def is_body(value: object) -> bool:
        if id(value) in tracked:
            return True
        if isinstance(value, dict) and value.get("model") == MODEL and "messages" in value:
            tracked[id(value)] = value
            if WITH_MESSAGES:
                messages = value.get("messages")
                if isinstance(messages, list):
                    tracked[id(messages)] = messages
            return True
        return False

    def carries(value: object) -> bool:
        """The body itself, or an object one of whose fields is the body (a turn's request, a call record)."""
        if is_body(value):
            return True
        fields = getattr(value, "__dict__", None)
        if isinstance(fields, dict):
            return any(id(field) in tracked for field in fields.values())
        slots = getattr(type(value), "__slots__", ())
        return any(id(getattr(value, slot, None)) in tracked for slot in slots if isinstance(slot, str))

    entered: dict[int, FrameType] = {}  # a coroutine's frame is "called" again at every resumption: count it once

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or id(frame) in entered:
            return
        entered[id(frame)] = frame
        path = frame.f_code.co_filename
        if not path.startswith(str(root)):
            return
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        names = code.co_varnames[:count]
        carried = [name for name in names if carries(frame.f_locals.get(name))]
        if carried:
            module = str(Path(path).relative_to(root.parent))
            stops.append((module, code.co_name, ",".join(carried)))

    active = threading.Event()

    def profiling(frame: FrameType, event: str, arg: Any) -> None:
        if active.is_set():
            profile(frame, event, arg)

    with scripted.serve_in_thread(provider.app()) as provider_url:
        route = config_module.ModelRoute(
            model_name=MODEL,
            litellm_params={"model": "openai/scripted", "api_base": f"{provider_url}/v1", "api_key": "sk-walk"},
            max_input_tokens=16_000,
            max_output_tokens=2_000,
        )
        settings = config_module.Settings(data_dir=Path(tempfile.mkdtemp(prefix="body-walk-")), models=(route,))
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello."}]}
        threading.setprofile(profiling)  # the proxy's server thread, started next, is profiled
        try:
            with scripted.serve_in_thread(create_app(settings)) as url:
                httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).raise_for_status()  # warm up
                active.set()
                answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
                active.clear()
                answer.raise_for_status()
        finally:
            threading.setprofile(None)  # type: ignore[arg-type]
    order: list[str] = []
    for module, _, _ in stops:
        if module not in order:
            order.append(module)
    for number, module in enumerate(order, 1):
        functions = sorted({f"{function}({names})" for found, function, names in stops if found == module})
        print(f"{number:2d}. {module}: {', '.join(functions)}")
    names = {name for _, _, carried in stops for name in carried.split(",")}
    hops = [module for index, (module, _, _) in enumerate(stops) if index == 0 or stops[index - 1][0] != module]
    entries = {module: hops.count(module) for module in order}
    busiest = max(entries, key=lambda module: entries[module])
    print(f"{len(stops)} stops in {len(order)} modules under {len(names)} names; {len(hops)} hops between modules")
    print(f"most re-entered: {busiest}, {entries[busiest]} times")


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
