"""Recorded provider traffic, pinned: any change in what the provider receives fails here.

Each test drives the real proxy (uvicorn on loopback, the real app, the SQLite store, litellm) with the
OpenAI SDK and records only the proxy-to-provider traffic with vcrpy, matched on method, path and body.
The recorded request body *is* the exact input litellm handed the provider, so a change anywhere in the
assembly (a section removed or reworded, a compaction knob moved, a tool schema changed) no longer
matches the cassette and the test that exercised it fails.

Replay is the default (CI has no provider): vcrpy answers litellm's calls from ``cassettes/`` and the
scripted provider must see no request at all. The one switch::

    CONTEXT_PROXY_RECORD_CASSETTES=1 .venv/bin/pytest tests/integration/test_cassettes.py

re-records every cassette against the scripted provider. Request and response headers are reduced to
the content type and the provider's host:port is normalized, so a re-record of an unchanged product
writes byte-identical files (``git diff --exit-code cassettes/`` after a re-record is the check).

Settings start from ``Settings.from_env({})``: the defaults the product really ships, so a changed
default (a compaction knob, a budget share) is caught here too, not only a changed dataclass field.
The scripts below run only while recording; in replay every assertion is on the cassette, the client's
answers and the trace files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import vcr
from vcr.request import Request as VcrRequest

from proxy.context.checkpoint import CHECKPOINT_OPEN
from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.science_script import TOOLS as SCIENCE_TOOLS
from proxy.provider.science_script import checkpoint_for, is_summary_request, tool_output
from proxy.provider.scripted import Reply, ToolCall
from tests.integration.conftest import route_to

CASSETTES = Path(__file__).parents[2] / "cassettes"
RECORDING = os.environ.get("CONTEXT_PROXY_RECORD_CASSETTES") == "1"
# The framing nonces derive from it: pinned, so that recorded provider input is the same in every run.
FRAMING_SECRET = b"context-proxy cassettes: a fixed framing secret"
PLUGIN = Path(__file__).parents[1] / "plugins" / "sample_contributor_pkg"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "measure",
            "parameters": {"type": "object", "properties": {"sample": {"type": "string"}}, "required": ["sample"]},
        },
    }
]
LIMS_TOOL = {
    "type": "function",
    "function": {
        "name": "mcp__lims__lookup",
        "description": "Look up a sample in the LIMS by its number.",
        "parameters": {"type": "object", "properties": {"sample": {"type": "string"}}, "required": ["sample"]},
    },
}
PLAN_TOOL = {
    "type": "function",
    "function": {
        "name": "update_plan",
        "description": "Declare or update the plan.",
        "parameters": {
            "type": "object",
            "properties": {"plan": {"type": "array", "items": {"type": "object"}}, "explanation": {"type": "string"}},
            "required": ["plan"],
        },
    },
}
SYSTEM = "You are Ada, a careful crystallography agent. Never discard raw diffraction frames."
GOVERNANCE = "Policy: every claim cites a stored output. Destructive commands need operator approval."
CONTRACT = "Run contract: budget 40 steps; deliver a refined structure file and a one-page report."
SKILL_BODY = "Index the peaks first, then refine the lattice. "
PLAN = {
    "plan": [
        {"step": "calibrate the diffractometer", "status": "in_progress"},
        {"step": "refine the structure", "status": "pending"},
    ],
    "explanation": "calibration first",
}
# The sections the main agent's system prompt holds, in order: deleting or reordering one fails the
# skill/deferred-tool test by name (and every cassette whose prompt held it).
MAIN_SECTIONS = ["identity", "governance", "run_contract", "capabilities", "skills.catalog"]


# --- the recorder -------------------------------------------------------------------------------------


def provider_recorder(proxy_url: str, headers: frozenset[str] = frozenset()) -> vcr.VCR:
    """A VCR that records only proxy-to-provider traffic; the client's calls to the proxy pass through.

    ``headers``: request headers (lower-case names, never credentials) kept beside the content type and
    matched too, for the native passage, where the API's own headers (``anthropic-beta``) are part of
    what the provider receives."""
    kept = frozenset({"content-type"}) | headers

    def keep_provider_requests(request: VcrRequest) -> VcrRequest | None:
        if request.uri.startswith(proxy_url):
            return None
        request.headers = {k: v for k, v in request.headers.items() if k.lower() in kept}
        request.uri = "http://scripted-provider" + urlsplit(request.uri).path  # ports differ per run; paths match
        return request

    def same_kept_headers(recorded: VcrRequest, sent: VcrRequest) -> None:
        def named(request: VcrRequest) -> dict[str, Any]:
            return {k.lower(): v for k, v in request.headers.items() if k.lower() in headers}

        assert named(recorded) == named(sent), f"{named(recorded)} != {named(sent)}"

    def stable_response(response: dict[str, Any]) -> dict[str, Any]:
        # One spelling of the name: aiohttp (litellm's transport) keeps the server's "Content-Type",
        # httpx (the provider fast path) lowercases it, and a re-record must not depend on which one ran.
        kept = [v for k, v in response["headers"].items() if k.lower() == "content-type"]
        response["headers"] = {"Content-Type": kept[0]} if kept else {}
        return response

    recorder = vcr.VCR(
        cassette_library_dir=str(CASSETTES),
        record_mode="all" if RECORDING else "none",
        match_on=["method", "path", "body", "kept_headers"],
        filter_headers=["authorization"],
        before_record_request=keep_provider_requests,
        before_record_response=stable_response,
        decode_compressed_response=True,
    )
    recorder.register_matcher("kept_headers", same_kept_headers)
    return recorder


def use_cassette(proxy_url: str, name: str, headers: frozenset[str] = frozenset()) -> Any:
    """The named cassette; a re-record starts from an empty file so that it holds this run only."""
    if RECORDING:
        (CASSETTES / name).unlink(missing_ok=True)
    return provider_recorder(proxy_url, headers).use_cassette(name)


@pytest.fixture
def replay_checked(provider):
    """After the test: in replay mode the real provider must not have been called."""
    yield
    if not RECORDING:
        assert provider.history == [], "a provider call was not answered from the cassette"


# --- helpers ------------------------------------------------------------------------------------------


def _route(provider_url: str, window: int = 16_000, output: int = 2_000) -> ModelRoute:
    return route_to(provider_url, "lab-model", window=window, max_output=output)


@pytest.fixture
def pinned_proxy(start_proxy, provider) -> Callable[..., Any]:
    """Start the proxy on the shipped defaults (``Settings.from_env({})``) plus overrides, traces on."""
    shipped = Settings.from_env(environ={})
    defaults = {f.name: getattr(shipped, f.name) for f in dataclasses.fields(Settings)}
    for name in ("data_dir", "models"):
        defaults.pop(name)

    def start(window: int = 16_000, output: int = 2_000, **overrides: Any) -> Any:
        return start_proxy(
            **{
                **defaults,
                "trace_enabled": True,
                "framing_secret": FRAMING_SECRET,
                "models": (_route(provider.url, window, output),),
                **overrides,
            }
        )

    return start


@pytest.fixture
def skills_folder(tmp_path: Path) -> Path:
    """Two skills in a temp folder: its path differs every run, so a path leaking into a prompt fails replay."""
    folder = tmp_path / "skills"
    for name, description, body in [
        ("xrd-refinement", "Refine a crystal structure from powder XRD data.", SKILL_BODY * 30),
        ("safety-check", "Check a protocol against lab safety rules.", "Never heat sealed vessels. " * 20),
    ]:
        (folder / name).mkdir(parents=True)
        (folder / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n{body}\n")
    return folder


@pytest.fixture
def sample_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Install the well-behaved sample contributor the way pip would: a dist-info folder on sys.path."""
    points = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]["entry-points"]
    dist = tmp_path / "site" / "sample_contributor_pkg-0.1.0.dist-info"
    dist.mkdir(parents=True)
    dist.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: sample-contributor-pkg\nVersion: 0.1.0\n")
    lines = "".join(f"{k} = {v}\n" for k, v in points["science_context.contributors"].items() if k == "sample")
    dist.joinpath("entry_points.txt").write_text(f"[science_context.contributors]\n{lines}")
    monkeypatch.syspath_prepend(str(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))


def _post(proxy: Any, messages: list[dict[str, Any]], session: str, scope: str = "main", **extra: Any) -> Any:
    return proxy.client().chat.completions.create(
        model="lab-model", messages=messages, extra_headers={"x-session-id": session, "x-agent-scope": scope}, **extra
    )


def _sent(cassette: Any) -> list[dict[str, Any]]:
    """The provider request bodies of a cassette, in order: exactly what litellm sent."""
    return [json.loads(request.body) for request in cassette.requests]


def _traces(proxy: Any, session: str) -> list[dict[str, Any]]:
    """The session's trace files in call order (a recovery file right after its original attempt)."""
    folder = proxy.settings.data_dir / "context-traces" / session
    paths = sorted(folder.glob("turn-*.json"), key=lambda path: path.stem)  # turn-0001 before turn-0001-recovery-1
    return [json.loads(path.read_text()) for path in paths]


def _system(body: dict[str, Any]) -> str:
    first = body["messages"][0]
    assert first["role"] == "system"
    assert [m for m in body["messages"] if m["role"] == "system"] == [first]  # one system message, first
    return str(first["content"])


def _hidden(body: dict[str, Any], source: str) -> list[str]:
    return [
        str(m["content"])
        for m in body["messages"]
        if m["role"] == "user" and str(m["content"]).startswith(f'<context source="{source}"')
    ]


def _tool_names(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools", [])]


def _assert_llm_input_was_sent(trace: dict[str, Any], body: dict[str, Any]) -> None:
    """The trace's ``llmInput`` is what litellm got; the cassette body is what litellm sent from it."""
    llm_input = dict(trace["llmInput"])
    assert llm_input.pop("model") == "openai/scripted" and body["model"] == "scripted"
    assert llm_input.pop("api_base").endswith("/v1")
    assert "api_key" not in llm_input
    # What the backend adds to every call (proxy/provider/litellm_backend.py) is traced too; litellm consumes it.
    assert (llm_input.pop("max_retries"), llm_input.pop("num_retries")) == (0, 0)
    assert isinstance(llm_input.pop("timeout"), int | float)
    # litellm's one rewrite on the way out: it omits ``content: null`` on assistant tool-call messages.
    llm_input["messages"] = [
        {k: v for k, v in m.items() if not (k == "content" and v is None and m.get("tool_calls"))}
        for m in llm_input["messages"]
    ]
    assert {k: v for k, v in body.items() if k != "model"} == llm_input


def _reply_to_summary(body: dict[str, Any]) -> Reply:
    return Reply(content=checkpoint_for(body["messages"][-1]["content"]))


# --- legacy ---------------------------------------------------------------------------------------------


def _tool_loop_script(body: dict[str, Any]) -> Reply:
    results = [m for m in body["messages"] if m["role"] == "tool"]
    if not results:
        return Reply(tool_calls=(ToolCall("measure", {"sample": "A"}), ToolCall("measure", {"sample": "B"})))
    return Reply(content="A and B measured: " + ", ".join(m["content"] for m in results))


def test_legacy_tool_loop_is_pinned(provider, legacy_proxy, replay_checked):
    provider.script(_tool_loop_script)
    client = legacy_proxy.client()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Measure A and B."}]
    with use_cassette(legacy_proxy.url, "legacy_tool_loop.yaml") as cassette:
        first = client.chat.completions.create(
            model="test-model", messages=messages, tools=TOOLS, extra_headers={"x-session-id": "pinned-loop"}
        )
        calls = first.choices[0].message.tool_calls
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": c.id, "content": f"{c.function.arguments} -> 1.0"} for c in calls]
        final = client.chat.completions.create(
            model="test-model", messages=messages, tools=TOOLS, extra_headers={"x-session-id": "pinned-loop"}
        )
    assert [c.function.name for c in calls] == ["measure", "measure"]
    assert final.choices[0].message.content.startswith("A and B measured")
    sent = _sent(cassette)
    assert [body["messages"] for body in sent] == [messages[:1], messages]  # the provider got what the client sent


def test_legacy_stream_is_pinned(provider, legacy_proxy, replay_checked):
    provider.script(lambda body: Reply(content="streamed answer, pinned in a cassette"))
    client = legacy_proxy.client()
    with use_cassette(legacy_proxy.url, "legacy_stream.yaml"):
        stream = client.chat.completions.create(
            model="test-model",
            messages=[{"role": "user", "content": "Say it."}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == "streamed answer, pinned in a cassette"
    )
    assert chunks[-1].usage is not None and chunks[-1].choices == []


# --- dynamic, main scope: skill loading and deferred MCP promotion ------------------------------------


def _main_agent_script(body: dict[str, Any]) -> Reply:
    """read_skill, then find_tools, then the promoted LIMS tool (a client call), then the answer."""
    names = set(_tool_names(body))
    calls = [c["function"]["name"] for m in body["messages"] for c in m.get("tool_calls") or []]
    if "read_skill" not in calls:
        return Reply(tool_calls=(ToolCall("read_skill", {"name": "xrd-refinement"}, id="call_skill"),))
    if "mcp__lims__lookup" not in names:
        return Reply(tool_calls=(ToolCall("find_tools", {"query": "LIMS sample"}, id="call_find"),))
    if "mcp__lims__lookup" not in calls:
        return Reply(tool_calls=(ToolCall("mcp__lims__lookup", {"sample": "7"}, id="call_lims"),))
    return Reply(content="Sample 7 is the NaCl reference; refinement follows the xrd-refinement skill.")


def test_dynamic_main_loads_a_skill_and_promotes_a_deferred_tool(provider, pinned_proxy, skills_folder, replay_checked):
    provider.script(_main_agent_script)
    options = {
        "skills": {"folder": str(skills_folder)},
        "capabilities": {"deferred": ["mcp__*"]},
        "governance": {"policy": GOVERNANCE},
        "run_contract": {"profile": CONTRACT},
    }
    proxy = pinned_proxy(contributor_options=options)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Which sample is 7, and how do I refine it?"},
    ]
    with use_cassette(proxy.url, "dynamic_main_skill_deferred.yaml") as cassette:
        first = _post(proxy, messages, "main-skill", tools=[*TOOLS, LIMS_TOOL])
        message = first.choices[0].message
        # The client sees only its own tool: read_skill and find_tools ran inside the proxy.
        assert [c.function.name for c in message.tool_calls] == ["mcp__lims__lookup"]
        messages.append(message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": "call_lims", "content": "sample 7: NaCl reference"})
        final = _post(proxy, messages, "main-skill", tools=[*TOOLS, LIMS_TOOL])
    assert final.choices[0].message.content.startswith("Sample 7 is the NaCl reference")

    sent = _sent(cassette)
    assert len(sent) == 4  # read_skill round, find_tools round, the LIMS call, the answer
    # Deferred: absent until find_tools promoted it, offered from the next model call on.
    # The proxy's tools are offered from the first call of a tool session, references or not, so the tool
    # list (a cached prefix) stays byte-stable: only a promoted deferred tool is added.
    assert _tool_names(sent[0]) == ["measure", "find_tools", "read_skill", "read_tool_output"]
    assert _tool_names(sent[1]) == _tool_names(sent[0])
    assert "mcp__lims__lookup" in _tool_names(sent[2]) and "mcp__lims__lookup" in _tool_names(sent[3])
    for body in sent:
        prompt = _system(body)
        assert SYSTEM in prompt and GOVERNANCE in prompt and CONTRACT in prompt
        assert "xrd-refinement: Refine a crystal structure" in prompt  # the catalog ...
        assert SKILL_BODY not in prompt  # ... never the body
        assert str(skills_folder) not in json.dumps(body)  # no temp path reaches the model
    for body in sent[1:]:
        bodies = [m for m in body["messages"] if SKILL_BODY in str(m.get("content"))]
        assert len(bodies) == 1 and bodies[0]["role"] == "tool"  # the body exactly once, as read_skill's result
        assert str(bodies[0]["content"]).startswith('<skill name="xrd-refinement" revision="')

    traces = _traces(proxy, "main-skill")
    assert [t["turn"] for t in traces] == [1, 2, 3, 4]  # one file per model call, proxy rounds included
    for trace, body in zip(traces, sent, strict=True):
        _assert_llm_input_was_sent(trace, body)
        assert trace["mode"] == "dynamic" and trace["scope"] == "main" and trace["selectedPath"] == "dynamic"
        rendered = trace["renderedContext"]
        assert rendered["sectionIds"] == MAIN_SECTIONS
        assert rendered["prompt"] == body["messages"][0]["content"]
        assert rendered["callHistory"] == trace["llmInput"]["messages"]  # dynamic: the candidate was sent
        statuses = {c["id"]: c["status"] for c in trace["contributors"]}
        assert {"identity", "governance", "run_contract", "capabilities", "skills"} <= set(statuses)
        assert set(statuses.values()) == {"ok"}
        assert sorted(s["id"] for s in trace["collection"]["sections"]) == sorted(MAIN_SECTIONS)  # as collected
        assert [s["id"] for s in trace["admitted"]["sections"]] == MAIN_SECTIONS  # admitted in slot order
        assert trace["compaction"]["reason"] is None and trace["compaction"]["compactedRefs"] == []


# --- the model-facing budget and a contributor package --------------------------------------------------


def test_tight_window_keeps_protected_sections_whole_and_cuts_the_package(
    provider, pinned_proxy, sample_package, replay_checked
):
    provider.script(lambda body: Reply(content="tight but whole"))
    options = {"governance": {"policy": GOVERNANCE}, "run_contract": {"profile": CONTRACT}}
    proxy = pinned_proxy(window=3_000, output=1_000, contributor_options=options)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Refine sample 7. " * 40}]
    with use_cassette(proxy.url, "tight_budget_package.yaml") as cassette:
        answer = _post(proxy, messages, "tight")
    assert answer.choices[0].message.content == "tight but whole"
    (body,) = _sent(cassette)
    prompt = _system(body)
    for protected in (SYSTEM, GOVERNANCE, CONTRACT):
        assert protected in prompt  # admitted first, never cut
    (trace,) = _traces(proxy, "tight")
    _assert_llm_input_was_sent(trace, body)
    assert trace["budgets"]["effectiveInputTokens"] == 2_000  # 3,000 window - 1,000 output reserve
    # The package's section and attachment were cut by the budget, with diagnostics saying so.
    cuts = {d["code"] for d in trace["admitted"]["diagnostics"] if d["source"] == "sample"}
    assert cuts and all(code.startswith(("section_", "attachment_")) for code in cuts)
    collected = next(a for a in trace["collection"]["attachments"] if a["id"] == "sample.notes")
    sent_notes = _hidden(body, "sample")
    assert all(len(note) < len(collected["content"]) for note in sent_notes)
    assert trace["estimatedTokens"] <= trace["budgets"]["effectiveInputTokens"]


def test_contributor_package_and_plan_stay_in_their_scopes(provider, pinned_proxy, sample_package, replay_checked):
    provider.script(lambda body: Reply(content=f"answer for {len(body['messages'])} messages"))
    proxy = pinned_proxy()
    plan_call = {
        "id": "call_plan",
        "type": "function",
        "function": {"name": "update_plan", "arguments": json.dumps(PLAN)},
    }
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Calibrate, then refine sample 7."},
        {"role": "assistant", "content": None, "tool_calls": [plan_call]},
        {"role": "tool", "tool_call_id": "call_plan", "content": "Plan updated"},
    ]
    with use_cassette(proxy.url, "package_scopes.yaml") as cassette:
        _post(proxy, messages, "scoped-main", tools=[PLAN_TOOL])
        _post(proxy, messages, "scoped-reviewer", scope="reviewer", tools=[PLAN_TOOL])
    main, reviewer = _sent(cassette)
    # The package registered through its entry point: main gets its attachment as untrusted data.
    (note,) = _hidden(main, "sample")
    assert 'trust="untrusted_data"' in note
    assert "Sample package notes." in _system(main)
    (plan,) = _hidden(main, "plan")
    assert 'authority="data_only"' in plan and "[in_progress] calibrate the diffractometer" in plan
    # Its scope is main only, and the reviewer judges the work, not the main agent's plan.
    assert _hidden(reviewer, "sample") == [] and _hidden(reviewer, "plan") == []
    assert "Sample package notes." not in _system(reviewer)
    (main_trace,) = _traces(proxy, "scoped-main")
    (reviewer_trace,) = _traces(proxy, "scoped-reviewer")
    _assert_llm_input_was_sent(main_trace, main)
    _assert_llm_input_was_sent(reviewer_trace, reviewer)
    assert reviewer_trace["scope"] == "reviewer"
    main_ids = {c["id"] for c in main_trace["contributors"]}
    reviewer_ids = {c["id"] for c in reviewer_trace["contributors"]}
    assert {"sample", "plan"} <= main_ids and not {"sample", "plan"} & reviewer_ids
    assert main_trace["planProgress"] == {
        "toolCallId": "call_plan",
        "anchorFound": True,
        "laterSteps": 0,
        "laterToolResults": 0,
    }


# --- shadow: the provider gets the client's request, the trace holds the candidate -----------------------


def test_shadow_subagent_sends_the_clients_request_and_traces_the_candidate(provider, pinned_proxy, replay_checked):
    provider.script(lambda body: Reply(content="shadowed answer"))
    proxy = pinned_proxy(mode="shadow", contributor_options={"governance": {"policy": GOVERNANCE}})
    plan_call = {
        "id": "call_plan",
        "type": "function",
        "function": {"name": "update_plan", "arguments": json.dumps(PLAN)},
    }
    messages = [
        {"role": "system", "content": "You are a subagent: calibrate the diffractometer."},
        {"role": "user", "content": "Calibrate."},
        {"role": "assistant", "content": None, "tool_calls": [plan_call]},
        {"role": "tool", "tool_call_id": "call_plan", "content": "Plan updated"},
    ]
    with use_cassette(proxy.url, "shadow_subagent.yaml") as cassette:
        answer = _post(proxy, messages, "shadow-sub", scope="subagent", tools=[PLAN_TOOL])
    assert answer.choices[0].message.content == "shadowed answer"
    (body,) = _sent(cassette)
    # What the provider got is the client's request, byte for byte but for litellm's own rewrites.
    sent_messages = [dict(m) for m in messages]
    del sent_messages[2]["content"]  # litellm omits content: null on a tool-call message
    assert body == {"model": "scripted", "messages": sent_messages, "tools": [PLAN_TOOL]}
    (trace,) = _traces(proxy, "shadow-sub")
    _assert_llm_input_was_sent(trace, body)
    assert trace["mode"] == "shadow" and trace["scope"] == "subagent" and trace["selectedPath"] == "dynamic"
    # The candidate, beside what the model actually got: governance prompt and the plan projection.
    candidate = trace["renderedContext"]["callHistory"]
    assert candidate != trace["llmInput"]["messages"]
    assert GOVERNANCE in candidate[0]["content"] and candidate[0]["content"] == trace["renderedContext"]["prompt"]
    assert any(str(m.get("content")).startswith('<context source="plan"') for m in candidate)
    assert trace["renderedContext"]["sectionIds"] == ["identity", "governance", "capabilities"]
    assert trace["planProgress"]["anchorFound"] is True


# --- an overflow the provider reports: one forced pass, one retry ---------------------------------------


def test_provider_overflow_is_retried_once_after_a_forced_pass(provider, pinned_proxy, replay_checked):
    # The provider's real window (bytes/4) is far below what the proxy believes (16,000 tokens).
    provider.script(
        lambda body: _reply_to_summary(body) if is_summary_request(body) else Reply(content="fits now"),
        context_window=2_500,
    )
    proxy = pinned_proxy(output=500)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Run six calibration steps."}]
    for step in range(1, 7):
        call = {
            "id": f"call_{step}",
            "type": "function",
            "function": {"name": "run_step", "arguments": json.dumps({"step": step})},
        }
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{step}", "content": tool_output(step, 2_500)},
        ]
    with use_cassette(proxy.url, "overflow_recovery.yaml") as cassette:
        answer = _post(proxy, messages, "overflow", tools=SCIENCE_TOOLS)
    assert answer.choices[0].message.content == "fits now"
    sent = [b for b in _sent(cassette) if not is_summary_request(b)]
    assert len(sent) == 2  # the attempt the provider rejected, and exactly one retry
    original, recovery = _traces(proxy, "overflow")
    assert original["turn"] == recovery["turn"] == 1
    assert "recovery" not in original and original["providerError"]["code"] == "context_length_exceeded"
    assert recovery["recovery"]["attempt"] == 1 and recovery["recovery"]["reason"] == "provider_context_overflow"
    assert recovery["compaction"]["recovery"] == {"reason": "provider_context_overflow", "statedLimit": 2_500}
    assert recovery["budgets"]["source"] == "provider_error"
    assert recovery["compaction"]["compactedRefs"]  # old outputs became previews with references
    _assert_llm_input_was_sent(original, sent[0])
    _assert_llm_input_was_sent(recovery, sent[1])
    assert len(json.dumps(sent[1]["messages"])) < len(json.dumps(sent[0]["messages"])) // 2
    assert "ref=" in json.dumps(sent[1]["messages"])


# --- a subagent past the compaction threshold keeps its plan and skill references -----------------------

COMPACTION_STEPS = 12
STEP_LOG = re.compile(r"^step=(\d+) measurement log$", re.MULTILINE)


def _subagent_script(body: dict[str, Any]) -> Reply:
    """update_plan, read_skill, then ``COMPACTION_STEPS`` run_step calls, then the answer.

    Where the run stands is read from what the model is shown (its step logs name their step on their
    first line, which previews keep), so the script works on compacted input too.
    """
    if is_summary_request(body):
        return _reply_to_summary(body)
    contents = [str(m.get("content") or "") for m in body["messages"]]
    steps = [int(found) for c in contents for found in STEP_LOG.findall(c[:400])]  # whole logs and previews
    steps += [int(line.split()[2]) for c in contents for line in c.splitlines() if line.startswith("- step ")]
    last = max(steps, default=0)
    if last >= COMPACTION_STEPS:
        return Reply(content=f"Calibrated in {last} steps, following the xrd-refinement skill.")
    if last:
        return Reply(tool_calls=(ToolCall("run_step", {"step": last + 1}, id=f"call_step_{last + 1}"),))
    if any(c.startswith('<skill name="xrd-refinement"') for c in contents):
        return Reply(tool_calls=(ToolCall("run_step", {"step": 1}, id="call_step_1"),))
    if any(m.get("tool_call_id") == "call_plan" for m in body["messages"]):
        return Reply(tool_calls=(ToolCall("read_skill", {"name": "xrd-refinement"}, id="call_skill"),))
    return Reply(tool_calls=(ToolCall("update_plan", PLAN, id="call_plan"),))


def test_subagent_past_the_compaction_threshold_keeps_plan_and_skill_references(
    provider, pinned_proxy, skills_folder, replay_checked
):
    provider.script(_subagent_script)
    proxy = pinned_proxy(window=7_000, output=1_000, contributor_options={"skills": {"folder": str(skills_folder)}})
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a calibration subagent. Declare a plan, then run the protocol."},
        {"role": "user", "content": f"Run the {COMPACTION_STEPS}-step calibration protocol."},
    ]
    answers = []
    with use_cassette(proxy.url, "subagent_compaction.yaml") as cassette:
        for _ in range(COMPACTION_STEPS + 3):
            answer = _post(proxy, messages, "subagent-long", scope="subagent", tools=[PLAN_TOOL, *SCIENCE_TOOLS])
            message = answer.choices[0].message.model_dump(exclude_none=True)
            messages.append(message)
            answers.append(message)
            if not message.get("tool_calls"):
                break
            for call in message["tool_calls"]:
                name, arguments = call["function"]["name"], json.loads(call["function"]["arguments"])
                result = "Plan updated" if name == "update_plan" else tool_output(arguments["step"], 3_000)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    assert answers[-1]["content"] == f"Calibrated in {COMPACTION_STEPS} steps, following the xrd-refinement skill."
    assert "read_skill" not in json.dumps(messages)  # the proxy-owned round stayed inside the proxy

    all_sent = _sent(cassette)
    summaries = [b for b in all_sent if is_summary_request(b)]
    sent = [b for b in all_sent if not is_summary_request(b)]
    assert summaries, "the run never crossed the compaction threshold"
    traces = _traces(proxy, "subagent-long")
    assert len(traces) == len(sent)
    for trace, body in zip(traces, sent, strict=True):
        _assert_llm_input_was_sent(trace, body)
        assert trace["scope"] == "subagent"
        assert trace["estimatedTokens"] <= trace["budgets"]["effectiveInputTokens"]
        # A skill body is never in the system prompt and never twice in one request.
        assert SKILL_BODY not in _system(body)
        assert sum(SKILL_BODY in str(m.get("content")) for m in body["messages"]) <= 1
        # read_tool_output is offered on every call, with or without a reference in play: the tool list
        # never changes with what was compacted (prompt caching, and live streams).
        assert "read_tool_output" in _tool_names(body)
        # The plan is kept through every compaction, as call-local data.
        if trace["turn"] > 1:
            (plan,) = _hidden(body, "plan")
            assert "[in_progress] calibrate the diffractometer" in plan and 'authority="data_only"' in plan

    compacted = [t for t in traces if t["compaction"]["compactedRefs"]]
    summarized = [t for t in traces if t["compaction"]["summarizedMessages"]]
    assert compacted and summarized
    first = summarized[0]["compaction"]
    assert first["reason"] and first["tokensAfter"] < first["tokensBefore"]
    assert first["checkpointTokens"] < first["summarySourceTokens"]
    assert summarized[0]["summarizerCalls"][0]["llmInput"]["messages"] == summaries[0]["messages"]

    final, final_trace = sent[-1], traces[-1]
    # The skill result was compacted away: the reference survives as a notice to read it again.
    assert all(SKILL_BODY not in str(m.get("content")) for m in final["messages"])
    (notice,) = _hidden(final, "skills")
    assert "read_skill" in notice and "xrd-refinement" in notice
    # The declaring update_plan call was summarized away: progress says so instead of guessing.
    assert final_trace["planProgress"] == {"toolCallId": "call_plan", "anchorFound": False}
    assert "ref=" in json.dumps(final["messages"])  # stored outputs stay readable through read_tool_output


# --- the Responses API ingress --------------------------------------------------------------------------

RESPONSES_STEPS = 14


def _responses_script(body: dict[str, Any]) -> Reply:
    """``run_step`` calls until ``RESPONSES_STEPS``, then the answer; the step is read from what the model sees."""
    if is_summary_request(body):
        return _reply_to_summary(body)
    contents = [str(m.get("content") or "") for m in body["messages"]]
    steps = [int(found) for c in contents for found in STEP_LOG.findall(c[:400])]
    steps += [int(line.split()[2]) for c in contents for line in c.splitlines() if line.startswith("- step ")]
    last = max(steps, default=0)
    if last >= RESPONSES_STEPS:
        return Reply(content=f"Calibrated in {last} steps.")
    return Reply(tool_calls=(ToolCall("run_step", {"step": last + 1}, id=f"call_step_{last + 1}"),))


def test_responses_session_with_proxy_and_remote_compaction_is_pinned(provider, pinned_proxy, replay_checked):
    """A Codex-style Responses session (whole history resent, store: false) crossing the proxy's own
    compaction, then a remote compaction (compaction_trigger) and a turn carrying the compaction item."""
    provider.script(_responses_script)
    proxy = pinned_proxy(window=7_000, output=1_000)
    client = proxy.client()
    tools = [{"type": "function", **t["function"]} for t in SCIENCE_TOOLS] + [{"type": "web_search"}]
    task = f"Run the {RESPONSES_STEPS}-step calibration protocol."
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": SYSTEM}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": task}]},
    ]
    headers = {"session-id": "responses-pinned"}

    def turn(extra: list[dict[str, Any]] | None = None) -> Any:
        return client.responses.create(
            model="lab-model", input=items + (extra or []), tools=tools, store=False, extra_headers=headers
        )

    with use_cassette(proxy.url, "responses_compaction.yaml") as cassette:
        for _ in range(6):
            response = turn()
            call = response.output[0]
            items.append(call.model_dump(exclude_none=True))
            output = tool_output(json.loads(call.arguments)["step"], 3_000)
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": output})
        compacted = turn([{"type": "compaction_trigger"}])
        (item,) = compacted.output
        assert item.type == "compaction"
        # What Codex keeps: its developer/user messages, then the item verbatim.
        items = [i for i in items if i.get("type") == "message"] + [item.model_dump(exclude_none=True)]
        while True:
            response = turn()
            if response.output[0].type != "function_call":
                break
            call = response.output[0]
            items.append(call.model_dump(exclude_none=True))
            output = tool_output(json.loads(call.arguments)["step"], 3_000)
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": output})
    assert response.output_text == f"Calibrated in {RESPONSES_STEPS} steps."

    all_sent = _sent(cassette)
    summaries = [b for b in all_sent if is_summary_request(b)]
    sent = [b for b in all_sent if not is_summary_request(b)]
    assert len(summaries) >= 2  # the assembler's own checkpoint, and the remote compaction's
    traces = _traces(proxy, "responses-pinned")
    # The remote compaction is traced as a call of its own: its llmInput is the summarizer's request.
    (remote,) = [t for t in traces if (t["compaction"] or {}).get("reason") == "client_compaction_request"]
    assert remote["llmInput"]["messages"] in [s["messages"] for s in summaries]
    traces = [t for t in traces if t is not remote]
    assert len(traces) == len(sent)
    assert any(t["compaction"]["summarizedMessages"] for t in traces)
    for trace, body in zip(traces, sent, strict=True):
        _assert_llm_input_was_sent(trace, body)
        assert trace["ingress"]["hostedToolsOmitted"] == ["web_search"]
        assert "web_search" not in _tool_names(body)
        assert any(m["role"] == "user" and m["content"] == task for m in body["messages"])
    after = [b for b in sent if any(_is_checkpoint(m) for m in b["messages"])]
    assert after, "no turn after the remote compaction saw its checkpoint"


def _is_checkpoint(message: dict[str, Any]) -> bool:
    """A checkpoint message under whatever framing nonce the proxy's session has."""
    content = message.get("content")
    return message.get("role") == "user" and isinstance(content, str) and CHECKPOINT_OPEN.match(content) is not None
