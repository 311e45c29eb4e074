"""The summarizer's model call: what it asks the provider for, on the route it summarizes with."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.kernel.config import ModelRoute
from proxy.provider.function import FunctionBackend
from proxy.runtime.summarizer import ModelSummarizer

REQUEST = [{"role": "system", "content": "Write a checkpoint."}, {"role": "user", "content": "the transcript"}]


def _answer(llm_input: dict[str, Any]) -> dict[str, Any]:
    message = {"role": "assistant", "content": "## Completed work"}
    return {"id": "c", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


@pytest.mark.parametrize(
    ("route", "model", "store"),
    [
        # OpenAI keeps a Responses call unless told not to: the client's transcript must not be kept for it.
        (ModelRoute("codex", {"model": "openai/gpt-5-codex"}), "openai/gpt-5-codex", False),
        # An operator's api: responses is the summarizer's too: litellm is told to bridge the call there.
        (
            ModelRoute("codex", {"model": "openai/gpt-5.5", "api_base": "http://x/v1"}, configured_api="responses"),
            "openai/responses/gpt-5.5",
            False,
        ),
        (
            ModelRoute("codex", {"model": "openai/responses/m", "api_base": "http://x/v1"}, configured_api="responses"),
            "openai/responses/m",
            False,
        ),
        # Chat Completions stores nothing by default, Anthropic has no such switch: nothing changes.
        (ModelRoute("local", {"model": "openai/m", "api_base": "http://x/v1"}), "openai/m", None),
        (ModelRoute("claude", {"model": "anthropic/claude-sonnet-4-5"}), "anthropic/claude-sonnet-4-5", None),
    ],
    ids=["responses-default", "responses-configured", "responses-prefixed", "chat", "messages"],
)
async def test_the_summary_call_speaks_the_routes_api_and_is_not_stored(
    route: ModelRoute, model: str, store: bool | None
):
    backend = FunctionBackend(_answer)
    summarizer = ModelSummarizer(backend, route)
    assert await summarizer.summarize(REQUEST) == "## Completed work"
    (sent,) = backend.history
    assert sent["model"] == model and sent.get("store", None) is store and sent["messages"] == REQUEST
    assert summarizer.calls[0]["llmInput"].get("store", None) is store  # the trace shows it too
