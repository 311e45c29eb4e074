"""A streamed answer on the fast path: the provider's chunks, read as the route's litellm handler reads them,
turned into litellm's by litellm's own ``CustomStreamWrapper``, as ``acompletion`` does.

- ``openai/``, ``azure/``: the openai SDK's own ``AsyncStream`` (its chunk objects, its error events;
  ``StreamChunks.wrapper``), as llms/openai/openai.py and llms/azure/azure.py ``async_streaming`` do; its
  chunk objects built faster where they come out the same (``ChunkReader``).
- ``anthropic/``: litellm's ``ModelResponseIterator`` (llms/anthropic/chat/handler.py ``make_call``), handed
  to ``StreamChunks.wrap`` by the route.

What the fast path leaves out is litellm's call bookkeeping: the wrapper is handed ``StreamLog`` instead of
litellm's logging object, so no success or failure callback, cost calculation or cache write runs (the
proxy configures none of them; the chunks the caller sees do not depend on them).
"""

from __future__ import annotations

import datetime
import functools
import typing
from typing import Any

import httpx
import openai
import pydantic
from openai.types.chat import ChatCompletionChunk


class StreamChunks:
    """Turns an open provider stream into the iterator ``acompletion`` returns for it."""

    def __init__(self, parts: dict[str, Any]) -> None:
        self._parts = parts
        self._sdk: openai.AsyncOpenAI | None = None  # made on the first stream: a backend may never stream
        self._wrapper = built_inline(parts["CustomStreamWrapper"], built_once(parts["stream_chunk_builder"]))

    def wrapper(
        self,
        response: httpx.Response,
        *,
        model: str,
        provider: str,
        messages: list[Any],
        litellm_params: dict[str, Any],
        stream_options: dict[str, Any] | None,
        requested_options: dict[str, Any] | None,
    ) -> Any:
        """litellm's ``CustomStreamWrapper`` over the SDK's ``AsyncStream`` of ``response`` (an OpenAI-shaped SSE)."""
        if self._sdk is None:
            # The SDK's stream reads its client for two things only: its SSE decoder and the chunk construction.
            self._sdk = ChunkReader(api_key="unused", base_url="http://127.0.0.1:9/unused")
        sdk_stream = openai.AsyncStream(cast_to=ChatCompletionChunk, response=response, client=self._sdk)  # type: ignore[arg-type]
        return self.wrap(
            _closing(sdk_stream, response),
            dict(response.headers),
            model=model,
            provider=provider,
            messages=messages,
            litellm_params=litellm_params,
            stream_options=stream_options,
            requested_options=requested_options,
        )

    def wrap(
        self,
        completion_stream: Any,
        response_headers: Any,
        *,
        model: str,
        provider: str,
        messages: list[Any],
        litellm_params: dict[str, Any],
        stream_options: dict[str, Any] | None,
        requested_options: dict[str, Any] | None,
    ) -> Any:
        """litellm's ``CustomStreamWrapper`` over ``completion_stream`` (the provider's chunks as the handler
        hands them over), as the handler builds it: ``stream_options`` what the handler passes the wrapper,
        ``requested_options`` the caller's own (litellm's logging object keeps those, and the wrapper reads
        them there: whether the caller asked for usage, and the options of a handler that passes none)."""
        log = StreamLog(model, provider, messages, litellm_params, requested_options)
        wrapper = self._wrapper(
            completion_stream=completion_stream,
            model=model,
            custom_llm_provider=provider,
            logging_obj=log,
            stream_options=stream_options,
            _response_headers=response_headers,
        )
        # The wrapper's own decision (absent: assumed, and built as before): whether its end-of-stream build
        # can reach the caller at all, through the usage chunk (``built_once``).
        log.sends_usage = getattr(wrapper, "send_stream_usage", True) is not False
        return wrapper


class ChunkReader(openai.AsyncOpenAI):
    """The client an SDK stream builds its chunk objects with: the very objects the SDK's own client builds.

    The SDK's client builds each chunk with ``construct_type``, which reads the model's annotations anew
    for every value: 150 us for a one-word chunk, more than half of what a chunk costs on its way to the
    client, and an agent's answer is hundreds of chunks. A chunk that strict pydantic validation accepts
    as it is (each value already of its field's type, each literal one of its values) is built by that
    validation instead, in 5 us, then made what ``construct_type`` makes of it (``_as_the_sdk_builds``):
    the same classes holding the same values, the same extra keys and the same fields sets. Anything
    strict validation refuses (an ``int`` where a ``float`` is declared, a finish reason the SDK does not
    list) is built by ``construct_type`` as before. ``tests/provider/test_stream_chunk_reader.py`` holds
    the two to that over generated chunks, and fails when an SDK upgrade changes what
    ``construct_type`` builds."""

    def _process_response_data(self, *, data: object, cast_to: type[Any], response: Any) -> Any:
        if cast_to is ChatCompletionChunk and type(data) is dict:
            try:
                return _as_the_sdk_builds(ChatCompletionChunk.model_validate(data, strict=True))
            except pydantic.ValidationError:
                pass
        return super()._process_response_data(data=data, cast_to=cast_to, response=response)


def _as_the_sdk_builds(chunk: ChatCompletionChunk) -> ChatCompletionChunk:
    """``chunk`` (validated) as the SDK's ``construct_type`` builds it. That constructs the chunk and each
    model a field holds directly or in a list, and validates the value of a field typed as a union (an
    optional one) with pydantic, as here. pydantic counts a model's extra keys in its fields set, the SDK's
    construction does not: so they are taken out of the constructed models' fields sets, and only theirs."""
    pending: list[pydantic.BaseModel] = [chunk]
    while pending:
        model = pending.pop()
        extra = model.__pydantic_extra__
        if extra:
            model.__pydantic_fields_set__.difference_update(extra)
        for name in _constructed_fields(type(model)):
            value = model.__dict__.get(name)
            if isinstance(value, pydantic.BaseModel):
                pending.append(value)
            elif type(value) is list:
                pending.extend(item for item in value if isinstance(item, pydantic.BaseModel))
    return chunk


@functools.cache
def _constructed_fields(model: type[pydantic.BaseModel]) -> tuple[str, ...]:
    """The fields of ``model`` whose model (or list of models) ``construct_type`` constructs: typed as a
    model or a list of one, not as a union."""
    names = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if typing.get_origin(annotation) is list:
            annotation = typing.get_args(annotation)[0]
        if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
            names.append(name)
    return tuple(names)


def built_inline(wrapper: type, build: Any) -> type:
    """litellm's ``CustomStreamWrapper`` with its end-of-stream step run in this task.

    Once the provider's last chunk is in, the wrapper rebuilds the whole answer (``stream_chunk_builder``:
    the final usage chunk's figures come from it) through ``asyncify``, on a worker thread: a thread hop
    that held every fast-path stream's end back by one to two milliseconds on a busy loop, while the
    builder, pure Python, holds the GIL on that thread just as it would here. The same builder (``build``:
    litellm's ``stream_chunk_builder``) with the same arguments, so the same chunks;
    ``test_litellm_still_streams_the_way_the_fast_path_relies_on`` fails when litellm's step changes."""

    class InlineBuilt(wrapper):  # type: ignore[misc]
        async def _async_build_complete_streaming_response(self) -> Any:
            try:
                return build(
                    chunks=self.chunks,
                    messages=self.messages,
                    logging_obj=self.logging_obj,
                    count_prompt_tokens=self.count_prompt_tokens,
                )
            except Exception as e:
                return self._builder_failure_response(e)

    return InlineBuilt


def built_once(build: Any) -> Any:
    """litellm's ``stream_chunk_builder``, run once per stream, and only where its answer reaches a chunk.

    The wrapper's end-of-stream step runs twice: once for the usage chunk it hands on, and once more when
    the stream is read past that chunk, for its cache write and success callbacks (which the fast path
    does not run: ``StreamLog``); each time it rebuilds the whole answer from the same chunks, 0.6 ms
    of pydantic models for an agent's four-chunk answer. The second gets the first's answer: what that
    step builds from it goes only to those callbacks, never to a chunk (the usage chunk was handed on,
    and serialized, before it). Kept on the stream's ``StreamLog``, with the chunk count it was built
    from, so a stream that grew since is built anew.

    A stream whose caller asked for no usage (``StreamLog.sends_usage``) gets no usage chunk: the answer
    would go only to those callbacks, so it is not built (``None``, which the step takes as a build that
    gave nothing). Building it counted the whole prompt with litellm's ``token_counter`` whenever the
    provider sent no usage, after the last chunk and before the stream's end: 15 ms on the event loop
    for an agent's 35k-token prompt, the client's last byte held back by it (legacy and shadow modes
    send a chat client's own request, which rarely asks for usage). The chunks are acompletion's either
    way: ``tests/provider/test_fast_stream.py`` compares them, usage asked for or not."""

    def once(*, chunks: list[Any], messages: Any, logging_obj: Any, count_prompt_tokens: Any) -> Any:
        if isinstance(logging_obj, StreamLog) and not logging_obj.sends_usage:
            return None
        known = getattr(logging_obj, "built", None)
        if known is not None and known[0] is chunks and known[1] == len(chunks):
            return known[2]
        answer = build(
            chunks=chunks, messages=messages, logging_obj=logging_obj, count_prompt_tokens=count_prompt_tokens
        )
        if isinstance(logging_obj, StreamLog):
            logging_obj.built = (chunks, len(chunks), answer)
        return answer

    return once


async def _closing(sdk_stream: Any, response: httpx.Response) -> Any:
    """The SDK stream's chunks; the response is closed however the iteration ends."""
    try:
        async for chunk in sdk_stream:
            yield chunk
    finally:
        await response.aclose()


class StreamLog:
    """What ``CustomStreamWrapper`` reads of litellm's logging object, without the callbacks it would run."""

    call_type = "acompletion"
    llm_caching_handler = None

    def __init__(
        self,
        model: str,
        provider: str,
        messages: list[Any],
        litellm_params: dict[str, Any],
        stream_options: dict[str, Any] | None,
    ) -> None:
        self.model = model
        self.messages = messages
        self.stream_options = stream_options
        self.optional_params: dict[str, Any] = {}
        self.completion_start_time: datetime.datetime | None = None
        self.built: tuple[list[Any], int, Any] | None = None  # ``built_once``: the chunks, their count, the answer
        self.sends_usage = True  # whether the wrapper hands on a usage chunk (set once it is made: ``wrap``)
        self.model_call_details: dict[str, Any] = {
            "litellm_params": litellm_params,
            "custom_llm_provider": provider,
            "model": model,
        }

    def update_completion_start_time(self, completion_start_time: datetime.datetime) -> None:
        """Noted, as litellm's logging object notes it."""
        self.completion_start_time = completion_start_time

    def is_sync_litellm_request(self, litellm_params: Any) -> bool:
        """A fast-path call is never litellm's sync ``completion``."""
        return False

    def response_cost_calculator(self, *args: Any, **kwargs: Any) -> None:
        """No cost is calculated (the proxy prices usage itself)."""
        return None

    async def dispatch_success_handlers(self, *args: Any, **kwargs: Any) -> None:
        """No success callbacks."""

    async def dispatch_attempt_failure_handlers(self, *args: Any, **kwargs: Any) -> None:
        """No failure callbacks."""

    def success_handler(self, *args: Any, **kwargs: Any) -> None:
        """No success callbacks."""

    async def async_success_handler(self, *args: Any, **kwargs: Any) -> None:
        """No success callbacks."""

    def failure_handler(self, *args: Any, **kwargs: Any) -> None:
        """No failure callbacks."""

    def record_failure_after_earlier_rounds(self, *args: Any, **kwargs: Any) -> None:
        """No spend is recorded."""

    def record_native_bedrock_guardrail(self, *args: Any, **kwargs: Any) -> None:
        """No guardrail runs on this path (read when litellm rebuilds the whole answer for usage)."""
