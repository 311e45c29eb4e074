"""A provider's cookies stay with the call they came on (issue 41: safe for many teams).

The proxy posts every team's calls over one pooled client per path (``proxy/provider/pool.py``: the fast
path, native passage, and the client litellm's OpenAI and Azure SDK routes wrap for the calls the fast
path declines). A client that keeps cookies, as httpx's does by default, would send what a provider set on
one team's answer (a load balancer's affinity, a gateway's login session) with every later call to that
host, another team's included. The stand-in here sets a cookie on every answer and records the ``Cookie``
header of every request; the official SDKs are the clients, over real HTTP.

The stand-in is addressed as ``localhost``, not ``127.0.0.1``: aiohttp's cookie jar (under litellm's
transport) stores no cookie of a host given as an IP address, so a test at an IP address could not see a
jar kept there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from proxy.app import create_app
from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.scripted import serve_in_thread
from tests.acompletion_calls import count_acompletion

MASTER = "sk-master-of-the-gateway"
CHAT_ANSWER = {
    "id": "chatcmpl-cookie",
    "object": "chat.completion",
    "created": 1,
    "model": "scripted",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
}
MESSAGES_ANSWER = {
    "id": "msg_cookie",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "ok"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 12, "output_tokens": 1},
}


class CookieSettingProvider:
    """Answers chat and Messages calls, each with a ``Set-Cookie`` naming the caller's key."""

    def __init__(self) -> None:
        self.cookies_received: list[str | None] = []

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._answer(CHAT_ANSWER), methods=["POST"]),
                Route("/v1/messages", self._answer(MESSAGES_ANSWER), methods=["POST"]),
            ]
        )

    def _answer(self, body: dict[str, Any]) -> Any:
        async def answer(request: Request) -> JSONResponse:
            await request.body()
            self.cookies_received.append(request.headers.get("cookie"))
            key = request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix("Bearer ")
            response = JSONResponse(body)
            response.set_cookie("gateway_session", f"session-of-{key}", path="/")
            return response

        return answer


@pytest.fixture
def provider() -> Iterator[tuple[CookieSettingProvider, str]]:
    stand_in = CookieSettingProvider()
    with serve_in_thread(stand_in.app()) as url:
        yield stand_in, url.replace("127.0.0.1", "localhost")  # module docstring


# A 1x1 PNG: an image part is one thing the fast path declines, so the call goes through acompletion.
IMAGE = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


def _proxy(tmp_path: Path, url: str) -> Any:
    routes = (
        ModelRoute("chat-model", {"model": "openai/scripted", "api_base": f"{url}/v1", "api_key": "sk-provider"}),
        ModelRoute("claude", {"model": "anthropic/claude-sonnet-4-5", "api_base": url, "api_key": "sk-provider"}),
    )
    return serve_in_thread(create_app(Settings(data_dir=tmp_path / "data", models=routes, master_key=MASTER)))


def _team_key(proxy: str, team: str) -> str:
    made = httpx.post(f"{proxy}/key/generate", json={"team_id": team}, headers={"Authorization": f"Bearer {MASTER}"})
    assert made.status_code == 200, made.text
    key: str = made.json()["key"]
    return key


def _chat_turn(proxy: str, key: str, model: str, team: str, image: bool) -> None:
    text = f"{team}'s turn"
    content: Any = text
    if image:
        content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": IMAGE}}]
    with openai.OpenAI(base_url=f"{proxy}/v1", api_key=key, max_retries=0) as chat:
        answer = chat.chat.completions.create(model=model, messages=[{"role": "user", "content": content}])
    assert answer.choices[0].message.content == "ok"


@pytest.mark.parametrize(
    "api",
    [
        "chat",  # the fast path
        "messages",  # native passage
        "chat-sdk-route",  # acompletion: litellm's OpenAI route, an SDK client around litellm's httpx client
        "chat-anthropic-route",  # acompletion: litellm's Anthropic handler and its own HTTP client
    ],
)
def test_a_cookie_a_provider_set_on_one_teams_call_never_goes_with_another_call(
    provider: tuple[CookieSettingProvider, str], tmp_path: Path, api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in, url = provider
    through_acompletion = count_acompletion(monkeypatch)
    with _proxy(tmp_path, url) as proxy:
        for team in ("alpha", "beta", "alpha"):
            key = _team_key(proxy, team)
            if api.startswith("chat"):
                model = "claude" if api == "chat-anthropic-route" else "chat-model"
                _chat_turn(proxy, key, model, team, image=api != "chat")
            else:  # native passage: the client's own API to an anthropic/ route
                with anthropic.Anthropic(base_url=proxy, api_key=key, max_retries=0) as messages:
                    reply = messages.messages.create(
                        model="claude", max_tokens=100, messages=[{"role": "user", "content": f"{team}'s turn"}]
                    )
                assert reply.content[0].text == "ok"  # type: ignore[union-attr]
    assert stand_in.cookies_received == [None, None, None]
    # each case took the path it names (an image part sends a call through acompletion)
    assert len(through_acompletion) == (3 if api.endswith("-route") else 0)


def test_the_sdk_routes_client_outlives_an_app_that_shuts_down(
    provider: tuple[CookieSettingProvider, str], tmp_path: Path
) -> None:
    """The cookie-free client litellm's SDK routes wrap is the process's: an app that shuts down while
    another serves (two servers in one process, as in the tests) leaves it open for the other."""
    stand_in, url = provider
    with _proxy(tmp_path / "first", url) as first:
        _chat_turn(first, _team_key(first, "alpha"), "chat-model", "alpha", image=True)
        with _proxy(tmp_path / "second", url) as second:
            _chat_turn(second, _team_key(second, "beta"), "chat-model", "beta", image=True)
        _chat_turn(first, _team_key(first, "alpha"), "chat-model", "alpha", image=True)
    assert stand_in.cookies_received == [None, None, None]
