"""``previous_response_id`` and ``GET /v1/responses/{id}`` on both stores (SQLite and PostgreSQL).

The Responses ingress keeps no database of its own: a response id names a chain in the session store,
so both backends must serve it, including across a proxy restart (the id outlives the process).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from proxy.provider.scripted import Reply
from tests.integration.conftest import MODEL, STORE_BACKENDS, store_url_for


@pytest.fixture(params=STORE_BACKENDS)
async def store_url(request: pytest.FixtureRequest) -> AsyncIterator[str | None]:
    """``None`` (the SQLite default) or a fresh PostgreSQL schema, dropped afterwards."""
    async for url in store_url_for(request.param, "test_responses", pool_size=2, lock_connections=4):
        yield url


def _count_users(body: dict[str, Any]) -> Reply:
    return Reply(content=f"turn {sum(m['role'] == 'user' for m in body['messages'])}")


async def test_previous_response_id_and_retrieve_are_served_by_the_store(start_proxy, provider, store_url):
    provider.script(_count_users)
    proxy = start_proxy(mode="legacy", store_url=store_url)  # legacy: the provider gets the rebuilt chain as is
    client = proxy.client()
    first = client.responses.create(model=MODEL, instructions="Count turns.", input="one")
    second = client.responses.create(model=MODEL, input="two", previous_response_id=first.id)
    assert second.output_text == "turn 2"
    assert provider.history[-1]["messages"] == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "turn 1"},
        {"role": "user", "content": "two"},
    ]
    proxy.stop()

    # A new process on the same store still knows both ids.
    again = start_proxy(mode="legacy", store_url=store_url).client()
    assert again.responses.retrieve(first.id).output_text == "turn 1"
    assert again.responses.retrieve(second.id).previous_response_id == first.id
    third = again.responses.create(model=MODEL, input="three", previous_response_id=second.id)
    assert third.output_text == "turn 3"
    assert [m["content"] for m in provider.history[-1]["messages"] if m["role"] == "user"] == ["one", "two", "three"]

    hidden = again.responses.create(model=MODEL, input="secret", store=False)
    with pytest.raises(openai.NotFoundError):
        again.responses.retrieve(hidden.id)
    with pytest.raises(openai.NotFoundError) as caught:
        again.responses.create(model=MODEL, input="more", previous_response_id=hidden.id)
    assert caught.value.body["code"] == "previous_response_not_found"
