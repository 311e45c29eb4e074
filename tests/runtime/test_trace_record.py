"""``trace_json``: the one serializer turns the stages' typed records into schema-v5 JSON, camelCase throughout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

import proxy
from proxy.context.budget import BudgetResult
from proxy.context.calibration import Correction
from proxy.context.collector import Collection, ContributorRun
from proxy.context.compactor import CompactionTrace
from proxy.context.estimators import ConservativeTokenEstimator
from proxy.context.pipeline import AssemblyRecord, CompactionRecord, RenderedContext
from proxy.context.renderer import RenderedPrompt
from proxy.context.types import Diagnostic, Section
from proxy.context.window import WindowResult, WindowStatistics
from proxy.kernel.config import ModelRoute
from proxy.runtime.assembly import Candidate, CandidateRecord, SummaryBackoff, TurnRequest
from proxy.runtime.calibration import TokenAccounting
from proxy.runtime.limits import ModelLimits
from proxy.runtime.session_identity import SessionIdentity
from proxy.runtime.trace import SCHEMA_VERSION
from proxy.runtime.trace_record import CallRecord, trace_json
from proxy.session.store import Reconciliation

SCHEMA = json.loads((Path(proxy.__file__).parent / "runtime" / "trace_schema.json").read_text())


class Opaque:
    """What a misbehaving contributor might return: not data."""


def call_record(**call: Any) -> CallRecord:
    section = Section("identity.role", "You are careful.", protected=True, source="identity")
    cut = Diagnostic("warning", "section_truncated", "cut to fit", source="sample")
    runs = (
        ContributorRun("identity", True, "ok", 1.5, raw_output={"snake_key": 1}),
        ContributorRun("weird", False, "invalid", 0.1, error="not a ContributorOutput", raw_output=Opaque()),
    )
    stats = WindowStatistics(1_000, 1, 1, 0, 0, 10, 10, 10, 0, 0, ())
    history = ({"role": "user", "content": "hi", "tool_call_id": None},)
    pipeline = AssemblyRecord(
        compaction=CompactionRecord(
            CompactionTrace("forced", 1_000, 800, 350, 900, 300, compacted_refs=["to_1"]), True, "abc", True, True, 900
        ),
        estimated_tokens=42,
        cap_dropped_messages=0,
        cap_max=None,
        assembly_ms=1.0,
        plan_progress={"toolCallId": "call_plan", "anchorFound": False},
        collection=Collection("main", runs, (section,), (), (), ()),
        admitted=BudgetResult((section,), (), (), (cut,), 7, 0),
        rendered=RenderedContext(
            RenderedPrompt("You are careful.", ("identity.role",)),
            history,
            (),
            WindowResult(history, (0,), stats, (cut,)),
        ),
    )
    record = CandidateRecord(pipeline, ({"model": "m", "llmInput": {"max_tokens": 5}},), SummaryBackoff(30, 12))
    request = TurnRequest(
        identity=SessionIdentity("ctx", "fingerprint", "main"),
        mode="dynamic",
        route=ModelRoute(model_name="m", litellm_params={"model": "openai/m"}),
        limits=ModelLimits(1_000, 100, None, 900, "provider_error"),
        body={"model": "m", "messages": list(history)},
        headers={},
        reconciliation=Reconciliation("ctx", "h1", 0, [], False, True, ("h1",)),
        turn=3,
        forced=True,
        stated_limit=900,
        ingress={"api": "anthropic-messages", "notForwarded": {"top_k": "Anthropic routes only"}},
        tokens=TokenAccounting(ConservativeTokenEstimator(), "calibrated", "o200k_base", Correction(1.1, 1.05, 4)),
    )
    llm_input = {"model": "openai/m", "messages": list(history), "max_tokens": 5, "api_key": "sk-secret"}
    return CallRecord(request, Candidate(list(history), None, record), llm_input, 17, **call)


def snake_keys(value: Any, path: str = "") -> list[str]:
    """Keys with an underscore, outside the data a trace quotes as it is."""
    if isinstance(value, list):
        return [k for item in value for k in snake_keys(item, path)]
    if not isinstance(value, dict):
        return []
    found = []
    for key, item in value.items():
        where = f"{path}.{key}"
        if where in {".llmInput", ".ingress", ".summarizerCalls", ".renderedContext.callHistory"} or key == "rawOutput":
            continue
        if "_" in key:
            found.append(where)
        found += snake_keys(item, where)
    return found


def test_every_key_the_proxy_names_is_camel_case_and_the_trace_matches_its_schema() -> None:
    call = call_record(recovery=1, recovery_reason="too long", provider_ms=2.5)
    trace = {"schemaVersion": SCHEMA_VERSION, **trace_json(call)}

    assert snake_keys(trace) == []
    jsonschema.Draft202012Validator(SCHEMA).validate(trace)
    compaction = trace["compaction"]
    assert compaction["compactedRefs"] == ["to_1"] and compaction["tokensBefore"] == 900
    assert compaction["recovery"] == {"reason": "provider_context_overflow", "statedLimit": 900}
    assert trace["admitted"]["promptTokens"] == 7
    assert trace["renderedContext"]["window"]["statistics"]["keptMessages"] == 1
    assert trace["summaryBackoff"] == {"retryAfterMessages": 30, "historyMessages": 12}
    assert trace["recovery"] == {"attempt": 1, "reason": "provider_context_overflow", "providerMessage": "too long"}
    assert trace["clientTokens"] == 17
    estimator = {"name": "calibrated", "encoding": "o200k_base", "ratio": 1.1, "margin": 1.05, "samples": 4}
    assert trace["budgets"]["estimator"] == estimator


def test_quoted_data_keeps_its_keys_and_what_is_not_data_becomes_text() -> None:
    trace = trace_json(call_record())
    identity, weird = trace["contributors"]
    assert identity["rawOutput"] == {"snake_key": 1}  # a contributor's own mapping, as it returned it
    assert weird["status"] == "invalid" and "Opaque" in weird["rawOutput"]
    assert trace["llmInput"]["max_tokens"] == 5 and "api_key" not in trace["llmInput"]  # redacted
    assert trace["ingress"]["notForwarded"] == {"top_k": "Anthropic routes only"}
    assert "recovery" not in trace and "providerError" not in trace  # only when they happened
    json.dumps(trace)  # plain JSON


def test_the_schema_refuses_a_snake_case_key() -> None:
    trace = {"schemaVersion": SCHEMA_VERSION, **trace_json(call_record())}
    trace["compaction"]["tokens_before"] = trace["compaction"].pop("tokensBefore")
    errors = list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(trace))
    assert errors, "the schema must refuse a snake_case key the proxy names"
