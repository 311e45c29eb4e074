"""Traces that explain every turn, through real HTTP: a failed assembly leaves a trace (and the report
counts it), the budgets of contributed context, collection and cap diagnostics, previews re-applied
beside new ones, and every argument the provider call is made with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.cli import main as cli
from proxy.kernel.config import ModelRoute
from proxy.provider.science_script import TOOLS, ScienceModel, client_tool_result

PROBES = '''
"""Two third-party contributors: one that raises, one that reports a diagnostic of its own."""


class _Flaky:
    id = "flaky_probe"
    scopes = ("main",)
    protected = False

    async def contribute(self, request):
        raise RuntimeError("the lab database is down")


class _Noted:
    id = "noted_probe"
    scopes = ("main",)
    protected = False

    async def contribute(self, request):
        return {"diagnostics": [{"level": "warning", "code": "option_ignored", "message": "unknown unit 'furlong'"}]}


class _Factory:
    def __init__(self, contributor):
        self.id = contributor.id
        self._contributor = contributor

    def create(self, scope):
        return self._contributor if scope == "main" else None


flaky = _Factory(_Flaky())
noted = _Factory(_Noted())
'''


def _traces(folder: Path, context_id: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((folder / context_id).glob("turn-*.json"))]


def _trace_dir(proxy: Any) -> Path:
    return Path(proxy.settings.data_dir) / "context-traces"


def test_a_failed_assembly_is_traced_and_the_client_error_and_lock_are_unchanged(start_proxy, provider):
    proxy = start_proxy(mode="dynamic", trace_enabled=True, session_lock_seconds=2)
    client = proxy.client()
    # A client system prompt is rendered by the protected identity contributor: over the prompt's budget
    # (25% of the effective limit), the turn cannot be assembled.
    messages = [
        {"role": "system", "content": "Follow every rule carefully. " * 2_000},
        {"role": "user", "content": "go"},
    ]
    errors = []
    for _ in range(2):  # the same history again: a lock left held would answer 409 after 2 s, not the same 400
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="test-model", messages=messages, extra_headers={"x-session-id": "big"})
        errors.append(caught.value)
    assert provider.history == []  # nothing was sent
    assert [e.status_code for e in errors] == [400, 400]
    assert [e.code for e in errors] == ["context_assembly_failed"] * 2

    traces = _traces(_trace_dir(proxy), "big")
    assert [t["turn"] for t in traces] == [1, 2]
    for trace, error in zip(traces, errors, strict=True):
        failure = trace["assemblyError"]
        assert failure["message"] == error.body["message"]  # type: ignore[index]
        assert (failure["code"], failure["status"], failure["stage"]) == ("context_assembly_failed", 400, "budget")
        assert "llmInput" not in trace and trace["mode"] == "dynamic" and trace["selectedPath"] == "dynamic"
        budgets = trace["budgets"]
        assert budgets["promptBudgetTokens"] == budgets["effectiveInputTokens"] * 25 // 100
        assert budgets["messageBudgetTokens"] == budgets["effectiveInputTokens"] * 10 // 100
        assert f"over the prompt budget of {budgets['promptBudgetTokens']}" in failure["message"]
        identity = [c for c in trace["contributors"] if c["id"] == "identity"]
        assert identity and identity[0]["status"] == "ok"  # it ran; its section was what did not fit
        assert trace["collection"]["sections"]  # what was collected before admission failed


def test_in_shadow_a_failed_candidate_is_traced_and_the_client_request_still_sent(start_proxy, provider):
    proxy = start_proxy(mode="shadow", trace_enabled=True)
    messages = [
        {"role": "system", "content": "Follow every rule carefully. " * 2_000},
        {"role": "user", "content": "go"},
    ]
    answer = proxy.client().chat.completions.create(
        model="test-model", messages=messages, extra_headers={"x-session-id": "big-shadow"}
    )
    assert answer.choices[0].message.content == "ok"
    assert provider.history[0]["messages"] == messages  # the client's request, as shadow always sends it

    (trace,) = _traces(_trace_dir(proxy), "big-shadow")
    assert trace["mode"] == "shadow"
    failure = trace["assemblyError"]
    assert (failure["code"], failure["status"], failure["stage"]) == ("context_assembly_failed", 400, "budget")
    assert trace["llmInput"]["messages"] == messages


def test_the_report_counts_assembly_failures(start_proxy, provider, tmp_path):
    proxy = start_proxy(mode="dynamic", trace_enabled=True)
    client = proxy.client()
    small = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "go"}]
    client.chat.completions.create(model="test-model", messages=small, extra_headers={"x-session-id": "mixed"})
    big = [{"role": "system", "content": "Follow every rule. " * 3_000}, {"role": "user", "content": "go"}]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="test-model", messages=big, extra_headers={"x-session-id": "mixed"})

    folder = _trace_dir(proxy)
    failed = sum("assemblyError" in t for t in _traces(folder, "mixed"))
    assert failed == 1
    out = tmp_path / "report.html"
    assert cli(["report", "--traces", str(folder), "--out", str(out)]) == 0
    page = out.read_text()
    data = json.loads(page.split('<script type="application/json" id="report-data">', 1)[1].split("</script>", 1)[0])
    (session,) = [s for s in data["sessions"] if s["contextId"] == "mixed"]
    assert session["assemblyFailures"] == failed and session["modelCalls"] == 2
    assert f'data-key="assemblyFailures">{failed}</td>' in page
    assert [bool(t["assemblyError"]) for t in session["turns"]] == [False, True]
    # Nothing was sent for the failed turn: its tokens count on neither side of the savings.
    (answered,) = [t for t in _traces(folder, "mixed") if "llmInput" in t]
    assert (session["clientTokens"], session["proxyTokens"]) == (answered["clientTokens"], answered["estimatedTokens"])


@pytest.fixture
def probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Install the two probes the way pip would: a module and a *.dist-info with entry points on sys.path."""
    site = tmp_path / "site"
    dist = site / "trace_probes-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (site / "trace_probes.py").write_text(PROBES)
    dist.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: trace-probes\nVersion: 0.1.0\n")
    points = "[science_context.contributors]\nflaky_probe = trace_probes:flaky\nnoted_probe = trace_probes:noted\n"
    dist.joinpath("entry_points.txt").write_text(points)
    monkeypatch.syspath_prepend(str(site))


def test_collection_and_cap_diagnostics_and_the_backend_arguments_are_traced(start_proxy, provider, probes):
    proxy = start_proxy(mode="dynamic", trace_enabled=True, max_history_messages=3, provider_timeout_seconds=321)
    history: list[dict[str, Any]] = [{"role": "user", "content": "first question"}]
    for k in range(3):
        history += [{"role": "assistant", "content": f"answer {k}"}, {"role": "user", "content": f"question {k}"}]
    answer = proxy.client().chat.completions.create(
        model="test-model",
        messages=history,
        extra_headers={"x-session-id": "noted"},  # type: ignore[arg-type]
    )
    assert answer.choices[0].message.content == "ok"  # an optional contributor's failure does not fail the turn

    (trace,) = _traces(_trace_dir(proxy), "noted")
    diagnostics = {d["code"]: d for d in trace["collection"]["diagnostics"]}
    flaky = diagnostics["contributor_error"]
    assert flaky["source"] == "flaky_probe" and "RuntimeError: the lab database is down" in flaky["message"]
    noted = diagnostics["option_ignored"]
    assert (noted["level"], noted["source"], noted["message"]) == ("warning", "noted_probe", "unknown unit 'furlong'")
    assert [c["status"] for c in trace["contributors"] if c["id"] == "flaky_probe"] == ["error"]
    cap = trace["cap"]
    assert cap["max"] == 3 and cap["droppedMessages"] > 0
    assert [d["code"] for d in cap["diagnostics"]] == ["message_cap_dropped"]
    assert f"{cap['droppedMessages']} messages dropped" in cap["diagnostics"][0]["message"]

    # llmInput is what the provider call was made with, the backend's own arguments included, without
    # the credential; the provider itself received none of them (litellm consumes them).
    llm_input = trace["llmInput"]
    assert (llm_input["timeout"], llm_input["max_retries"], llm_input["num_retries"]) == (321, 0, 0)
    assert "api_key" not in llm_input and "sk-test-provider" not in json.dumps(trace)
    (sent,) = provider.history
    assert not {"timeout", "max_retries", "num_retries", "api_key"} & set(sent)
    budgets = trace["budgets"]
    assert (budgets["promptBudgetTokens"], budgets["messageBudgetTokens"]) == (
        budgets["effectiveInputTokens"] * 25 // 100,
        budgets["effectiveInputTokens"] * 10 // 100,
    )


def _science_route(provider_url: str) -> ModelRoute:
    return ModelRoute(
        "science-model",
        {"model": "openai/scripted", "api_base": f"{provider_url}/v1", "api_key": "sk-test-provider"},
        max_input_tokens=16_000,
        max_output_tokens=2_000,
    )


def test_previews_reapplied_from_earlier_turns_are_listed_beside_new_ones(start_proxy, provider):
    model = ScienceModel(8)
    provider.script(model)
    proxy = start_proxy(mode="dynamic", models=(_science_route(provider.url),), trace_enabled=True)
    client = proxy.client()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an autonomous lab agent. Run the protocol step by step."},
        {"role": "user", "content": "Run the 8-step calibration protocol, then report the calibration fact."},
    ]
    for _ in range(12):
        completion = client.chat.completions.create(
            model="science-model",
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            extra_headers={"x-session-id": "previews"},
        )
        message = completion.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        if not message.get("tool_calls"):
            break
        messages.extend(client_tool_result(call) for call in message["tool_calls"])

    previewed: set[str] = set()  # every body a turn has previewed so far, in turn order
    reapplied_seen = False
    for trace in _traces(_trace_dir(proxy), "previews"):
        compaction = trace["compaction"]
        new, again = set(compaction["compactedRefs"]), set(compaction["reappliedRefs"])
        assert not new & again  # a body is either new this turn or re-applied, never both
        assert again <= previewed  # only what an earlier turn previewed is re-applied
        reapplied_seen |= bool(again)
        shown = json.dumps(trace["llmInput"]["messages"])
        assert all(f"ref={ref}" in shown for ref in new | again)  # both kinds are what the model saw
        if "<checkpoint " not in shown:  # (a checkpoint may cite references itself)
            assert {ref for ref in previewed if f"ref={ref}" in shown} <= new | again  # every preview listed
        previewed |= new | again
    assert previewed and reapplied_seen


def test_summarizer_calls_record_the_backend_arguments_too(start_proxy, provider):
    model = ScienceModel(40)
    provider.script(model)
    proxy = start_proxy(mode="dynamic", models=(_science_route(provider.url),), trace_enabled=True)
    client = proxy.client()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an autonomous lab agent. Run the protocol step by step."},
        {"role": "user", "content": "Run the 40-step calibration protocol, then report the calibration fact."},
    ]
    for _ in range(44):
        completion = client.chat.completions.create(
            model="science-model",
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            extra_headers={"x-session-id": "summaries"},
        )
        message = completion.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        if not message.get("tool_calls") or model.summaries:
            break
        messages.extend(client_tool_result(call) for call in message["tool_calls"])
    calls = [c for t in _traces(_trace_dir(proxy), "summaries") for c in t.get("summarizerCalls", [])]
    assert calls
    for call in calls:
        assert (call["llmInput"]["max_retries"], call["llmInput"]["num_retries"]) == (0, 0)
        assert "timeout" in call["llmInput"] and "api_key" not in call["llmInput"]
