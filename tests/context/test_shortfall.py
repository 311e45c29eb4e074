"""A failure of room names what was needed, the budget, and the setting that changes it, with a value that fits."""

from __future__ import annotations

import re

import pytest

from proxy.context.estimators import ConservativeTokenEstimator
from proxy.context.pipeline import AssemblyInput, ContextPipeline, PipelineConfig, PipelineFailed
from proxy.context.registry import ContextContributorRegistry
from proxy.context.shortfall import (
    SETTING_NAMES,
    ContextDoesNotFit,
    FixedParts,
    LimitBasis,
    Shortfall,
    explain,
)
from proxy.context.turn_estimator import TurnEstimator
from proxy.context.types import ContributionRequest, ContributorOutput, Scope, Section
from proxy.kernel.canonical import HistoryEntry
from proxy.kernel.config import ConfigError, Settings

NONCE = "0123456789abcdef"


@pytest.mark.parametrize("name", SETTING_NAMES)
def test_every_setting_named_is_one_the_config_reads(name: str) -> None:
    # The context package keeps the names as data; a renamed variable would leave advice naming nothing.
    with pytest.raises(ConfigError, match=f"^{name}="):
        Settings.from_env({name: "-1"})


def _protected(used: int, budget: int) -> ContextDoesNotFit:
    return ContextDoesNotFit(
        f"protected sections need {used} tokens, over the prompt budget of {budget}: identity ({used} tokens)",
        Shortfall("prompt_budget", used, budget),
    )


def test_the_32k_example_names_the_prompt_percent_and_the_value_that_fits() -> None:
    # A 6,401-token system prompt, counted x1.25 before the route's first answers (8,001), at a 32,000-token
    # window with the default 4,096-token reserve: the prompt budget is 25 % of 27,904 = 6,976.
    basis = LimitBasis(27_904, 32_000, 4_096, prompt_percent=25, message_percent=10, estimator_factor=1.25)
    explained = explain(_protected(8_001, 6_976), basis)
    message = explained.message
    assert message.startswith("protected sections need 8001 tokens, over the prompt budget of 6976")
    assert "SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT=25 % of the effective input limit of 27904 tokens" in message
    assert "the 32000-token context window minus the 4096-token output reserve" in message
    assert "it fits with SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT=29 or more" in message  # 8,001 / 27,904 = 28.7 %
    fitting_limit = "or with an effective input limit of 32004 tokens or more"
    assert f"{fitting_limit} (a larger MODEL_MAX_TOKENS or a smaller OUTPUT_RESERVE_TOKENS)" in message
    assert "scaled x1.25" in message and "SCIENCE_AGENT_CONTEXT_ESTIMATOR_START_PERCENT" in message
    assert explained.shortfall == Shortfall(
        "prompt_budget",
        8_001,
        6_976,
        (
            "SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT",
            "MODEL_MAX_TOKENS",
            "OUTPUT_RESERVE_TOKENS",
            "SCIENCE_AGENT_CONTEXT_ESTIMATOR",
            "SCIENCE_AGENT_CONTEXT_ESTIMATOR_START_PERCENT",
        ),
    )
    assert (explained.status, explained.code) == (400, "context_assembly_failed")  # what the client got before


def test_sections_larger_than_the_whole_limit_need_a_larger_limit_not_a_percentage() -> None:
    basis = LimitBasis(10_000, None, 0, prompt_percent=25, message_percent=10)
    message = explain(_protected(12_000, 2_500), basis).message
    assert "no SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT fits it within this limit" in message
    assert "an effective input limit of 48000 tokens or more" in message  # 25 % of 48,000 = 12,000
    # Without the window, the limit's settings are all named.
    assert (
        "(a larger SCIENCE_AGENT_CONTEXT_WINDOW_TOKENS, a larger MODEL_MAX_TOKENS or a smaller OUTPUT_RESERVE_TOKENS)"
        in message
    )
    assert "Token counts are estimates (SCIENCE_AGENT_CONTEXT_ESTIMATOR)." in message


def test_a_history_that_does_not_fit_names_the_limit_and_what_the_fixed_part_takes() -> None:
    failure = ContextDoesNotFit(
        "the history minimum needs 9000 tokens, over the 5000 left", Shortfall("history", 9_000, 5_000)
    )
    # SCIENCE_AGENT_CONTEXT_WINDOW_TOKENS=8,000 caps a 16,000-token window with a 2,000-token reserve.
    basis = LimitBasis(8_000, 8_000, 2_000, prompt_percent=25, message_percent=10)
    explained = explain(failure, basis, FixedParts(prompt_tokens=1_500, tool_tokens=1_200, message_tokens=300))
    message = explained.message
    assert (
        "the system prompt takes 1500 of it (its budget: SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT=25 %, 2000 tokens)"
        in (message)
    )
    assert "the tool schemas 1200 and contributor messages 300" in message
    assert "It fits with an effective input limit of 12000 tokens or more" in message  # 4,000 tokens missing
    assert "the smaller of SCIENCE_AGENT_CONTEXT_WINDOW_TOKENS and MODEL_MAX_TOKENS - OUTPUT_RESERVE_TOKENS" in message
    # The prompt and messages take less than the 4,000 missing: shrinking them is no remedy, so not offered.
    assert "fewer tokens of system prompt" not in message
    assert explained.shortfall.settings[:3] == (
        "SCIENCE_AGENT_CONTEXT_WINDOW_TOKENS",
        "MODEL_MAX_TOKENS",
        "OUTPUT_RESERVE_TOKENS",
    )
    roomy = explain(failure, basis, FixedParts(prompt_tokens=3_000, tool_tokens=0, message_tokens=1_500))
    assert "or with 4000 fewer tokens of system prompt and contributor messages" in roomy.message
    assert "SCIENCE_AGENT_CONTEXT_MESSAGE_PERCENT" in roomy.shortfall.settings


def test_a_forced_pass_says_the_window_is_the_one_the_provider_stated() -> None:
    failure = ContextDoesNotFit("over", Shortfall("history", 3_000, 1_000))
    basis = LimitBasis(1_500, 2_000, 500, prompt_percent=25, message_percent=10, stated_limit=2_000)
    assert (
        "the 2000-token context window stated by the provider in an overflow error" in explain(failure, basis).message
    )


class _Contributor:
    def __init__(self, text: str) -> None:
        self.id = "identity"
        self.protected = True
        self.scopes: frozenset[Scope] = frozenset({"main"})
        self.text = text

    async def contribute(self, request: ContributionRequest) -> ContributorOutput:
        return ContributorOutput(sections=[Section("identity", self.text, protected=True)])


class _Factory:
    def __init__(self, contributor: _Contributor) -> None:
        self.id = contributor.id
        self.contributor = contributor

    def create(self, scope: Scope) -> _Contributor:
        return self.contributor


def _pipeline(prompt: str, config: PipelineConfig | None = None) -> ContextPipeline:
    registry = ContextContributorRegistry("main", [_Factory(_Contributor(prompt))])
    return ContextPipeline(lambda scope: registry, ConservativeTokenEstimator(), config=config or PipelineConfig())


def _input(content: str, limit: int = 10_000) -> AssemblyInput:
    return AssemblyInput(
        "main",
        "ctx",
        "m",
        1,
        [HistoryEntry({"role": "user", "content": content}, "h1")],
        [],
        limit,
        NONCE,
        window=limit + 2_000,
        output_reserve=2_000,
        estimator=TurnEstimator(ConservativeTokenEstimator(), 1.25),
    )


async def test_the_pipeline_explains_a_prompt_over_its_budget_and_the_named_value_makes_it_fit() -> None:
    prompt = "Follow every rule. " * 1_000
    with pytest.raises(PipelineFailed) as caught:
        await _pipeline(prompt).assemble(_input("go"))
    failure = caught.value
    assert failure.record.stage == "budget" and failure.record.shortfall is not None
    assert failure.record.shortfall.settings[0] == "SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT"
    match = re.search(r"it fits with SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT=(\d+) or more", failure.message)
    assert match is not None, failure.message
    percent = int(match.group(1))
    output = await _pipeline(prompt, PipelineConfig(prompt_percent=percent)).assemble(_input("go"))
    assert prompt.strip() in output.messages[0]["content"]
    # One percent less does not fit: the value named is the smallest that does.
    with pytest.raises(PipelineFailed):
        await _pipeline(prompt, PipelineConfig(prompt_percent=percent - 1)).assemble(_input("go"))


async def test_the_pipeline_explains_a_history_minimum_over_the_limit_and_the_named_limit_makes_it_fit() -> None:
    task = "Measure every sample in the tray and report the spread. " * 600
    with pytest.raises(PipelineFailed) as caught:
        await _pipeline("Be careful.").assemble(_input(task))
    failure = caught.value
    assert failure.record.stage == "window"
    assert "the 12000-token context window minus the 2000-token output reserve" in failure.message
    assert "the system prompt takes" in failure.message and "the tool schemas 0" in failure.message
    match = re.search(r"It fits with an effective input limit of (\d+) tokens or more", failure.message)
    assert match is not None, failure.message
    limit = int(match.group(1))
    output = await _pipeline("Be careful.").assemble(_input(task, limit))
    assert output.messages[-1]["content"] == task
