"""A resent history's copies are made between turns (issue 18): once a turn's answer is sent, the copy
of its messages that the session's next turn takes is made on a worker thread, so the next turn does not
copy them while its client waits. The real memo runs; a wrapper notes where each copy was made."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from proxy.edge import resent_requests
from proxy.provider.scripted import Reply


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize("stream", [False, True])
def test_the_next_turn_takes_a_copy_made_after_the_previous_answer(start_proxy, provider, monkeypatch, stream):
    provider.script(lambda body: Reply(content="ok"))
    copies: list[bool] = []  # per copy of a remembered request's messages: made on the event loop?
    real = resent_requests._fresh_messages

    def noting(messages, nested):
        copies.append(_on_event_loop())
        return real(messages, nested)

    monkeypatch.setattr(resent_requests, "_fresh_messages", noting)
    proxy = start_proxy()
    history = [{"role": "user" if n % 2 == 0 else "assistant", "content": f"step {n}"} for n in range(11)]
    with httpx.Client(base_url=proxy.url, timeout=60) as http:
        for turn in range(3):
            body = {"model": "test-model", "max_tokens": 64, "messages": history, "stream": stream}
            response = http.post("/v1/chat/completions", json=body, headers={"x-session-id": "spares"})
            assert response.status_code == 200, response.text
            deadline = time.monotonic() + 10
            while len(copies) < turn + 1 and time.monotonic() < deadline:  # the copy after the answer
                time.sleep(0.01)
            history = [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": f"Next {turn}."}]
    # One copy per turn, each made off the event loop (these small bodies are decoded on it): the turns
    # that resent a history took theirs.
    assert copies == [False, False, False]
