"""``context-proxy examples``: three reproducible context examples, written offline.

Each example runs a scripted agent through the real proxy (uvicorn on loopback, the SQLite store in a
temporary data dir, litellm) against the built-in scripted provider, then writes a folder with

- ``traces/``: the proxy's trace file of every model call (schema v5), as the product wrote it;
- ``provider-input/``: the exact JSON body the provider received for each call, in order
  (``NNNN-agent.json`` for the agent's calls, ``NNNN-summary.json`` for checkpoint summarization);
- ``README.md``: what the example shows and where to look.

The shadow example also writes ``comparison/``: per call, the dynamic candidate beside what the model
actually got.

Two runs give byte-identical folders. The product's traces hold run-specific facts (the provider's
port, temporary paths, timings); the copies written here replace them with fixed placeholders
(``http://scripted-provider``, ``<tmp>``, ``0``). The product's own traces are left as they are.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.science_script import TOOLS as STEP_TOOLS
from proxy.provider.science_script import checkpoint_for, is_summary_request, tool_output
from proxy.provider.scripted import Reply, ScriptedProvider, ToolCall, serve_in_thread

DEFAULT_DIR = Path(".tmp/context-examples")
PROVIDER_PLACEHOLDER = "http://scripted-provider"
TMP_PLACEHOLDER = "<tmp>"
# Pinned so that two runs write the same framing nonces; a served proxy takes its secret from the store.
FRAMING_SECRET = b"context-proxy examples: a fixed framing secret"
MODEL = "lab-model"
EXAMPLES = ("01-main-skill-deferred-tool", "02-subagent-compaction", "03-reviewer-shadow")
SKILLS = {
    "xrd-refinement": (
        "Refine a crystal structure from powder XRD data.",
        "1. Index the peaks and check the lattice.\n2. Refine background, scale, then lattice parameters.\n"
        "3. Refine atomic positions last; stop when R_wp no longer improves by 0.1 %.\n" * 6,
    ),
    "safety-check": ("Check a protocol against lab safety rules.", "Never heat sealed vessels.\n" * 10),
}
PLAN = {
    "plan": [
        {"step": "calibrate the diffractometer", "status": "in_progress"},
        {"step": "refine the structure", "status": "pending"},
    ],
    "explanation": "calibration first",
}
SUBAGENT_STEPS = 12
_STEP_LOG = re.compile(r"^step=(\d+) measurement log$", re.MULTILINE)
_TIMING_KEY = re.compile(r"Ms$")  # providerMs, assemblyMs, durationMs: wall-clock, different every run


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


MEASURE = _function("measure", "Measure a sample.", {"sample": {"type": "string"}}, ["sample"])
LIMS = _function(
    "mcp__lims__lookup", "Look up a sample in the LIMS by its number.", {"sample": {"type": "string"}}, ["sample"]
)
UPDATE_PLAN = _function(
    "update_plan",
    "Declare or update the plan.",
    {"plan": {"type": "array", "items": {"type": "object"}}, "explanation": {"type": "string"}},
    ["plan"],
)
READ_ARTIFACT = _function("read_artifact", "Read an artifact of the run.", {"name": {"type": "string"}}, ["name"])
SUBMIT_REVIEW = _function(
    "submit_review",
    "Submit a review verdict.",
    {"verdict": {"type": "string"}, "notes": {"type": "string"}},
    ["verdict"],
)


@dataclass
class Example:
    """One example: its agent, its model and the proxy settings it runs under."""

    name: str
    title: str
    explanation: str
    session: str
    scope: str
    script: Callable[[dict[str, Any]], Reply]
    first_messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    client_tool: Callable[[str, dict[str, Any]], str]
    settings: dict[str, Any] = field(default_factory=dict)
    window: int = 16_000
    output: int = 2_000


def run_examples(out_dir: Path) -> int:
    """Write the three examples into ``out_dir`` (replacing earlier ones); returns the exit code."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="context-examples-") as scratch:
        root = Path(scratch)
        skills = _write_skills(root / "skills")
        for example in _examples(skills):
            target = out_dir / example.name
            shutil.rmtree(target, ignore_errors=True)  # only our own folders: the directory may hold other files
            _run(example, root / example.name, target, root)
            print(f"wrote {target}")
    (out_dir / "README.md").write_text(_index(), encoding="utf-8")
    return 0


def _examples(skills: Path) -> list[Example]:
    skill_options = {"skills": {"folder": str(skills)}}
    return [
        Example(
            name=EXAMPLES[0],
            title="Main agent: a skill loaded, a deferred MCP tool promoted",
            explanation=(
                "The main agent declares `measure` and `mcp__lims__lookup`; the operator marks `mcp__*` as deferred, "
                "so the first call offers `measure`, `find_tools` and `read_skill` only. The model reads the "
                "`xrd-refinement` skill (its body arrives once, as the `read_skill` result; the system prompt "
                "keeps only the catalog), searches with `find_tools`, and from the next call on the LIMS tool is "
                "offered; its call goes to the client. `read_skill` and `find_tools` ran inside the proxy: the "
                "client never saw them."
            ),
            session="example-main",
            scope="main",
            script=_main_script,
            first_messages=[
                {"role": "system", "content": "You are Ada, a careful crystallography agent."},
                {"role": "user", "content": "Which sample is 7, and how do I refine it?"},
            ],
            tools=[MEASURE, LIMS],
            client_tool=lambda name, arguments: "sample 7: NaCl reference, 2 g",
            settings={"contributor_options": {**skill_options, "capabilities": {"deferred": ["mcp__*"]}}},
        ),
        Example(
            name=EXAMPLES[1],
            title="Subagent: a run long enough to compact, keeping its plan and skill references",
            explanation=(
                f"A subagent declares a plan, reads a skill, then runs {SUBAGENT_STEPS} measurement steps of 3 KB "
                "each in a 7,000-token window. Old outputs become previews with `ref=` references "
                "(`read_tool_output` reads them back); older steps are summarized into a checkpoint "
                "(`NNNN-summary.json` is that request). The plan stays as a `data_only` message through every "
                "compaction; once the skill's `read_skill` result is compacted away, the skills channel says so "
                "and names the revision instead of copying the body. No request carries a skill body twice, and "
                "none carries one in its system prompt."
            ),
            session="example-subagent",
            scope="subagent",
            script=_subagent_script,
            first_messages=[
                {"role": "system", "content": "You are a calibration subagent. Declare a plan, then run the protocol."},
                {"role": "user", "content": f"Run the {SUBAGENT_STEPS}-step calibration protocol."},
            ],
            tools=[UPDATE_PLAN, *STEP_TOOLS],
            client_tool=lambda name, arguments: (
                "Plan updated" if name == "update_plan" else tool_output(int(arguments["step"]), 3_000)
            ),
            settings={"contributor_options": skill_options},
            window=7_000,
            output=1_000,
        ),
        Example(
            name=EXAMPLES[2],
            title="Reviewer in shadow mode: the candidate beside what the model got",
            explanation=(
                "Shadow mode assembles and traces the dynamic candidate but sends the client's own request. "
                "`comparison/turn-NNNN.json` puts the two side by side: `candidate` is "
                "`renderedContext.callHistory` (governance prompt, the review projection as `data_only` data), "
                "`sent` is the trace's `llmInput.messages`, which `provider-input/` confirms the provider "
                "received. The reviewer scope gets no plan projection: it judges the work, not the main agent's "
                "intentions."
            ),
            session="example-reviewer",
            scope="reviewer",
            script=_reviewer_script,
            first_messages=[
                {"role": "system", "content": "You are the reviewer. Check the refinement report against its data."},
                {"role": "user", "content": "Review the refinement report of sample 7."},
            ],
            tools=[READ_ARTIFACT, SUBMIT_REVIEW],
            client_tool=lambda name, arguments: (
                "report.md: R_wp 4.1 %, a = 5.640 A, 2 refinement cycles" if name == "read_artifact" else "submitted"
            ),
            settings={
                "mode": "shadow",
                "contributor_options": {"governance": {"policy": "Reviews cite the artifact they judge."}},
            },
        ),
    ]


def _run(example: Example, data_dir: Path, target: Path, tmp_root: Path) -> None:
    """Run one example against fresh servers and write its folder."""
    provider = ScriptedProvider(example.script)
    with serve_in_thread(provider.app()) as provider_url:
        route = ModelRoute(
            MODEL,
            {"model": "openai/scripted", "api_base": f"{provider_url}/v1", "api_key": "sk-example-not-a-secret"},
            max_input_tokens=example.window,
            max_output_tokens=example.output,
        )
        shipped = Settings.from_env(environ={})  # the shipped defaults, whatever this shell has set
        settings = dataclasses.replace(
            shipped,
            data_dir=data_dir,
            models=(route,),
            trace_enabled=True,
            framing_secret=FRAMING_SECRET,
            **example.settings,
        )
        from proxy.app import create_app

        with serve_in_thread(create_app(settings)) as proxy_url:
            _play(example, proxy_url)
    replacements = {provider_url: PROVIDER_PLACEHOLDER, str(tmp_root): TMP_PLACEHOLDER}
    traces = sorted((data_dir / "context-traces" / example.session).glob("turn-*.json"), key=lambda p: p.stem)
    for path in traces:
        _write_json(target / "traces" / path.name, _normalized(json.loads(path.read_text()), replacements))
    for number, body in enumerate(provider.history, 1):
        kind = "summary" if is_summary_request(body) else "agent"
        _write_json(target / "provider-input" / f"{number:04d}-{kind}.json", _normalized(body, replacements))
    if settings.mode == "shadow":
        for path in traces:
            trace = json.loads(path.read_text())
            comparison = {
                "turn": trace["turn"],
                "candidate": (trace.get("renderedContext") or {}).get("callHistory"),
                "sent": trace["llmInput"]["messages"],
            }
            _write_json(target / "comparison" / path.name, _normalized(comparison, replacements))
    (target / "README.md").write_text(_readme(example, len(traces), len(provider.history)), encoding="utf-8")


def _play(example: Example, proxy_url: str) -> None:
    """The agent: resend the whole history each turn, run its own tools, stop at the final answer."""
    messages = [dict(m) for m in example.first_messages]
    headers = {"x-session-id": example.session, "x-agent-scope": example.scope}
    with httpx.Client(base_url=proxy_url, timeout=120) as client:
        for _ in range(SUBAGENT_STEPS + 5):
            body = {"model": MODEL, "messages": messages, "tools": example.tools}
            response = client.post("/v1/chat/completions", json=body, headers=headers)
            response.raise_for_status()
            message = {k: v for k, v in response.json()["choices"][0]["message"].items() if v is not None}
            messages.append(message)
            if not message.get("tool_calls"):
                return
            for call in message["tool_calls"]:
                result = example.client_tool(call["function"]["name"], json.loads(call["function"]["arguments"]))
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    raise RuntimeError(f"example {example.name}: the agent did not finish")


# --- the scripted models ------------------------------------------------------------------------------


def _called(body: Mapping[str, Any]) -> list[str]:
    return [c["function"]["name"] for m in body["messages"] for c in m.get("tool_calls") or []]


def _main_script(body: dict[str, Any]) -> Reply:
    offered = {t["function"]["name"] for t in body.get("tools", [])}
    called = _called(body)
    if "read_skill" not in called:
        return Reply(tool_calls=(ToolCall("read_skill", {"name": "xrd-refinement"}, id="call_skill"),))
    if "mcp__lims__lookup" not in offered:
        return Reply(tool_calls=(ToolCall("find_tools", {"query": "LIMS sample"}, id="call_find"),))
    if "mcp__lims__lookup" not in called:
        return Reply(tool_calls=(ToolCall("mcp__lims__lookup", {"sample": "7"}, id="call_lims"),))
    return Reply(content="Sample 7 is the NaCl reference; refine it with the xrd-refinement steps.")


def _subagent_script(body: dict[str, Any]) -> Reply:
    if is_summary_request(body):
        return Reply(content=checkpoint_for(body["messages"][-1]["content"]))
    contents = [str(m.get("content") or "") for m in body["messages"]]
    steps = [int(found) for c in contents for found in _STEP_LOG.findall(c[:400])]
    steps += [int(line.split()[2]) for c in contents for line in c.splitlines() if line.startswith("- step ")]
    last = max(steps, default=0)
    if last >= SUBAGENT_STEPS:
        return Reply(content=f"Calibrated in {last} steps, following the xrd-refinement skill.")
    if last or any(c.startswith('<skill name="xrd-refinement"') for c in contents):
        return Reply(tool_calls=(ToolCall("run_step", {"step": last + 1}, id=f"call_step_{last + 1}"),))
    if any(m.get("tool_call_id") == "call_plan" for m in body["messages"]):
        return Reply(tool_calls=(ToolCall("read_skill", {"name": "xrd-refinement"}, id="call_skill"),))
    return Reply(tool_calls=(ToolCall("update_plan", PLAN, id="call_plan"),))


def _reviewer_script(body: dict[str, Any]) -> Reply:
    called = _called(body)
    if "read_artifact" not in called:
        return Reply(tool_calls=(ToolCall("read_artifact", {"name": "report.md"}, id="call_read"),))
    if "submit_review" not in called:
        verdict = {"verdict": "approve", "notes": "R_wp and lattice match the data."}
        return Reply(tool_calls=(ToolCall("submit_review", verdict, id="call_review"),))
    return Reply(content="Review submitted: approved.")


# --- files --------------------------------------------------------------------------------------------


def _write_skills(folder: Path) -> Path:
    for name, (description, body) in SKILLS.items():
        (folder / name).mkdir(parents=True)
        (folder / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n{body}")
    return folder


def _normalized(value: Any, replacements: Mapping[str, str]) -> Any:
    """``value`` with timings zeroed and run-specific strings (port, temp paths) replaced."""
    if isinstance(value, Mapping):
        return {
            key: 0 if _TIMING_KEY.search(key) and isinstance(item, int | float) else _normalized(item, replacements)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_normalized(item, replacements) for item in value]
    if isinstance(value, str):
        for old, new in replacements.items():
            value = value.replace(old, new)
    return value


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, ensure_ascii=False, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _readme(example: Example, traces: int, requests: int) -> str:
    shadow = "- `comparison/`: per call, `candidate` (what dynamic mode would send) beside `sent`.\n"
    return (
        f"# {example.title}\n\n{example.explanation}\n\n"
        f"Session `{example.session}`, scope `{example.scope}`, mode `{example.settings.get('mode', 'dynamic')}`, "
        f"a {example.window:,}-token model window with {example.output:,} tokens of output.\n\n"
        f"- `traces/`: the {traces} trace files (schema v5) the proxy wrote, one per model call; "
        "see docs/rollout.md for the fields.\n"
        f"- `provider-input/`: the {requests} request bodies the provider received, in order.\n"
        + (shadow if example.settings.get("mode") == "shadow" else "")
        + "\nRun-specific values are normalized in these copies: the provider's address is "
        f"`{PROVIDER_PLACEHOLDER}`, temporary paths are `{TMP_PLACEHOLDER}`, and timings (`*Ms`) are 0.\n"
    )


def _index() -> str:
    return (
        "# Context examples\n\n"
        "Written by `context-proxy examples` (offline: the real proxy against the built-in scripted provider). "
        "Two runs give byte-identical folders.\n\n" + "".join(f"- [{name}]({name}/README.md)\n" for name in EXAMPLES)
    )
