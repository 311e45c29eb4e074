"""The builder turns settings into the parts the app runs on: what the compactor is given."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.builder import compaction_config
from proxy.context.compactor import CompactionConfig, HistoryCompactor
from proxy.context.estimators import CachingEstimator, ConservativeTokenEstimator
from proxy.kernel.config import Settings
from tests.context.test_compactor import NONCE, FakeSummarizer, agent_run, cost

INVALID = "Sorry, I cannot help with that."  # no checkpoint section: rejected, asked for again


async def _summarizer_calls(settings: Settings) -> int:
    """How many times a compaction built from ``settings`` asks a summarizer that never writes a usable
    checkpoint, for a history only a summary can bring under the target (no references to preview)."""
    entries, _ = agent_run(12, refs=False)
    limit = int(cost([e.message for e in entries]) / 0.9)
    summarizer = FakeSummarizer(default=INVALID)
    compactor = HistoryCompactor(compaction_config(settings))
    result = await compactor.compact(
        entries,
        nonce=NONCE,
        limit=limit,
        estimator=CachingEstimator(ConservativeTokenEstimator()),
        summarizer=summarizer,
    )
    assert result.checkpoint is None and result.trace.attempts == len(summarizer.history)
    return len(summarizer.history)


async def test_one_summary_attempt_makes_one_summarizer_call_where_the_default_makes_two():
    assert await _summarizer_calls(Settings.from_env({})) == 2
    assert await _summarizer_calls(Settings.from_env({"SCIENCE_AGENT_SUMMARY_MAX_ATTEMPTS": "1"})) == 1
    assert await _summarizer_calls(Settings.from_env({"SCIENCE_AGENT_SUMMARY_MAX_ATTEMPTS": "4"})) == 4


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, {"max_summary_attempts": 2, "max_summary_rounds": 3}),
        (
            {"SCIENCE_AGENT_SUMMARY_MAX_ATTEMPTS": "1", "SCIENCE_AGENT_SUMMARY_MAX_ROUNDS": "7"},
            {"max_summary_attempts": 1, "max_summary_rounds": 7},
        ),
    ],
)
def test_the_compaction_config_carries_the_summary_bounds(env: dict[str, str], expected: dict[str, Any]):
    config = compaction_config(Settings.from_env(env))
    assert {k: getattr(config, k) for k in expected} == expected
    # The defaults are the compactor's own: a builder that forgot a setting would still pass with {}.
    assert compaction_config(Settings.from_env({})) == CompactionConfig()
