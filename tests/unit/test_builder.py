"""The builder turns settings into the parts the app runs on: what the compactor is given, and what
start-up warns about."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest

from proxy.builder import build_service, compaction_config, pressure_warnings
from proxy.context.compactor import CompactionConfig, HistoryCompactor
from proxy.context.estimators import CachingEstimator, ConservativeTokenEstimator
from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.function import FunctionBackend, completion
from proxy.session.sqlite import SqliteSessionStore
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


def _route(window: int, max_output: int) -> ModelRoute:
    return ModelRoute("small", {"model": "openai/small"}, max_input_tokens=window, max_output_tokens=max_output)


def _no_model_map(model: str) -> tuple[int | None, int | None]:
    return None, None


def test_percentages_a_small_window_clamps_are_warned_about_naming_the_setting_and_the_value_used():
    # 8,192-token window, the default output reserve (4,096): 80 % and 50 % of the window are over the
    # 4,096-token input limit, so the ceilings below it set both levels.
    settings = Settings(models=(_route(8_192, 8_192),))
    pressure, target = pressure_warnings(settings, _no_model_map)
    assert pressure.startswith("SCIENCE_AGENT_CONTEXT_PRESSURE_PERCENT=80 is 6553 tokens")
    assert "4096-token effective input limit" in pressure and "compaction fires at 3891 tokens instead" in pressure
    assert target.startswith("SCIENCE_AGENT_CONTEXT_TARGET_PERCENT=50 is 4096 tokens")
    assert "compaction aims at 3072 tokens instead" in target


def test_explicit_percentages_over_the_ceilings_are_clamped_with_a_warning_at_any_window():
    env = {"SCIENCE_AGENT_CONTEXT_PRESSURE_PERCENT": "99", "SCIENCE_AGENT_CONTEXT_TARGET_PERCENT": "90"}
    settings = replace(Settings.from_env(env), models=(_route(128_000, 16_384),))
    pressure, target = pressure_warnings(settings, _no_model_map)
    assert pressure.startswith("SCIENCE_AGENT_CONTEXT_PRESSURE_PERCENT=99 ") and "fires at 117708 tokens" in pressure
    assert target.startswith("SCIENCE_AGENT_CONTEXT_TARGET_PERCENT=90 ") and "aims at 92928 tokens" in target


def test_no_warning_where_the_percentages_keep_their_margin():
    assert pressure_warnings(Settings(models=(_route(128_000, 16_384),)), _no_model_map) == []
    assert pressure_warnings(Settings(models=(_route(16_000, 2_000),)), _no_model_map) == []
    assert pressure_warnings(Settings(), _no_model_map) == []  # no model list: nothing known at start-up


def test_env_limits_without_a_model_list_are_checked_for_every_model():
    settings = Settings.from_env({"MODEL_MAX_TOKENS": "8192", "OUTPUT_RESERVE_TOKENS": "4096"})
    assert [w.split("=", 1)[0] for w in pressure_warnings(settings, _no_model_map)] == [
        "SCIENCE_AGENT_CONTEXT_PRESSURE_PERCENT",
        "SCIENCE_AGENT_CONTEXT_TARGET_PERCENT",
    ]


def test_the_service_logs_the_clamps_when_it_is_built(tmp_path, caplog):
    settings = Settings(data_dir=tmp_path, models=(_route(8_192, 8_192),), framing_secret=b"k" * 32)
    store = SqliteSessionStore(tmp_path / "store.db", lock_timeout_seconds=1)
    with caplog.at_level(logging.WARNING, logger="proxy.builder"):
        build_service(settings, store, FunctionBackend(lambda body: completion({"content": "ok"})), _no_model_map, b"k")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split("=", 1)[0] for w in warned] == [
        "SCIENCE_AGENT_CONTEXT_PRESSURE_PERCENT",
        "SCIENCE_AGENT_CONTEXT_TARGET_PERCENT",
    ]
