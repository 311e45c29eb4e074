"""The provider adapter's two paths side by side: ``complete()`` through litellm's transformation layer
(the fast path) and through ``litellm.acompletion``, in process, against the scripted provider on loopback.

    python -m bench.provider_paths [calls]

``measure_paths(calls)`` returns, per path, the mean wall-clock and process-CPU milliseconds per call
(the scripted provider runs in a thread of the same process, so its CPU is included in both figures
alike; the difference between the paths is the adapter's). The report generator may call it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from proxy.demo.scripted_provider import Reply, ScriptedProvider, serve_in_thread
from proxy.runtime.provider import LiteLLMBackend

_MESSAGES = [
    {"role": "system", "content": "You are a careful lab assistant."},
    {"role": "user", "content": "Which buffer for the assay?"},
    {"role": "assistant", "content": "Phosphate, pH 7.4."},
    {"role": "user", "content": "And its concentration?"},
]


async def _run(backend: LiteLLMBackend, llm_input: dict[str, Any], calls: int) -> dict[str, float]:
    for _ in range(20):  # warm the pools, litellm's caches and the provider
        await backend.complete(llm_input)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        await backend.complete(llm_input)
    return {
        "wall_ms": (time.perf_counter() - wall) * 1000 / calls,
        "cpu_ms": (time.process_time() - cpu) * 1000 / calls,
    }


def measure_paths(calls: int = 500) -> dict[str, dict[str, float]]:
    """Mean wall-clock and CPU milliseconds per ``complete()`` on each path, ``calls`` calls each."""
    provider = ScriptedProvider(lambda body: Reply(content="0.1 M."))
    with serve_in_thread(provider.app()) as url:
        llm_input = {"model": "openai/scripted", "api_base": f"{url}/v1", "api_key": "sk-bench", "messages": _MESSAGES}

        async def both() -> dict[str, dict[str, float]]:
            results = {}
            for name, fast in (("acompletion", False), ("fast_path", True)):
                backend = LiteLLMBackend(timeout_seconds=30, fast_path=fast)
                try:
                    results[name] = await _run(backend, llm_input, calls)
                finally:
                    await backend.aclose()
            return results

        return asyncio.run(both())


def main(argv: list[str]) -> int:
    calls = int(argv[0]) if argv else 500
    results = measure_paths(calls)
    for name, figures in results.items():
        print(f"{name:12s} wall {figures['wall_ms']:.3f} ms/call  cpu {figures['cpu_ms']:.3f} ms/call")
    slow, fast = results["acompletion"], results["fast_path"]
    print(
        f"saved per call: wall {slow['wall_ms'] - fast['wall_ms']:.3f} ms, cpu {slow['cpu_ms'] - fast['cpu_ms']:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
