"""A failed assembly's trace: the pipeline says how far it got, the serializer writes it to the schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import proxy
from proxy.context.estimators import ConservativeTokenEstimator
from proxy.context.pipeline import AssemblyInput, ContextPipeline, PipelineConfig, PipelineFailed
from proxy.context.registry import ContextContributorRegistry
from proxy.context.types import ContributionRequest, ContributorOutput, Scope, Section
from proxy.kernel.canonical import HistoryEntry
from proxy.kernel.config import ModelRoute
from proxy.kernel.errors import AssemblyFailed
from proxy.runtime.assembly import TurnRequest
from proxy.runtime.limits import ModelLimits
from proxy.runtime.session_identity import SessionIdentity
from proxy.runtime.trace import SCHEMA_VERSION
from proxy.runtime.trace_record import CallRecord, trace_json
from proxy.session.store import Reconciliation

SCHEMA = jsonschema.Draft202012Validator(
    json.loads((Path(proxy.__file__).parent / "runtime" / "trace_schema.json").read_text())
)


class Contributor:
    """A contributor that raises, or returns nothing; ``protected`` as given (honoured: composed in code)."""

    def __init__(self, cid: str, protected: bool, fails: bool) -> None:
        self.id = cid
        self.protected = protected
        self.fails = fails
        self.scopes: frozenset[Scope] = frozenset({"main"})

    async def contribute(self, request: ContributionRequest) -> ContributorOutput:
        if self.fails:
            raise ConnectionError("policy service unreachable")
        return ContributorOutput()


class Factory:
    def __init__(self, contributor: Contributor) -> None:
        self.id = contributor.id
        self.contributor = contributor

    def create(self, scope: Scope) -> Contributor:
        return self.contributor


def _pipeline(*contributors: Contributor) -> ContextPipeline:
    registry = ContextContributorRegistry("main", [Factory(c) for c in contributors])
    return ContextPipeline(lambda scope: registry, ConservativeTokenEstimator(), config=PipelineConfig())


def _input() -> AssemblyInput:
    message = {"role": "user", "content": "go"}
    return AssemblyInput("main", "ctx", "m", 1, [HistoryEntry(message, "h1")], [], 10_000, "0123456789abcdef")


def _request() -> TurnRequest:
    return TurnRequest(
        identity=SessionIdentity("ctx", "fingerprint", "main"),
        mode="dynamic",
        route=ModelRoute(model_name="m", litellm_params={"model": "openai/m"}),
        limits=ModelLimits(12_000, 2_000, None, 10_000, "config"),
        body={"model": "m", "messages": [{"role": "user", "content": "go"}]},
        headers={},
        reconciliation=Reconciliation("ctx", "h1", 0, [], False, True, ("h1",)),
        turn=4,
    )


async def test_a_protected_contributor_failure_is_traced_with_every_contributors_run() -> None:
    pipeline = _pipeline(Contributor("policy", True, True), Contributor("notes", False, False))
    with pytest.raises(AssemblyFailed) as caught:
        await pipeline.assemble(_input())
    failure = caught.value
    assert isinstance(failure, PipelineFailed)
    assert (failure.status, failure.code) == (400, "context_assembly_failed")  # what the client gets, unchanged
    assert "policy (error: ConnectionError: policy service unreachable)" in failure.message

    trace: dict[str, Any] = {"schemaVersion": SCHEMA_VERSION, **trace_json(_failed(failure))}
    SCHEMA.validate(trace)
    error = trace["assemblyError"]
    assert (error["stage"], error["status"], error["code"]) == ("collect", 400, "context_assembly_failed")
    assert error["message"] == failure.message
    assert [(c["id"], c["status"]) for c in trace["contributors"]] == [("policy", "error"), ("notes", "ok")]
    assert trace["collection"] is None and trace["compaction"] is None  # collecting itself failed
    assert (trace["budgets"]["promptBudgetTokens"], trace["budgets"]["messageBudgetTokens"]) == (2_500, 1_000)
    assert "llmInput" not in trace and trace["selectedPath"] == "dynamic"


def _failed(error: BaseException) -> CallRecord:
    return CallRecord(_request(), None, {}, 3, assembly_error=error)


def test_an_unexpected_assembly_error_is_traced_as_the_500_it_becomes() -> None:
    trace = {"schemaVersion": SCHEMA_VERSION, **trace_json(_failed(KeyError("checkpoint")))}
    SCHEMA.validate(trace)
    assert trace["assemblyError"]["status"] == 500 and trace["assemblyError"]["stage"] is None
    assert "KeyError" in trace["assemblyError"]["message"] and trace["contributors"] == []


def test_the_schema_wants_llm_input_unless_the_assembly_failed() -> None:
    trace = {"schemaVersion": SCHEMA_VERSION, **trace_json(_failed(AssemblyFailed("no room")))}
    SCHEMA.validate(trace)
    assert not SCHEMA.is_valid({**trace, "llmInput": {"model": "m", "messages": []}})  # nothing was sent
    del trace["assemblyError"]
    assert not SCHEMA.is_valid(trace)


class Identity(Contributor):
    """A protected contributor whose section is ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__("identity", True, False)
        self.text = text

    async def contribute(self, request: ContributionRequest) -> ContributorOutput:
        return ContributorOutput(sections=[Section("identity", self.text, protected=True)])


async def test_a_failure_of_room_is_traced_with_what_was_needed_the_budget_and_the_settings() -> None:
    with pytest.raises(PipelineFailed) as caught:
        await _pipeline(Identity("Follow every rule. " * 1_000)).assemble(_input())
    trace: dict[str, Any] = {"schemaVersion": SCHEMA_VERSION, **trace_json(_failed(caught.value))}
    SCHEMA.validate(trace)
    error = trace["assemblyError"]
    assert error["stage"] == "budget" and error["budgetTokens"] == 2_500 == trace["budgets"]["promptBudgetTokens"]
    assert error["neededTokens"] > error["budgetTokens"]
    assert error["settings"][0] == "SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT"
    assert (
        f"it fits with SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT={-(-error['neededTokens'] * 100 // 10_000)} or more"
        in (error["message"])
    )


async def test_a_failure_that_no_setting_changes_has_no_settings_in_its_trace() -> None:
    with pytest.raises(PipelineFailed) as caught:
        await _pipeline(Contributor("policy", True, True)).assemble(_input())
    error = trace_json(_failed(caught.value))["assemblyError"]
    assert error["stage"] == "collect" and "settings" not in error and "neededTokens" not in error
