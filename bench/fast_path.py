"""Lever: the provider adapter's fast path against ``litellm.acompletion``, per small call.

The fast path (issue 18, ``proxy/provider/fast/``) keeps litellm's request/response
transformation but skips its per-call bookkeeping (cost calculation, logging set-up, the executor hop,
client construction). Both paths are the product's own ``LiteLLMBackend.complete`` (``fast_path=False``
and ``True``), sending the same small chat to the scripted provider in its own process, on one event
loop, alternating in blocks so both see the same machine state. Wall time and this process's CPU time
are both reported (the provider's CPU is in the other process).

Run alone: ``.venv/bin/python -m bench.fast_path`` (prints the lever's JSON).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.process.offline import prepare_offline_environment

prepare_offline_environment()

from bench import servers  # noqa: E402 - after the offline set-up
from bench.overhead import small_body  # noqa: E402
from proxy.provider.litellm_backend import LiteLLMBackend  # noqa: E402

LEVER = "litellm fast path"


async def _measure(provider_url: str, calls: int, blocks: int) -> dict[str, dict[str, list[float]]]:
    llm_input: dict[str, Any] = {
        "model": "openai/scripted",
        "api_base": f"{provider_url}/v1",
        "api_key": "sk-provider",
        "messages": small_body()["messages"],
        "max_tokens": 16,
    }
    paths = {"acompletion": LiteLLMBackend(60.0, fast_path=False), "fast path": LiteLLMBackend(60.0, fast_path=True)}
    samples: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in paths}
    try:

        async def timed(name: str, count: int, keep: bool) -> None:
            for _ in range(count):
                wall, cpu = time.perf_counter(), time.process_time()
                answer = await paths[name].complete(llm_input)
                if keep:
                    samples[name]["wall"].append((time.perf_counter() - wall) * 1000)
                    samples[name]["cpu"].append((time.process_time() - cpu) * 1000)
                assert answer["choices"], "the provider answered without a choice"

        for name in paths:  # first calls pay imports, client set-up and litellm's caches
            await timed(name, 20, keep=False)
        for block in range(blocks):
            order = list(paths) if block % 2 == 0 else list(reversed(paths))
            for name in order:
                await timed(name, calls, keep=True)
    finally:
        for backend in paths.values():
            await backend.aclose()
    return samples


def fast_path_lever(calls: int = 50, blocks: int = 6) -> dict[str, Any]:
    """Median per-call wall ms of ``complete()`` through ``acompletion`` (before) and the fast path (after)."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-fast-path-") as scratch,
        servers.scripted_provider(Path(scratch), "ok") as provider,
    ):
        samples = asyncio.run(_measure(provider.url, calls, blocks))
    slow, fast = samples["acompletion"], samples["fast path"]
    return {
        "lever": LEVER,
        "before_ms": round(statistics.median(slow["wall"]), 3),
        "after_ms": round(statistics.median(fast["wall"]), 3),
        "what": f"median per call over {len(slow['wall'])} calls each, a small chat to the scripted provider "
        "through LiteLLMBackend.complete: litellm.acompletion (before) against the fast path (after); "
        f"CPU per call {statistics.median(slow['cpu']):.2f} -> {statistics.median(fast['cpu']):.2f} ms",
    }


def _best_ms(work: Callable[[Any], object], given: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` runs of ``work`` in milliseconds, each on a fresh ``given()`` made off the clock."""
    fastest = float("inf")
    for _ in range(repeats):
        argument = given()
        started = time.perf_counter()
        work(argument)
        fastest = min(fastest, time.perf_counter() - started)
    return round(fastest * 1000, 3)


def message_steps_lever(messages: int = 1_000, repeats: int = 30) -> dict[str, Any]:
    """Best-of ms of litellm's provider-independent message steps over a resent history (before) against
    the fast path's one pass for plain messages (after, ``proxy/provider/fast/messages.py``)."""
    from bench.assembly import make_history
    from proxy.provider.fast.messages import plain_messages
    from proxy.provider.fast.surface import load

    parts = load()
    config = parts["OpenAIGPTConfig"]()
    history = make_history(messages)

    def litellm_steps(given: list[dict[str, Any]]) -> object:
        fixed = parts["validate_and_fix_openai_messages"](messages=given)
        fixed = parts["get_completion_messages"](
            messages=fixed, ensure_alternating_roles=False, user_continue_message=None, assistant_continue_message=None
        )
        return config.translate_developer_role_to_system_role(
            messages=fixed,
            model="scripted",
            custom_llm_provider="openai",
            api_base="http://127.0.0.1:9/v1",
            model_info={},
        )

    def copies() -> list[dict[str, Any]]:
        return [dict(message) for message in history]  # the composer's copies, as each call has them

    return {
        "lever": "litellm message steps in one pass",
        "before_ms": _best_ms(litellm_steps, copies, repeats),
        "after_ms": _best_ms(plain_messages, copies, repeats),
        "what": f"best of {repeats}: litellm's message steps before the provider's transformation (validation, "
        f"the completion copy, the developer-role translation) over a {messages:,}-message history (before) "
        "against the fast path's one pass for plain messages (after)",
    }


def request_splice_lever(messages: int = 1_000, repeats: int = 30) -> dict[str, Any]:
    """Best-of ms of the OpenAI config's request transformation over a resent history's plain messages
    (before) against the request built without them and the messages spliced in (after,
    ``splices_messages`` in ``proxy/provider/fast/messages.py``)."""
    from bench.assembly import make_history
    from proxy.provider.fast.messages import plain_messages
    from proxy.provider.fast.surface import load

    parts = load()
    config = parts["OpenAIGPTConfig"]()
    litellm_params = parts["get_litellm_params"](
        api_key="sk-bench", custom_llm_provider="openai", api_base="http://127.0.0.1:9/v1", acompletion=True
    )
    plain = plain_messages(make_history(messages))
    assert plain is not None

    def build(given: list[Any]) -> dict[str, Any]:
        return config.transform_request(
            model="scripted",
            messages=given,
            optional_params={"max_tokens": 64},
            litellm_params=litellm_params,
            headers={},
        )

    def spliced(given: list[Any]) -> dict[str, Any]:
        data = build([])
        data["messages"] = list(given)
        return data

    return {
        "lever": "plain messages spliced into the OpenAI request",
        "before_ms": _best_ms(build, lambda: list(plain), repeats),
        "after_ms": _best_ms(spliced, lambda: list(plain), repeats),
        "what": f"best of {repeats}: the OpenAI config's transform_request over a {messages:,}-message history of "
        "plain text messages (before) against the request built without them and the messages put in (after)",
    }


if __name__ == "__main__":
    print(json.dumps(fast_path_lever()))
    print(json.dumps(message_steps_lever()))
    print(json.dumps(request_splice_lever()))
    sys.exit(0)
