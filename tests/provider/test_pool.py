"""The pool's ``post_bytes`` sends what httpx's ``post`` sends and answers as it answers (``provider/pool.py``).

Every fast-path and native call goes through ``PooledClient.post_bytes``, which skips httpx's client layers
around litellm's transport. A raw socket server records each request's bytes as they arrive, so the two
ways are compared where a provider meets them: request line, headers in their order, body.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator

import httpx
import pytest

from proxy.provider.fast.surface import load
from proxy.provider.pool import PooledClient, litellm_client
from tests.garbage import collector_finds

ANSWER = b'{"ok": true}'


class RecordingServer:
    """Reads each request whole (head and ``Content-Length`` body) and answers it with ``ANSWER``."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                self.requests.append(head + await reader.readexactly(length))
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-answer: 1\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[tuple[RecordingServer, str]]:
    recording = RecordingServer()
    url = await recording.start()
    yield recording, url
    await recording.stop()


@pytest.fixture
async def pooled() -> AsyncIterator[PooledClient]:
    client = litellm_client(load())  # litellm's own transport, as the fast path and native passage get it
    yield client
    await client.aclose()


HEADERS = {"Authorization": "Bearer sk-route", "Content-Type": "application/json", "x-extra": "a"}


@pytest.mark.parametrize("content", [b'{"model": "m", "messages": []}', '{"text": "caf\u00e9"}'], ids=["bytes", "str"])
async def test_post_bytes_sends_the_bytes_post_sends(server, pooled, content) -> None:
    recording, url = server
    via_post = await pooled.post(url + "/v1/chat/completions", content=content, headers=HEADERS, timeout=5.0)
    via_lean = await pooled.post_bytes(url + "/v1/chat/completions", content, HEADERS, 5.0)
    first, second = recording.requests
    assert second == first
    assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and b"x-extra: a" in first
    for response in (via_post, via_lean):
        assert response.status_code == 200 and response.content == ANSWER
        assert response.headers["x-answer"] == "1" and response.json() == {"ok": True}
    assert via_lean.request.method == "POST" and via_lean.request.url == via_post.request.url
    assert list(via_lean.request.headers.multi_items()) == list(via_post.request.headers.multi_items())
    assert via_lean.request.extensions["timeout"] == via_post.request.extensions["timeout"]
    assert isinstance(via_lean.elapsed, datetime.timedelta)  # litellm copies it into errors it makes


async def test_a_streamed_post_bytes_sends_what_send_sends_and_reads_the_body_on_demand(server, pooled) -> None:
    recording, url = server
    request = pooled.build_request("POST", url + "/v1/messages", content=b"{}", headers=HEADERS, timeout=5.0)
    via_send = await pooled.send(request, stream=True)
    via_lean = await pooled.post_bytes(url + "/v1/messages", b"{}", HEADERS, 5.0, stream=True)
    assert recording.requests[1] == recording.requests[0]
    for response in (via_send, via_lean):
        assert not response.is_stream_consumed
        assert b"".join([chunk async for chunk in response.aiter_bytes()]) == ANSWER
        await response.aclose()
    assert via_lean.elapsed >= datetime.timedelta(0)


async def test_a_transport_error_is_what_post_raises_with_the_request_attached(pooled) -> None:
    closed = RecordingServer()
    url = await closed.start()
    await closed.stop()  # nothing listens there any more
    with pytest.raises(httpx.TransportError) as by_post:
        await pooled.post(url + "/v1/chat/completions", content=b"{}", headers=HEADERS, timeout=5.0)
    with pytest.raises(httpx.TransportError) as by_lean:
        await pooled.post_bytes(url + "/v1/chat/completions", b"{}", HEADERS, 5.0)
    assert type(by_lean.value) is type(by_post.value)
    assert by_lean.value.request.url == by_post.value.request.url  # the openai SDK's errors read it


async def test_credentials_in_the_url_fare_as_they_fare_through_post(server, pooled) -> None:
    # httpx turns them into a Basic ``Authorization`` header and leaves them in the URL, which litellm's
    # aiohttp transport refuses; over httpx's own transport they would go out as that header.
    _, url = server
    with_credentials = url.replace("http://", "http://user:secret@") + "/v1/chat/completions"
    headers = {"Content-Type": "application/json"}
    outcomes = []
    for send in (
        lambda: pooled.post(with_credentials, content=b"{}", headers=headers, timeout=5.0),
        lambda: pooled.post_bytes(with_credentials, b"{}", headers, 5.0),
    ):
        try:
            outcomes.append((await send()).status_code)
        except Exception as exc:  # whatever it is, both ways must meet the same
            outcomes.append(f"{type(exc).__name__}: {exc}")
    assert outcomes[0] == outcomes[1]


async def test_a_closed_pool_refuses_as_httpx_does(server) -> None:
    _, url = server
    client = litellm_client(load())
    await client.aclose()
    with pytest.raises(RuntimeError, match="client has been closed"):
        await client.post_bytes(url + "/v1/chat/completions", b"{}", HEADERS, 5.0)


async def test_a_closed_stream_leaves_no_cycle_holding_the_request(server, pooled) -> None:
    # The response holds its stream and the stream the response (to set ``elapsed``); once closed the
    # stream lets go, so the request (the provider body: megabytes on a long history) is freed with the
    # response, not at a cyclic collection that may come dozens of streamed turns later.
    _, url = server
    await pooled.post_bytes(url + "/v1/chat/completions", b"{}", HEADERS, 5.0)  # the pool's connection exists
    with collector_finds(httpx.Request, httpx.Response) as found:
        response = await pooled.post_bytes(url + "/v1/chat/completions", b"x" * 100_000, HEADERS, 5.0, stream=True)
        assert b"".join([chunk async for chunk in response.aiter_bytes()]) == ANSWER
        await response.aclose()
        assert isinstance(response.elapsed, datetime.timedelta)
        del response
    assert not found
