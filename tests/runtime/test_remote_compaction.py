"""Remote compaction's checkpoint writer: the summarizer's request stays within the window, and a
failing summarizer gives the deterministic checkpoint."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from proxy.context.checkpoint import validate_checkpoint
from proxy.context.estimators import ConservativeTokenEstimator
from proxy.kernel.config import ModelRoute
from proxy.kernel.errors import ProviderError
from proxy.provider.science_script import checkpoint_for
from proxy.runtime.remote_compaction import write_checkpoint

ROUTE = ModelRoute("m", {"model": "openai/m"})


class FunctionBackend:
    """Answers every summary with ``answer`` (or raises it); keeps what it was sent."""

    def __init__(self, answer: str | ProviderError) -> None:
        self.answer = answer
        self.history: list[dict[str, Any]] = []

    def provider_arguments(self, llm_input: dict[str, Any]) -> dict[str, Any]:
        """What a call is made with: this fake adds nothing."""
        return dict(llm_input)

    async def complete(self, llm_input: dict[str, Any]) -> dict[str, Any]:
        self.history.append(llm_input)
        if isinstance(self.answer, ProviderError):
            raise self.answer
        return {"choices": [{"message": {"role": "assistant", "content": self.answer}}]}

    async def stream(self, llm_input: dict[str, Any], *, usage_to_caller: bool = True) -> AsyncIterator[dict[str, Any]]:
        raise AssertionError("the summarizer never streams")


def _history(steps: int, output_chars: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "rules"}, {"role": "user", "content": "go"}]
    for step in range(1, steps + 1):
        call = {"id": f"c{step}", "type": "function", "function": {"name": "sh", "arguments": json.dumps({"n": step})}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{step}", "content": f"step {step}\n" + "x" * output_chars})
    return messages


async def test_the_summary_request_of_a_history_far_over_the_window_fits_it():
    backend = FunctionBackend(checkpoint_for(""))
    limit = 8_000
    outcome = await write_checkpoint(backend, ROUTE, _history(30, 40_000), None, "h", 500, "nonce", limit)
    (sent,) = backend.history
    estimator = ConservativeTokenEstimator()
    assert sum(estimator.count_message(m) for m in sent["messages"]) <= limit
    assert "step 30" in sent["messages"][-1]["content"]  # the latest step is always in
    assert outcome.fallback is None and validate_checkpoint(outcome.checkpoint.text).valid


async def test_a_failing_summarizer_gives_a_deterministic_checkpoint_within_budget():
    backend = FunctionBackend(ProviderError("down", code="upstream"))
    outcome = await write_checkpoint(backend, ROUTE, _history(50, 2_000), None, "h", 600, "nonce", 100_000)
    assert len(backend.history) == 1 and outcome.fallback is not None and "down" in outcome.fallback
    text = outcome.checkpoint.text
    assert validate_checkpoint(text).valid
    assert 'sh({"n": 50})' in text and "earlier steps left out" in text  # newest kept, oldest dropped
    assert ConservativeTokenEstimator().count_text(text) <= 600
    assert outcome.checkpoint.covered_messages == 101


async def test_an_unusable_checkpoint_is_asked_for_again_attempts_times_in_all():
    default = FunctionBackend("Sorry, I cannot help with that.")  # no checkpoint section: invalid
    outcome = await write_checkpoint(default, ROUTE, _history(5, 200), None, "h", 600, "nonce", 100_000)
    assert len(default.history) == 2 and len(outcome.rejections) == 2 and outcome.fallback is not None
    once = FunctionBackend("Sorry, I cannot help with that.")
    outcome = await write_checkpoint(once, ROUTE, _history(5, 200), None, "h", 600, "nonce", 100_000, attempts=1)
    assert len(once.history) == 1 and len(outcome.rejections) == 1 and outcome.fallback is not None
    assert validate_checkpoint(outcome.checkpoint.text).valid  # the deterministic one
