"""Lever bound: what one ``litellm.acompletion`` call costs over a plain pooled HTTP POST of the same body.

The fast path (issue 18) keeps litellm's request/response transformation but skips its per-call
bookkeeping (cost calculation, logging set-up, the executor hop, client construction). Its saving is
bounded by this difference: the same chat body sent to the scripted provider (in its own process) by
``litellm.acompletion`` and by one shared ``httpx.AsyncClient`` whose answer is parsed with ``json``.
Both run in this process on one event loop, alternating in blocks so both see the same machine state.

Run alone: ``.venv/bin/python -m bench.fast_path`` (prints the lever's JSON).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from proxy.offline import prepare_offline_environment

prepare_offline_environment()

from bench import servers  # noqa: E402 - after the offline set-up
from bench.overhead import small_body  # noqa: E402

LEVER = "litellm fast path (bound)"


async def _measure(provider_url: str, calls: int, blocks: int) -> tuple[list[float], list[float]]:
    import httpx
    import litellm

    litellm.suppress_debug_info = True
    messages = small_body()["messages"]
    arguments: dict[str, Any] = {
        "model": "openai/scripted",
        "api_base": f"{provider_url}/v1",
        "api_key": "sk-provider",
        "messages": messages,
        "max_tokens": 16,
        "max_retries": 0,
        "num_retries": 0,
        "timeout": 60.0,
    }
    body = json.dumps({"model": "scripted", "messages": messages, "max_tokens": 16}).encode()
    headers = {"authorization": "Bearer sk-provider", "content-type": "application/json"}
    url = f"{provider_url}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=60.0) as client:

        async def via_litellm() -> None:
            response = await litellm.acompletion(**arguments)
            assert response.choices, "the provider answered without a choice"

        async def via_httpx() -> None:
            response = await client.post(url, content=body, headers=headers)
            response.raise_for_status()
            assert json.loads(response.content)["choices"], "the provider answered without a choice"

        async def timed(call: Any, count: int) -> list[float]:
            samples = []
            for _ in range(count):
                started = time.perf_counter()
                await call()
                samples.append((time.perf_counter() - started) * 1000)
            return samples

        await timed(via_litellm, 20)  # first calls pay imports, client set-up and caches
        await timed(via_httpx, 20)
        before: list[float] = []
        after: list[float] = []
        for block in range(blocks):
            first, second = (via_litellm, via_httpx) if block % 2 == 0 else (via_httpx, via_litellm)
            a = await timed(first, calls)
            b = await timed(second, calls)
            before += a if first is via_litellm else b
            after += b if first is via_litellm else a
    return before, after


def fast_path_lever(calls: int = 50, blocks: int = 6) -> dict[str, Any]:
    """Median per-call ms of ``litellm.acompletion`` (before) and a pooled httpx POST (after)."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-fast-path-") as scratch,
        servers.scripted_provider(Path(scratch), "ok") as provider,
    ):
        before, after = asyncio.run(_measure(provider.url, calls, blocks))
    return {
        "lever": LEVER,
        "before_ms": round(statistics.median(before), 3),
        "after_ms": round(statistics.median(after), 3),
        "what": f"median per call over {len(before)} calls each, a small chat to the scripted provider: "
        "litellm.acompletion (before) against one pooled httpx POST of the same body (after); "
        "the most a fast path that skips litellm's per-call work can save",
    }


if __name__ == "__main__":
    print(json.dumps(fast_path_lever()))
    sys.exit(0)
