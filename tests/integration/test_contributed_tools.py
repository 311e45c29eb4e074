"""Tools, options and priorities as contributions, through real HTTP and the scripted provider.

A third-party package offers its own proxy-owned tool; ``read_skill`` serves the revision a session
first read; at a 32,000-token window a long artifact list never pushes the plan projection out.
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from proxy.kernel.config import ModelRoute
from proxy.provider.scripted import Reply, ToolCall
from proxy.session import open_store
from tests.integration.conftest import route_to

PLUGIN = Path(__file__).parents[1] / "plugins" / "sample_contributor_pkg"
BUILTINS = "identity,governance,run_contract,capabilities,skills,plan,delegation,artifact,review,memory"


def _route(provider_url: str, window: int) -> ModelRoute:
    return route_to(provider_url, "lab-model", window=window, max_output=1_000)


def _install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """The sample package's entry points ``names``, installed as pip would leave them."""
    points = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]["entry-points"]
    dist = tmp_path / "site" / "sample_contributor_pkg-0.1.0.dist-info"
    dist.mkdir(parents=True)
    dist.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: sample-contributor-pkg\nVersion: 0.1.0\n")
    lines = "".join(f"{k} = {v}\n" for k, v in points["science_context.contributors"].items() if k in names)
    dist.joinpath("entry_points.txt").write_text(f"[science_context.contributors]\n{lines}")
    monkeypatch.syspath_prepend(str(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))


def _post(client: Any, messages: list[dict[str, Any]], session: str) -> Any:
    return client.chat.completions.create(model="lab-model", messages=messages, extra_headers={"x-session-id": session})


def _tool_names(body: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools") or []}


def test_a_packages_tool_is_offered_run_by_the_proxy_and_never_seen_by_the_client(
    start_proxy, provider, tmp_path, monkeypatch
):
    _install(tmp_path, monkeypatch, "sample_tools")

    def script(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return Reply(content=f"found it: {last['content']}")
        return Reply(tool_calls=(ToolCall("lab_lookup", {"sample": "S-7"}, id="lk1"),))

    provider.script(script)
    options = {"sample_tools": {"site": "building 4"}}
    proxy = start_proxy(models=(_route(provider.url, 16_000),), contributor_options=options)
    client_tools = [{"type": "function", "function": {"name": "measure", "parameters": {"type": "object"}}}]
    answer = proxy.client().chat.completions.create(
        model="lab-model",
        messages=[{"role": "user", "content": "Where is S-7?"}],
        tools=client_tools,
        extra_headers={"x-session-id": "lookup"},
    )
    message = answer.choices[0].message
    assert message.tool_calls is None  # the client never sees the package's tool call
    assert message.content is not None and "stored at building 4, freezer 3" in message.content
    first, second = provider.history
    assert _tool_names(first) == {"measure", "lab_lookup", "read_tool_output"}  # and the proxy's reader
    assert second["messages"][-2]["tool_calls"][0]["function"]["name"] == "lab_lookup"
    assert second["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "lk1",
        "content": "sample S-7: stored at building 4, freezer 3, shelf B (session look)",  # its context
    }


def test_the_allow_list_governs_contributed_tools(start_proxy, provider, tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, "sample_tools")
    folder = tmp_path / "skills" / "xrd"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: xrd\ndescription: Refine XRD.\n---\nIndex peaks.\n")
    options = {"skills": {"folder": str(folder.parent)}}
    proxy = start_proxy(
        models=(_route(provider.url, 16_000),), contributor_options=options, contributor_allow=frozenset({"skills"})
    )
    _post(proxy.client(), [{"role": "user", "content": "go"}], "allowed")
    assert _tool_names(provider.history[-1]) == {"read_skill"}  # sample_tools is not loaded, so not offered
    proxy = start_proxy(
        models=(_route(provider.url, 16_000),),
        contributor_options={},
        contributor_allow=frozenset({"identity", "sample_tools"}),
    )
    _post(proxy.client(), [{"role": "user", "content": "go"}], "allowed")
    assert _tool_names(provider.history[-1]) == {"lab_lookup"}  # no skills contributor, no read_skill


def _skill(folder: Path, body: str) -> None:
    (folder / "xrd").mkdir(parents=True, exist_ok=True)
    (folder / "xrd" / "SKILL.md").write_text(f"---\nname: xrd\ndescription: Refine XRD data.\n---\n{body}\n")


def test_read_skill_serves_the_revision_the_session_first_read(start_proxy, provider, tmp_path):
    folder = tmp_path / "skills"
    _skill(folder, "OLD-BODY: index the peaks.")

    def script(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return Reply(content="read")
        return Reply(tool_calls=(ToolCall("read_skill", {"name": "xrd"}, id=f"sk{len(body['messages'])}"),))

    provider.script(script)
    proxy = start_proxy(models=(_route(provider.url, 16_000),), contributor_options={"skills": {"folder": str(folder)}})
    client = proxy.client()
    _post(client, [{"role": "user", "content": "Refine."}], "pinned")
    first = provider.history[-1]["messages"][-1]["content"]
    assert "OLD-BODY" in first
    _skill(folder, "NEW-BODY: index the peaks twice.")
    # The same session, a new question (the earlier body not sent back: it is no longer in context).
    _post(client, [{"role": "user", "content": "Refine again."}], "pinned")
    assert provider.history[-1]["messages"][-1]["content"] == first  # the revision it first read
    _post(client, [{"role": "user", "content": "Refine."}], "fresh")
    assert "NEW-BODY" in provider.history[-1]["messages"][-1]["content"]  # a new session reads the new one
    _post(client, [{"role": "user", "content": "Refine."}], "fresh")
    proxy.stop()

    async def refs() -> dict[str, list[str]]:
        store = open_store(None, proxy.settings.data_dir, 5.0)
        await store.open()
        try:
            return {sid: [r.revision for r in await store.skill_refs(sid)] for sid in ("pinned", "fresh")}
        finally:
            await store.close()

    recorded = asyncio.run(refs())
    old, new = first.split('revision="')[1][:12], provider.history[-1]["messages"][-1]["content"]
    assert recorded["pinned"] == [old]  # the durable reference is written once and read back
    assert recorded["fresh"] and recorded["fresh"][0] != old and recorded["fresh"][0] in new


def _artifact_run(steps: int) -> list[dict[str, Any]]:
    plan = {"plan": [{"step": "measure", "status": "completed"}, {"step": "write up", "status": "in_progress"}]}
    calls = [("p1", "update_plan", plan, "Plan updated")]
    for k in range(steps):
        arguments = {"path": f"results/figure_{k}.png", "content": f"figure {k} " + "pixel data " * 60}
        calls.append((f"a{k}", "write_artifact", arguments, f"saved results/figure_{k}.png ({k} of {steps})"))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Measure, then write up with figures."}]
    for call_id, name, arguments, result in calls:
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": result},
        ]
    return messages


def test_the_plan_is_in_every_request_at_a_32k_window_with_20_artifacts(start_proxy, provider, tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, "sample_pushy")  # a package that declares itself first, and cannot be
    proxy = start_proxy(models=(_route(provider.url, 32_000),), contributor_options={})
    client = proxy.client()
    for artifacts in (5, 12, 20, 20):
        messages = [*_artifact_run(artifacts), {"role": "user", "content": "Continue."}]
        _post(client, messages, "figures")
        sent = provider.history[-1]["messages"]
        hidden = [str(m.get("content")) for m in sent if str(m.get("content")).startswith("<context source=")]
        plan = [h for h in hidden if 'id="plan.state"' in h]
        assert plan and "[in_progress] write up" in plan[0] and "[truncated" not in plan[0]
        if artifacts == 20:
            artifact = [h for h in hidden if 'id="artifact.state"' in h]
            # The artifact list and the package's message compete for what is left; the plan did not.
            assert not artifact or "[truncated by the context budget" in artifact[0]
            assert next(h for h in hidden if 'id="sample.pushy"' in h).count("read me") < 3000
