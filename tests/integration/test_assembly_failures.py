"""A request the context cannot be assembled for, through real HTTP: the 400 names what was needed, the
budget, and the setting that changes it with a value that fits; a proxy started with that value serves
the same request."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.integration.conftest import route_to

# About 6,400 tiktoken tokens of a coding agent's instructions: counted x1.25 on a fresh route (8,000 and
# the framing), over the prompt's 25 % budget of a 32,000-token window's 27,904-token input limit (6,976).
RULES = " ".join(f"Rule {i}: keep the change focused and explain why in the commit message." for i in range(400))


def _traces(proxy: Any, session: str) -> list[dict[str, Any]]:
    folder = Path(proxy.settings.data_dir) / "context-traces" / session
    return [json.loads(p.read_text()) for p in sorted(folder.glob("turn-*.json"))]


def _refused(proxy: Any, messages: list[dict[str, Any]], session: str) -> str:
    with pytest.raises(openai.BadRequestError) as caught:
        proxy.client().chat.completions.create(
            model="test-model", messages=messages, extra_headers={"x-session-id": session}
        )
    assert caught.value.code == "context_assembly_failed"
    return str(caught.value.body["message"])  # type: ignore[index]


def test_a_system_prompt_over_its_budget_names_the_prompt_percent_and_that_value_serves_it(start_proxy, provider):
    route = route_to(provider.url, window=32_000, max_output=4_096)
    messages = [{"role": "system", "content": RULES}, {"role": "user", "content": "Start."}]
    proxy = start_proxy(models=(route,), trace_enabled=True)
    message = _refused(proxy, messages, "big-prompt")
    assert provider.history == []  # nothing was sent
    assert "over the prompt budget of 6976" in message
    assert "SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT=25 % of the effective input limit of 27904 tokens" in message
    assert "the 32000-token context window minus the 4096-token output reserve" in message
    assert "scaled x1.25" in message and "SCIENCE_AGENT_CONTEXT_ESTIMATOR_START_PERCENT" in message
    fits = re.search(r"it fits with SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT=(\d+) or more", message)
    assert fits is not None, message
    (trace,) = _traces(proxy, "big-prompt")
    failure = trace["assemblyError"]
    assert failure["message"] == message and failure["stage"] == "budget"
    assert failure["budgetTokens"] == 6_976 < failure["neededTokens"]
    assert failure["settings"][0] == "SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT"

    # The operator raises the setting the error named, to the value it named: the same request is served.
    raised = start_proxy(models=(route,), prompt_percent=int(fits.group(1)))
    answer = raised.client().chat.completions.create(
        model="test-model", messages=messages, extra_headers={"x-session-id": "big-prompt"}
    )
    assert answer.choices[0].message.content == "ok"
    assert RULES in provider.history[-1]["messages"][0]["content"]  # the whole prompt, not a cut one


def test_a_task_larger_than_the_window_names_the_limit_and_that_limit_serves_it(start_proxy, provider):
    route = route_to(provider.url, window=16_000, max_output=2_000)
    task = "Measure every sample in the tray and report the spread of the readings. " * 900
    messages = [{"role": "user", "content": task}]
    proxy = start_proxy(models=(route,), trace_enabled=True)
    message = _refused(proxy, messages, "big-task")
    assert provider.history == []
    assert "the history minimum (task anchor, checkpoint, latest step, unfinished calls) needs" in message
    assert "The effective input limit is 14000 tokens (the 16000-token context window minus the 2000-token" in message
    assert "a larger MODEL_MAX_TOKENS or a smaller OUTPUT_RESERVE_TOKENS" in message
    fits = re.search(r"It fits with an effective input limit of (\d+) tokens or more", message)
    assert fits is not None, message
    (trace,) = _traces(proxy, "big-task")
    assert trace["assemblyError"]["stage"] == "window"
    assert trace["assemblyError"]["settings"][:2] == ["MODEL_MAX_TOKENS", "OUTPUT_RESERVE_TOKENS"]

    # MODEL_MAX_TOKENS set so that it minus the route's 2,000-token reserve is the limit the error named.
    raised = start_proxy(models=(route,), model_max_tokens=int(fits.group(1)) + 2_000)
    answer = raised.client().chat.completions.create(
        model="test-model", messages=messages, extra_headers={"x-session-id": "big-task"}
    )
    assert answer.choices[0].message.content == "ok"
    assert provider.history[-1]["messages"][-1]["content"] == task
