"""Built-in contributors through real HTTP, asserted on what the scripted provider actually received."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from proxy.kernel.config import ModelRoute
from proxy.provider.science_script import checkpoint_for, is_summary_request
from proxy.provider.scripted import Reply, ToolCall
from tests.integration.conftest import route_to

PLUGIN = Path(__file__).parents[1] / "plugins" / "sample_contributor_pkg"
SYSTEM = "You are Ada, a careful crystallography agent. Never discard raw diffraction frames."
GOVERNANCE = "Policy: every claim cites a stored output. Destructive commands need operator approval."
CONTRACT = "Run contract: budget 40 steps; deliver a refined structure file and a one-page report."


def _route(provider_url: str, window: int = 16_000) -> ModelRoute:
    return route_to(provider_url, "lab-model", window=window, max_output=1_000)


def _skills(folder: Path) -> Path:
    for name, description, body in [
        ("xrd-refinement", "Refine a crystal structure from powder XRD data.", "Step 1: index peaks. " * 80),
        ("safety-check", "Check a protocol against lab safety rules.", "Never heat sealed vessels. " * 40),
    ]:
        (folder / name).mkdir(parents=True)
        (folder / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n{body}\n")
    return folder


def _system(body: dict[str, Any]) -> str:
    assert body["messages"][0]["role"] == "system"
    return str(body["messages"][0]["content"])


def _hidden(body: dict[str, Any], source: str) -> list[str]:
    return [
        m["content"]
        for m in body["messages"]
        if m["role"] == "user" and str(m["content"]).startswith(f'<context source="{source}"')
    ]


def _post(client: Any, messages: list[dict[str, Any]], session: str, scope: str = "main", **extra: Any) -> Any:
    return client.chat.completions.create(
        model="lab-model",
        messages=messages,
        extra_headers={"x-session-id": session, "x-agent-scope": scope},
        **extra,
    )


def test_protected_sections_arrive_whole_under_a_tight_budget(start_proxy, provider):
    options = {"governance": {"policy": GOVERNANCE}, "run_contract": {"profile": CONTRACT}}
    proxy = start_proxy(models=(_route(provider.url, window=3_000),), contributor_options=options, prompt_percent=40)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Refine sample 7. " * 50}]
    _post(proxy.client(), messages, "tight")
    prompt = _system(provider.history[-1])
    for text in (SYSTEM, GOVERNANCE, CONTRACT, 'authority="data_only"'):
        assert text in prompt
    assert [m for m in provider.history[-1]["messages"] if m["role"] == "system"] == [
        provider.history[-1]["messages"][0]
    ]
    assert sum(SYSTEM in json.dumps(m) for m in provider.history[-1]["messages"]) == 1  # not also in the history


def test_protected_sections_that_cannot_fit_fail_before_the_provider(start_proxy, provider):
    options = {"governance": {"policy": GOVERNANCE * 60}}
    proxy = start_proxy(models=(_route(provider.url, window=3_000),), contributor_options=options)
    import openai

    with pytest.raises(openai.BadRequestError) as caught:
        _post(proxy.client(), [{"role": "user", "content": "go"}], "too-big")
    assert "governance" in caught.value.message
    assert provider.history == []


@pytest.mark.parametrize("summarizer_works", [True, False], ids=["checkpointed", "trimmed-by-window"])
def test_skill_catalog_then_body_once_then_unavailability_notice(start_proxy, provider, tmp_path, summarizer_works):
    folder = _skills(tmp_path / "skills")
    options = {"skills": {"folder": str(folder)}}
    step = {"n": 0}

    def script(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return Reply(content=checkpoint_for(body["messages"][-1]["content"]) if summarizer_works else "no.")
        step["n"] += 1
        tools = {t["function"]["name"] for t in body.get("tools", [])}
        if step["n"] == 1:
            assert "read_skill" in tools
            return Reply(tool_calls=(ToolCall("read_skill", {"name": "xrd-refinement"}, id="sk1"),))
        return Reply(content=f"answer {step['n']}")

    provider.script(script)
    proxy = start_proxy(models=(_route(provider.url, window=8_000),), contributor_options=options)
    client = proxy.client()
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Refine."}]
    answer = _post(client, messages, "skills")
    assert answer.choices[0].message.content == "answer 2"  # the client never saw read_skill
    first, second = provider.history[0], provider.history[1]
    for body in (first, second):
        prompt = _system(body)
        assert "xrd-refinement" in prompt and "Refine a crystal structure" in prompt
        assert "Step 1: index peaks." not in prompt  # the catalog, never the body
    bodies = [m for m in second["messages"] if "Step 1: index peaks." in str(m.get("content"))]
    assert len(bodies) == 1 and bodies[0]["role"] == "tool"
    assert str(bodies[0]["content"]).startswith('<skill name="xrd-refinement" revision="')

    # A long run of big outputs pushes the skill result out of the visible history.
    messages.append({"role": "assistant", "content": "answer 2"})
    for k in range(12):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "measure", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": f"frame {k}: " + "0.125 " * 1500},
        ]
    messages.append({"role": "user", "content": "Continue."})
    _post(client, messages, "skills")
    last = provider.history[-1]
    assert all("Step 1: index peaks." not in str(m.get("content")) for m in last["messages"])
    notices = _hidden(last, "skills")
    assert notices and "read_skill" in notices[0] and "xrd-refinement" in notices[0]


def test_plan_state_follows_declared_order_when_results_arrive_out_of_order(start_proxy, provider):
    proxy = start_proxy(models=(_route(provider.url),))
    plans = [
        {"plan": [{"step": "index peaks", "status": "completed"}, {"step": "refine", "status": "pending"}]},
        {
            "plan": [{"step": "index peaks", "status": "completed"}, {"step": "refine", "status": "in_progress"}],
            "explanation": "refinement started",
        },
    ]
    calls = [
        {"id": f"p{i}", "type": "function", "function": {"name": "update_plan", "arguments": json.dumps(p)}}
        for i, p in enumerate(plans)
    ]
    messages = [
        {"role": "user", "content": "Refine sample 7."},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "p1", "content": "Plan updated"},  # the later call's result first
        {"role": "tool", "tool_call_id": "p0", "content": "Plan updated"},
    ]
    _post(proxy.client(), messages, "plan-order")
    (plan,) = _hidden(provider.history[-1], "plan")
    assert "[in_progress] refine" in plan and "refinement started" in plan
    assert 'authority="data_only"' in plan
    _post(proxy.client(), messages, "plan-order-reviewer", scope="reviewer")
    assert _hidden(provider.history[-1], "plan") == []  # the reviewer does not get the main agent's plan


def test_deferred_tool_absent_until_promoted_then_offered_next_call(start_proxy, provider):
    options = {"capabilities": {"deferred": ["mcp__*"]}}
    tools = [
        {
            "type": "function",
            "function": {
                "name": "measure",
                "description": "Measure a sample.",
                "parameters": {"type": "object", "properties": {}},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "mcp__lims__lookup",
                "description": "Look up a sample in the LIMS.",
                "parameters": {"type": "object", "properties": {}},
            },
        },
    ]
    seen: list[set[str]] = []

    def script(body: dict[str, Any]) -> Reply:
        names = {t["function"]["name"] for t in body.get("tools", [])}
        seen.append(names)
        if "mcp__lims__lookup" not in names:
            return Reply(tool_calls=(ToolCall("find_tools", {"query": "LIMS sample"}, id="f1"),))
        return Reply(tool_calls=(ToolCall("mcp__lims__lookup", {}, id="m1"),))

    provider.script(script)
    proxy = start_proxy(models=(_route(provider.url),), contributor_options=options)
    answer = _post(proxy.client(), [{"role": "user", "content": "Which sample is 7?"}], "deferred", tools=tools)
    assert [c.function.name for c in answer.choices[0].message.tool_calls] == ["mcp__lims__lookup"]
    assert seen[0] == {"measure", "find_tools", "read_tool_output"}  # deferred: absent before promotion
    assert "mcp__lims__lookup" in seen[1]  # promoted: offered from the next model call on
    assert "mcp__lims__lookup" in _system(provider.history[-1])  # the capabilities section notes it


def test_third_party_package_registers_through_the_entry_point(start_proxy, provider, tmp_path, monkeypatch):
    points = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]["entry-points"]
    dist = tmp_path / "site" / "sample_contributor_pkg-0.1.0.dist-info"
    dist.mkdir(parents=True)
    dist.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: sample-contributor-pkg\nVersion: 0.1.0\n")
    lines = "".join(f"{k} = {v}\n" for k, v in points["science_context.contributors"].items() if k == "sample")
    dist.joinpath("entry_points.txt").write_text(f"[science_context.contributors]\n{lines}")
    monkeypatch.syspath_prepend(str(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    proxy = start_proxy(models=(_route(provider.url),))
    _post(proxy.client(), [{"role": "user", "content": "go"}], "plugin")
    notes = _hidden(provider.history[-1], "sample")
    assert notes and 'trust="untrusted_data"' in notes[0]  # wrapped as data, bounded by the message budget
    assert len(notes[0]) < len("note " * 2000)
    _post(proxy.client(), [{"role": "user", "content": "go"}], "plugin-reviewer", scope="reviewer")
    assert _hidden(provider.history[-1], "sample") == []  # its scope is main only


def test_a_session_first_seen_mid_run_fills_every_channel_before_compaction(start_proxy, provider):
    """80 messages arrive at once; the early plan, memory, artifact and delegation calls are compacted
    away from what the model sees, yet every channel is projected from the canonical history."""

    def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}

    plan = {"plan": [{"step": "index peaks", "status": "completed"}, {"step": "refine", "status": "in_progress"}]}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Refine sample 7."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                call("p1", "update_plan", plan),
                call("m1", "remember", {"key": "lattice", "value": "a=5.431 Å"}),
                call("a1", "write_artifact", {"path": "refined.cif"}),
                call("d1", "delegate", {"task": "check twinning"}),
            ],
        },
        {"role": "tool", "tool_call_id": "d1", "content": "delegated to subagent s-2"},
        {"role": "tool", "tool_call_id": "a1", "content": "saved refined.cif"},
        {"role": "tool", "tool_call_id": "m1", "content": "remembered"},
        {"role": "tool", "tool_call_id": "p1", "content": "Plan updated"},
    ]
    k = 0
    while len(messages) < 79:
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call(f"c{k}", "measure", {"k": k})]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": f"frame {k}: " + "0.125 " * 400},
        ]
        k += 1
    messages.append({"role": "user", "content": "Continue."})

    def script(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return Reply(content=checkpoint_for(body["messages"][-1]["content"]))
        return Reply(content="continuing")

    provider.script(script)
    # The memory snapshot is admitted with little slack, and a framing nonce's estimated cost depends on
    # its digits: the secret is pinned so that the budget is the same on every run.
    proxy = start_proxy(models=(_route(provider.url, window=8_200),), framing_secret=b"mid-run: a pinned secret")
    _post(proxy.client(), messages, "mid-run")
    last = provider.history[-1]
    assert not any(m.get("tool_call_id") == "p1" for m in last["messages"])  # the declaring call is gone
    (plan_state,) = _hidden(last, "plan")
    assert "[in_progress] refine" in plan_state and "no longer in the visible history" in plan_state
    assert "a=5.431" in "".join(_hidden(last, "memory"))
    assert "refined.cif" in "".join(_hidden(last, "artifact"))
    assert "check twinning" in "".join(_hidden(last, "delegation"))


def test_a_skill_removed_by_compaction_can_be_read_again(start_proxy, provider, tmp_path):
    folder = _skills(tmp_path / "skills")
    reads = {"n": 0}

    def script(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return Reply(content=checkpoint_for(body["messages"][-1]["content"]))
        last = body["messages"][-1]
        if last.get("role") == "tool" and str(last.get("content")).startswith(("<skill", "Skill already")):
            return Reply(content="skill in hand")
        if last.get("role") == "user":
            reads["n"] += 1
            return Reply(tool_calls=(ToolCall("read_skill", {"name": "xrd-refinement"}, id=f"sk{reads['n']}"),))
        return Reply(content="ok")

    provider.script(script)
    proxy = start_proxy(
        models=(_route(provider.url, window=8_000),), contributor_options={"skills": {"folder": str(folder)}}
    )
    client = proxy.client()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Refine."}]
    assert _post(client, messages, "reload").choices[0].message.content == "skill in hand"
    messages.append({"role": "assistant", "content": "skill in hand"})
    for k in range(12):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "measure", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": f"frame {k}: " + "0.125 " * 1500},
        ]
    messages.append({"role": "user", "content": "Continue with the refinement skill."})
    assert _post(client, messages, "reload").choices[0].message.content == "skill in hand"
    reread = provider.history[-1]["messages"][-1]
    assert reread["role"] == "tool" and reread["content"].startswith('<skill name="xrd-refinement"')  # the body again
    assert sum("Step 1: index peaks." in str(m.get("content")) for m in provider.history[-1]["messages"]) == 1
