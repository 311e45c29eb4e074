"""Serve the scripted provider in its own process, so the load generator never shares its GIL.

Run: ``python -m bench.scripted_server --port P [--script ok|science] [--context-window N]``

Besides the OpenAI routes of :class:`~proxy.provider.scripted.ScriptedProvider` it answers
``GET /bench/received?since=N``: the request bodies received from index ``N`` on, so the long run can
read exactly what the provider was sent without keeping the whole run in the client's memory twice.
``POST /bench/forget`` drops the bodies already read (a 200-step run would otherwise hold every
request of the passthrough-sized history).
"""

from __future__ import annotations

import argparse
import gc
import json
from typing import Any

import msgspec
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from proxy.process.drain import KEEP_ALIVE_SECONDS
from proxy.process.heap_trim import glibc_keep_freed
from proxy.process.startup_gc import YOUNG_THRESHOLD
from proxy.provider.scripted import Reply, Script, ScriptedProvider, ToolCall

SUMMARY_MARKER = "Write the checkpoint now."
CHECKPOINT_TEXT = """## Completed work
- Ran the scripted analysis steps so far; each step's log is stored.
## Evidence
- Yields stayed between 61% and 64% across the analysed samples.
## Decisions
- Keep the 298 K protocol.
## Failed or abandoned directions
- (none)
## Explicit pending conditions
- Finish all scheduled analysis steps.
## Optional directions
- (none)
## Next step
- Run the next analysis step."""


# A request whose text holds this marker is answered at length (part 8's ``answer`` shape): the answer an
# agent streams back is hundreds of chunks, and each costs a proxy what it costs to relay, not the request.
LONG_ANSWER_MARKER = "[answer at length]"
LONG_ANSWER_CHUNKS = 120  # the provider streams text 16 characters a chunk
LONG_ANSWER = "".join(f"step {index:04d} held. " for index in range(LONG_ANSWER_CHUNKS))  # 16 characters each,
# each different: litellm's stream wrapper refuses a model that repeats one chunk over and over


def ok_script(body: dict[str, Any]) -> Reply:
    """The smallest useful answer: what the overhead part measures is the path, not the model. A request
    whose last message asks for a long answer (``LONG_ANSWER_MARKER``) gets ``LONG_ANSWER``."""
    return Reply(content=LONG_ANSWER if _asks_at_length(body.get("messages")) else "ok")


def _asks_at_length(messages: Any) -> bool:
    """Whether the last message holds ``LONG_ANSWER_MARKER``. Only the end of the messages is read: part 2
    sends megabytes of them, and this runs on every request (skimmed, they are one JSON text)."""
    if isinstance(messages, msgspec.Raw):
        return LONG_ANSWER_MARKER.encode() in bytes(memoryview(messages)[-_MARKER_WINDOW:])
    last = messages[-1] if isinstance(messages, list) and messages else {}
    return isinstance(last, dict) and LONG_ANSWER_MARKER in str(last.get("content"))


_MARKER_WINDOW = 512  # bytes at the end of a skimmed request's messages the marker is looked for in


def science_script(body: dict[str, Any]) -> Reply:
    """The long run's model: always one more analysis step; a checkpoint when the proxy asks for a summary.

    The proxy's summarizer sends instructions plus a transcript ending in ``SUMMARY_MARKER`` and no tools;
    answering it with a valid checkpoint lets the compactor's summary path run instead of its fallback.
    """
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    if not body.get("tools") and SUMMARY_MARKER in str(last.get("content") or ""):
        return Reply(content=CHECKPOINT_TEXT)
    steps = sum(1 for m in messages if m.get("role") == "tool")
    return Reply(tool_calls=(ToolCall("run_analysis", {"sample": f"S{steps:03d}", "replicate": steps % 3}),))


SCRIPTS = {"ok": ok_script, "science": science_script}


class _Head(msgspec.Struct):
    """A chat request as a script that ignores the conversation needs it: the messages stay JSON text."""

    messages: msgspec.Raw
    model: str = ""
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None


_HEAD = msgspec.json.Decoder(_Head)


class LeanProvider(ScriptedProvider):
    """The scripted provider made cheap to run: the bench measures the proxy, not its stand-in for the LLM.

    A real model runs on other machines; this one shares the bench's two cores, so whatever CPU it spends on
    a request is in the direct call and in the proxy's call alike: subtracting the direct median takes out
    its median, but its jitter (the shared machine stretching its work) lands in the proxy's tail. With the
    stdlib's JSON a 1,000-message request cost it about 11 ms, and its own collector paused now and then.
    orjson decodes the body, and the token count is a quarter of the messages' compact JSON bytes.

    ``skim``, for a script that never reads the conversation (``ok``): the body is checked as JSON but its
    messages are not built into objects (msgspec keeps them as their text, a quarter of whose bytes is the
    count: the same for the proxy's compact JSON). Building them was most of a direct call (29 of 42 ms at
    5,000 messages), and freeing them after answering overlapped the proxy's end of the turn, which the
    other core's work slows (``bench/README.md``).
    """

    def __init__(self, script: Script, *, skim: bool = False, **options: Any) -> None:
        super().__init__(script, **options)
        self.skim = skim

    async def _read(self, request: Request) -> dict[str, Any]:
        raw = await request.body()
        if self.skim:
            head = _HEAD.decode(raw)
            return {
                "model": head.model,
                "stream": head.stream,
                "stream_options": head.stream_options,
                "messages": head.messages,
            }
        body: dict[str, Any] = orjson.loads(raw)
        return body

    def _count_prompt_tokens(self, body: dict[str, Any]) -> int:
        if self.token_scale is not None:
            return super()._count_prompt_tokens(body)
        messages = body.get("messages", [])
        return max(1, len(messages if isinstance(messages, msgspec.Raw) else orjson.dumps(messages)) // 4)


def build_app(provider: ScriptedProvider) -> Starlette:
    """The provider's routes plus the bench's read-back routes."""
    forgotten = 0  # bodies dropped from the front of provider.history, so indices stay absolute

    async def received(request: Request) -> Response:
        since = int(request.query_params.get("since", "0"))
        bodies = provider.history[max(0, since - forgotten) :]
        return Response(json.dumps({"next": forgotten + len(provider.history), "bodies": bodies}))

    async def forget(request: Request) -> Response:
        nonlocal forgotten
        forgotten += len(provider.history)
        provider.history.clear()
        return JSONResponse({"forgotten": forgotten})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    return Starlette(
        routes=[
            Route("/bench/received", received, methods=["GET"]),
            Route("/bench/forget", forget, methods=["POST"]),
            Route("/health/liveliness", health, methods=["GET"]),
            Mount("/", app=provider.app()),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    """Parse the options and serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", choices=sorted(SCRIPTS), default="ok")
    parser.add_argument("--context-window", type=int, default=None, help="refuse larger requests as overflow")
    parser.add_argument("--keep-history", action="store_true", help="keep request bodies (the long run reads them)")
    args = parser.parse_args(argv)
    # A provider that refuses by size counts like a tokenizer (tiktoken), as real ones do: its usage is what
    # the proxy calibrates from, and the long run judges "over the limit" in tiktoken tokens. Without a
    # window, a quarter of the JSON bytes is enough and costs the overhead runs nothing.
    scale = 1.0 if args.context_window is not None else None
    # The ok script never reads the conversation; the long run's does, and counts it with tiktoken.
    skim = args.script == "ok" and scale is None and not args.keep_history
    provider = LeanProvider(SCRIPTS[args.script], skim=skim, context_window=args.context_window, token_scale=scale)
    if not args.keep_history:
        # The overhead runs send tens of thousands of requests; nobody reads them back.
        provider.history = _Counter()
    # As the proxy does (proxy/process/startup_gc.py): start-up's objects out of every collection, and young
    # collections rare enough that a request's short-lived body is freed by reference counting, not walked.
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    # As the proxy does (proxy/process/heap_trim.py), and more: glibc keeps what a large body freed for the next one,
    # orjson's document buffer too, instead of mapping it anew and faulting it in (2,300 faults, a third of
    # the decode of a 5,000-message body, and its jitter). Nothing trims it: its peak is one large request.
    glibc_keep_freed(map_none=True)
    uvicorn.run(
        build_app(provider),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
    )


class _Counter(list):  # type: ignore[type-arg]
    """A ``history`` that only counts: ``ScriptedProvider`` numbers replies by ``len(history)``."""

    def __init__(self) -> None:
        super().__init__()
        self._count = 0

    def append(self, item: Any) -> None:
        self._count += 1

    def __len__(self) -> int:
        return self._count


if __name__ == "__main__":
    main()
