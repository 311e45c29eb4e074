"""Record and replay through real HTTP: a compacting session and a session with a proxy-owned tool
round are recorded by the proxy itself, then replayed through the current build: unchanged settings
give identical turns, a smaller window changes the turns it compacts differently, and a window too
small to assemble fails the replay."""

from __future__ import annotations

import dataclasses
import json
import stat
from pathlib import Path
from typing import Any

import pytest
import vcr.serialize
from vcr.serializers import yamlserializer

from proxy.cli import main
from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.cassette import CALL_HEADER, read_recordings
from proxy.provider.science_script import TOOLS, ScienceModel, client_tool_result, is_summary_request
from proxy.provider.scripted import Reply, ToolCall
from proxy.replay.page import render
from proxy.replay.replay import replay
from proxy.replay.verdict import judge
from tests.integration.conftest import route_to

WINDOW = 8_000
STEPS = 16
LIMS = {
    "type": "function",
    "function": {
        "name": "mcp__lims__lookup",
        "description": "Look up a LIMS sample.",
        "parameters": {"type": "object", "properties": {}},
    },
}
OPTIONS = {"capabilities": {"deferred": ["mcp__*"]}}


def _route(provider_url: str, window: int = WINDOW) -> ModelRoute:
    return route_to(provider_url, "science-model", window=window)


class _Lab:
    """The scripted model of both sessions: the science agent, and a LIMS agent that finds its tool."""

    def __init__(self) -> None:
        self.science = ScienceModel(STEPS)

    def __call__(self, body: dict[str, Any]) -> Reply:
        if is_summary_request(body) or "Find sample" not in json.dumps(body["messages"]):
            return self.science(body)
        if any(m.get("tool_call_id") == "f1" for m in body["messages"]):
            return Reply(content=f"found it ({len(body['messages'])} messages)")
        return Reply(tool_calls=(ToolCall("find_tools", {"query": "LIMS"}, id="f1"),))


def _science_session(client: Any) -> int:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an autonomous lab agent. Run the protocol step by step."},
        {"role": "user", "content": f"Run the {STEPS}-step calibration protocol, then report the fact."},
    ]
    for turn in range(1, STEPS + 5):
        completion = client.chat.completions.create(
            model="science-model", messages=messages, tools=TOOLS, extra_headers={"x-session-id": "science"}
        )
        message = completion.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        if not message.get("tool_calls"):
            assert "FACT-7391" in message["content"]
            return turn
        messages += [client_tool_result(call) for call in message["tool_calls"]]
    raise AssertionError("the agent did not finish")


def _lims_session(client: Any) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find sample 7 in the LIMS."}]
    for question in ("and sample 8?", None):
        chunks = list(
            client.chat.completions.create(
                model="science-model",
                messages=messages,
                tools=[*TOOLS, LIMS],
                stream=True,
                extra_headers={"x-session-id": "lims"},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text.startswith("found it")
        messages.append({"role": "assistant", "content": text})
        if question:
            messages.append({"role": "user", "content": question})


def _without_nulls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


@pytest.fixture
def recorded(start_proxy, provider, tmp_path: Path) -> tuple[Path, Settings, int]:
    """Two sessions recorded by a proxy with a record folder; returns it, the settings, the science turns."""
    provider.script(_Lab(), context_window=WINDOW)
    folder = tmp_path / "recording"
    proxy = start_proxy(
        mode="dynamic",
        models=(_route(provider.url),),
        contributor_options=OPTIONS,
        trace_enabled=True,
        record_dir=folder,
    )
    turns = _science_session(proxy.client())
    _lims_session(proxy.client())
    proxy.stop()
    assert any(is_summary_request(body) for body in provider.history)  # the science session compacted
    return folder, proxy.settings, turns


def test_recording_holds_every_provider_exchange_tagged_private_and_without_secrets(recorded, provider):
    folder, _, turns = recorded
    requests = read_recordings([folder])
    assert [r.context_id for r in requests].count("science") == turns
    assert [r.context_id for r in requests].count("lims") == 2
    exchanges = [e for r in requests for e in r.exchanges]
    assert len(exchanges) == len(provider.history)  # every provider call, nothing else
    # What litellm was asked is what the provider got (litellm leaves out a null content on the wire).
    assert [_without_nulls(e.llm_input["messages"]) for e in exchanges] == [b["messages"] for b in provider.history]
    keys = {e.key for e in exchanges}
    assert {"turn", "tool_round:1", "summarizer:0"} <= keys
    lims = [r for r in requests if r.context_id == "lims"]
    assert [e.key for e in lims[0].exchanges] == ["turn", "tool_round:1"]
    assert lims[0].exchanges[0].chunks  # a stream is recorded as its chunks
    for path in folder.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), path
        text = path.read_text() if path.is_file() else ""
        assert "sk-client" not in text and "sk-test-provider" not in text
        assert "authorization" not in text.lower()
    # The cassettes are vcrpy's own format: vcrpy reads them back.
    cassette = sorted(folder.glob("science/*.cassette.yaml"))[0]  # the first turn: one call, no compaction yet
    vcr_requests, vcr_responses = vcr.serialize.deserialize(cassette.read_text(), yamlserializer)
    assert vcr_requests[0].method == "POST" and vcr_requests[0].headers[CALL_HEADER] == "turn"
    assert vcr_responses[0]["status"]["code"] == 200


def test_recording_off_writes_nothing(start_proxy, provider, tmp_path):
    proxy = start_proxy(mode="dynamic", models=(_route(provider.url),))
    proxy.client().chat.completions.create(model="science-model", messages=[{"role": "user", "content": "hi"}])
    assert proxy.settings.record_dir is None
    assert not [p for p in tmp_path.rglob("*.cassette.yaml")]


def test_replay_unchanged_is_identical_and_a_smaller_window_changes_turns(recorded, provider, tmp_path, capsys):
    folder, settings, turns = recorded
    provider.history.clear()

    same = judge(replay([folder], settings))
    assert same.summary() == f"{turns + 2} identical, 0 changed, 0 failed", [t.reasons for t in same.turns]
    assert provider.history == []  # replay is offline: every call answered from the recording

    smaller = dataclasses.replace(settings, models=(_route(provider.url, window=6_000),))
    verdict = judge(replay([folder], smaller))
    changed = [t for t in verdict.turns if t.status == "changed"]
    assert verdict.counts()["failed"] == 0
    assert changed and all(t.session == "science" for t in changed)
    # The opening turns fit either window and stay identical; the changed ones send fewer tokens now.
    assert verdict.turns[0].status == "identical"
    for turn in changed:
        assert turn.tokens_after <= turn.tokens_before, (turn.number, turn.reasons)
    assert sum(t.tokens_before - t.tokens_after for t in changed) > 0
    assert any(call.diff.startswith("--- recorded") for turn in changed for call in turn.calls)
    page = render(verdict)
    assert verdict.summary() in page and "<pre>" in page
    assert provider.history == []

    capsys.readouterr()
    config = tmp_path / "smaller.yaml"
    config.write_text(
        "model_list:\n- model_name: science-model\n  litellm_params: {model: openai/scripted, "
        f"api_base: '{provider.url}/v1', api_key: sk-x}}\n  model_info: {{max_input_tokens: 6000, "
        "max_output_tokens: 2000}\ncontributors:\n  capabilities: {deferred: ['mcp__*']}\n"
    )
    out = tmp_path / "report.html"
    argv = ["replay", str(folder), "--config", str(config), "--out", str(out)]
    assert main(argv) == 0  # changes alone do not fail a replay
    assert main([*argv, "--max-changed", "0"]) == 1
    assert main([*argv, "--max-changed", str(len(changed))]) == 0
    printed = capsys.readouterr().out
    assert f"{turns + 2 - len(changed)} identical, {len(changed)} changed, 0 failed" in printed
    assert "science turn" in printed and out.read_text().startswith("<!doctype html>")


def test_a_turn_that_cannot_be_assembled_fails_the_replay(recorded, provider):
    folder, settings, _ = recorded
    tiny = dataclasses.replace(settings, models=(_route(provider.url, window=2_300),))
    verdict = judge(replay([folder], tiny))
    failed = [t for t in verdict.turns if t.status == "failed"]
    assert failed and all("HTTP 400" in t.reasons[0] for t in failed)
    assert verdict.exit_code(max_changed=None) == 1
    assert json.dumps([t.error for t in failed])  # the proxy's own message, for the page


def test_replay_refuses_a_folder_that_is_no_recording(tmp_path, capsys):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "x.request.json").write_text("{not json")
    assert main(["replay", str(tmp_path)]) == 2
    assert "not a readable recording" in capsys.readouterr().err


def test_a_shadow_recording_replays_its_candidates(start_proxy, provider, tmp_path):
    provider.script(lambda body: Reply(content="noted"))
    folder = tmp_path / "shadow-recording"
    proxy = start_proxy(mode="shadow", models=(_route(provider.url),), contributor_options=OPTIONS, record_dir=folder)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find sample 7 in the LIMS."}]
    for follow_up in ("and sample 8?", "thanks"):
        answer = proxy.client().chat.completions.create(model="science-model", messages=messages, tools=[*TOOLS, LIMS])
        messages += [{"role": "assistant", "content": answer.choices[0].message.content}]
        messages += [{"role": "user", "content": follow_up}]
    proxy.stop()
    first, _ = read_recordings([folder])
    assert first.shadow["turn#0"]["messages"][0]["role"] == "system"  # the candidate, not the client's input
    assert first.exchanges[0].llm_input["messages"] == [{"role": "user", "content": "Find sample 7 in the LIMS."}]

    assert judge(replay([folder], proxy.settings)).summary() == "2 identical, 0 changed, 0 failed"
    # Without the deferred-tool policy the candidate offers the LIMS tool directly: the shadow candidate
    # changed, although the provider (shadow mode) would still get the client's input unchanged.
    verdict = judge(replay([folder], dataclasses.replace(proxy.settings, contributor_options={})))
    assert [t.status for t in verdict.turns] == ["changed", "changed"]
    assert "mcp__lims__lookup" in verdict.turns[0].calls[0].diff
