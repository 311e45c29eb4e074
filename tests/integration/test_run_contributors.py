"""Contributor instances per run, through real HTTP (issue 39): a run (a session branch) gets its own
instances on its first turn in the process and keeps them while it goes on, so a package that keeps
something in memory never leaks it into another run; and since nothing a turn relies on lives only in
memory, a restart between turns changes nothing the provider receives."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from proxy.provider.scripted import Reply

PLUGIN = Path(__file__).parents[1] / "plugins" / "sample_contributor_pkg"


@pytest.fixture
def counter_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sample package's counting contributor, installed as pip would (a dist-info on sys.path)."""
    points = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]["entry-points"]
    dist = tmp_path / "site" / "sample_contributor_pkg-0.1.0.dist-info"
    dist.mkdir(parents=True)
    dist.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: sample-contributor-pkg\nVersion: 0.1.0\n")
    line = f"sample_counter = {points['science_context.contributors']['sample_counter']}\n"
    dist.joinpath("entry_points.txt").write_text(f"[science_context.contributors]\n{line}")
    monkeypatch.syspath_prepend(str(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))


def _counter_note(body: dict[str, Any]) -> str:
    notes = [str(m["content"]) for m in body["messages"] if 'source="sample_counter"' in str(m.get("content"))]
    assert len(notes) == 1, notes
    return notes[0].split(">", 1)[1].split("<", 1)[0].strip()


def test_two_runs_never_share_an_instance_and_each_keeps_its_own(start_proxy, provider, counter_package):
    proxy = start_proxy()
    client = proxy.client()
    runs: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    seen: list[tuple[str, str]] = []
    for turn in range(3):
        for run in ("b", "a") if turn == 1 else ("a", "b"):  # interleaved
            history = runs[run]
            history.append({"role": "user", "content": f"run {run}, step {turn}"})
            answer = client.chat.completions.create(
                model="test-model", messages=history, extra_headers={"x-session-id": f"run-{run}"}
            )
            history.append({"role": "assistant", "content": answer.choices[0].message.content})
            seen.append((run, _counter_note(provider.history[-1])))
    # The start-up composition made instance 1 (to check the package); each run then got its own.
    by_run = {run: [note for r, note in seen if r == run] for run in runs}
    assert by_run == {
        "a": ["instance 2 call 1", "instance 2 call 2", "instance 2 call 3"],
        "b": ["instance 3 call 1", "instance 3 call 2", "instance 3 call 3"],
    }


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


TURNS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Refine sample 7."}],
    [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                _call("p1", "update_plan", {"plan": [{"step": "index peaks", "status": "in_progress"}]}),
                _call("m1", "remember", {"key": "lattice", "value": "a=5.431 Å"}),
            ],
        },
        {"role": "tool", "tool_call_id": "p1", "content": "Plan updated"},
        {"role": "tool", "tool_call_id": "m1", "content": "remembered"},
    ],
    [{"role": "assistant", "content": "Peaks indexed."}, {"role": "user", "content": "Continue with the refinement."}],
]


def _run(start_proxy, provider, folder: Path, restart_before: int | None) -> list[dict[str, Any]]:
    settings = {"data_dir": folder, "framing_secret": b"one secret for both runs"}
    proxy = start_proxy(**settings)
    history: list[dict[str, Any]] = []
    received = []
    for number, added in enumerate(TURNS):
        if number == restart_before:
            proxy.stop()
            proxy = start_proxy(**settings)  # a new process's worth of instances, on the same store
        history += added
        answer = proxy.client().chat.completions.create(
            model="test-model", messages=history, extra_headers={"x-session-id": "restarted"}
        )
        assert answer.choices[0].message.content == "ok"
        received.append(provider.history[-1])
    proxy.stop()
    return received


def test_a_restart_between_turns_changes_nothing_the_provider_receives(start_proxy, provider, tmp_path):
    provider.script(lambda body: Reply(content="ok"))
    steady = _run(start_proxy, provider, tmp_path / "steady", restart_before=None)
    restarted = _run(start_proxy, provider, tmp_path / "restarted", restart_before=2)
    assert restarted == steady
    assert "index peaks" in json.dumps(steady[2]) and "a=5.431" in json.dumps(steady[2])  # the channels carried
