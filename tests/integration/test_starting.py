"""A request that arrives before start-up has finished: a 503 "starting" in each ingress's own error shape.

uvicorn accepts connections only once the lifespan has run, so the proxy is served here without one: its
runner is never built, which is what every request meets in the window before it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from proxy.app import create_app
from proxy.kernel.config import Settings
from proxy.provider.scripted import serve_in_thread
from tests.integration.conftest import MODEL, route_to

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
MESSAGE = {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def starting_url(tmp_path: Path) -> Iterator[str]:
    settings = Settings(data_dir=tmp_path / "data", models=(route_to("http://127.0.0.1:9"),))
    with serve_in_thread(create_app(settings), lifespan="off") as url:
        yield url


def _openai_starting(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json() == {
        "error": {"message": "The proxy is still starting.", "type": "api_error", "param": None, "code": "starting"}
    }


def _anthropic_starting(response: httpx.Response) -> None:
    # Anthropic's overload (what the proxy makes of any 503): Claude Code retries it.
    assert response.status_code == 529, response.text
    assert response.json() == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "The proxy is still starting."},
    }


def test_each_ingress_answers_starting_in_its_own_shape(starting_url):
    with httpx.Client(base_url=starting_url) as http:
        assert http.get("/health/readiness").status_code == 503
        _openai_starting(http.post("/v1/chat/completions", json=CHAT))
        _openai_starting(http.post("/v1/responses", json={"model": MODEL, "input": "hi"}))
        _openai_starting(http.post("/v1/responses/compact", json={"model": MODEL, "input": "hi"}))
        _openai_starting(http.get("/v1/responses/resp_123"))
        _anthropic_starting(http.post("/v1/messages", json=MESSAGE))
        _anthropic_starting(
            http.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": MESSAGE["messages"]})
        )


def test_the_sdks_read_the_starting_error(starting_url):
    client = openai.OpenAI(base_url=f"{starting_url}/v1", api_key="sk-client", max_retries=0)
    with client, pytest.raises(openai.InternalServerError) as chat_error:
        client.chat.completions.create(**CHAT)
    assert (chat_error.value.status_code, chat_error.value.code) == (503, "starting")
    sdk = anthropic.Anthropic(base_url=starting_url, api_key="sk-client", max_retries=0)
    with sdk, pytest.raises(anthropic.APIStatusError) as message_error:
        sdk.messages.create(**MESSAGE)
    assert message_error.value.status_code == 529
    assert message_error.value.body["error"]["type"] == "overloaded_error"


def test_a_bad_openai_request_during_start_up_still_gets_its_4xx(starting_url):
    """The OpenAI routes ask for the runner once the request is validated: the client's mistake is named."""
    with httpx.Client(base_url=starting_url) as http:
        chat = http.post("/v1/chat/completions", json={"model": MODEL})
        responses = http.post("/v1/responses", json={"model": MODEL, "input": 5})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
    assert responses.status_code == 400 and responses.json()["error"]["param"] == "input"
