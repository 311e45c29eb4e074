"""``context-proxy examples``: three example folders, byte-identical across runs, showing what they claim."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import main
from proxy.demo.examples import EXAMPLES, SKILLS


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _load(folder: Path, pattern: str) -> list[Any]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob(pattern))]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The command run twice: once with ``--out``, once through SCIENCE_AGENT_CONTEXT_EXAMPLE_DIR."""
    first = tmp_path_factory.mktemp("examples-a")
    second = tmp_path_factory.mktemp("examples-b")
    assert main(["examples", "--out", str(first)]) == 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SCIENCE_AGENT_CONTEXT_EXAMPLE_DIR", str(second))
        assert main(["examples"]) == 0
    return first, second


def test_two_runs_write_byte_identical_folders(two_runs: tuple[Path, Path]) -> None:
    first, second = two_runs
    a, b = _tree(first), _tree(second)
    assert sorted(a) == sorted(b)
    assert [name for name in a if a[name] != b[name]] == []
    assert {name.split("/")[0] for name in a} == {*EXAMPLES, "README.md"}
    for name, data in a.items():
        text = data.decode()
        assert "127.0.0.1" not in text and str(first) not in text and "/tmp" not in text, name  # normalized


def test_main_example_loads_a_skill_and_promotes_the_deferred_tool(two_runs: tuple[Path, Path]) -> None:
    folder = two_runs[0] / EXAMPLES[0]
    sent = _load(folder / "provider-input", "*-agent.json")
    offered = [[t["function"]["name"] for t in body["tools"]] for body in sent]
    assert "mcp__lims__lookup" not in offered[0] and "mcp__lims__lookup" in offered[-1]
    body = SKILLS["xrd-refinement"][1].splitlines()[0]
    assert all(body not in body_["messages"][0]["content"] for body_ in sent)  # catalog only in the prompt
    assert sum(body in json.dumps(m) for m in sent[-1]["messages"]) == 1  # the read_skill result, once
    traces = _load(folder / "traces", "turn-*.json")
    assert len(traces) == len(sent) and all(t["scope"] == "main" for t in traces)
    assert (folder / "README.md").read_text().startswith("# Main agent")


def test_subagent_example_compacts_and_keeps_plan_and_skill_references(two_runs: tuple[Path, Path]) -> None:
    folder = two_runs[0] / EXAMPLES[1]
    assert list((folder / "provider-input").glob("*-summary.json")), "the run never compacted into a checkpoint"
    sent = _load(folder / "provider-input", "*-agent.json")
    last = json.dumps(sent[-1]["messages"])
    assert 'source=\\"plan\\"' in last and 'source=\\"skills\\"' in last and "read_skill" in last
    traces = _load(folder / "traces", "turn-*.json")
    assert any(t["compaction"]["summarizedMessages"] for t in traces)
    assert all(t["providerMs"] == 0 and t["assemblyMs"] == 0 for t in traces)  # timings normalized


def test_reviewer_example_puts_the_candidate_beside_what_was_sent(two_runs: tuple[Path, Path]) -> None:
    folder = two_runs[0] / EXAMPLES[2]
    comparisons = _load(folder / "comparison", "turn-*.json")
    sent = _load(folder / "provider-input", "*-agent.json")
    assert len(comparisons) == len(sent) == 3
    for comparison, body in zip(comparisons, sent, strict=True):
        assert comparison["candidate"] != comparison["sent"]
        assert comparison["candidate"][0]["content"].startswith("## Identity")
        assert [m["role"] for m in comparison["sent"]] == [m["role"] for m in body["messages"]]
    traces = _load(folder / "traces", "turn-*.json")
    assert {(t["mode"], t["scope"]) for t in traces} == {("shadow", "reviewer")}
