"""``context-proxy report`` over traces of real sessions, and the page drawn by a real browser.

A dynamic session that compacts and a shadow session whose client history the provider refuses for
size are run through HTTP; the report is written by the CLI; the numbers the page shows are checked
against the trace files, read here directly (not through the report's own reader).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.cli import main as cli
from proxy.provider.science_script import TOOLS, ScienceModel, client_tool_result
from tests.integration.conftest import route_to

WINDOW = 16_000
CHROMIUM = "/usr/bin/chromium"


def _agent(client: openai.OpenAI, session: str, steps: int, headers: dict[str, str] | None = None) -> int | None:
    """Run the science agent; returns the turn the provider refused for size, or ``None`` when it finished."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an autonomous lab agent. Run the protocol step by step."},
        {"role": "user", "content": f"Run the {steps}-step calibration protocol, then report the calibration fact."},
    ]
    for turn in range(1, steps + 5):
        try:
            completion = client.chat.completions.create(
                model="science-model",
                messages=messages,  # type: ignore[arg-type]
                tools=TOOLS,  # type: ignore[arg-type]
                extra_headers={"x-session-id": session, **(headers or {})},
            )
        except openai.BadRequestError as exc:
            assert "context_length_exceeded" in str(exc)
            return turn
        message = {k: v for k, v in completion.choices[0].message.model_dump(exclude_none=True).items()}
        messages.append(message)
        if not message.get("tool_calls"):
            return None
        messages.extend(client_tool_result(call) for call in message["tool_calls"])
    raise AssertionError("the agent did not finish")


class _Overview(HTMLParser):
    """The overview table's cells, by session row and ``data-key``."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, dict[str, str]] = {}
        self._row: str | None = None
        self._key: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "tr" and attributes.get("class") == "session":
            self._row = attributes["data-context-id"]
            self.rows[self._row or ""] = {}
        elif tag == "td" and self._row and attributes.get("data-key"):
            self._key = attributes["data-key"]

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._key = None
        elif tag == "tr":
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._row and self._key:
            self.rows[self._row][self._key] = self.rows[self._row].get(self._key, "") + data


def _embedded(page: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert found, "the page embeds its numbers"
    data: dict[str, Any] = json.loads(found.group(1))
    return data


def _expected(folder: Path) -> dict[str, dict[str, Any]]:
    """Each session's totals, straight from its trace files."""
    totals: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*/turn-*.json")):
        trace = json.loads(path.read_text())
        session = totals.setdefault(
            trace["contextId"],
            {
                "modelCalls": 0,
                "clientTokens": 0,
                "proxyTokens": 0,
                "compactions": 0,
                "summarizerCalls": 0,
                "sizeRefusals": 0,
                "modes": set(),
            },
        )
        session["modelCalls"] += 1
        session["clientTokens"] += trace["clientTokens"]
        session["proxyTokens"] += trace["estimatedTokens"]
        session["compactions"] += bool(trace["compaction"]["reason"])
        session["summarizerCalls"] += len(trace.get("summarizerCalls", []))
        session["sizeRefusals"] += (trace.get("providerError") or {}).get("code") == "context_length_exceeded"
        session["modes"].add(trace["mode"])
    return totals


@pytest.fixture
def traced_sessions(start_proxy, provider) -> Path:
    """A dynamic session that compacts and a shadow session the provider refuses for size, traced."""
    proxy = start_proxy(
        mode="dynamic",
        models=(route_to(provider.url, "science-model", window=WINDOW),),
        trace_enabled=True,
        allow_mode_header=True,
    )
    provider.script(ScienceModel(40), context_window=WINDOW)
    assert _agent(proxy.client(), "dynamic-run", 40) is None
    provider.script(ScienceModel(12), context_window=WINDOW)
    refused = _agent(proxy.client(), "shadow-run", 12, {"x-context-mode": "shadow"})
    assert refused is not None, "the client's own history outgrew the provider's window"
    return proxy.settings.data_dir / "context-traces"


def test_report_shows_the_numbers_the_traces_hold(traced_sessions: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.html"
    assert cli(["report", "--traces", str(traced_sessions), "--out", str(out)]) == 0
    assert "reading traces" in capsys.readouterr().err
    page = out.read_text()
    expected = _expected(traced_sessions)
    shown = {s["contextId"]: s for s in _embedded(page)["sessions"]}
    cells = _Overview()
    cells.feed(page)
    assert set(shown) == set(cells.rows) == set(expected) == {"dynamic-run", "shadow-run"}
    for context_id, want in expected.items():
        session, row = shown[context_id], cells.rows[context_id]
        assert set(session["modes"]) == want.pop("modes")
        for key, value in want.items():
            assert session[key] == value, (context_id, key)
            assert row[key] == f"{value:,}", (context_id, key)
        assert session["savings"] == pytest.approx(1 - want["proxyTokens"] / want["clientTokens"])
        assert row["savings"] == f"{session['savings']:.1%}"
    dynamic, shadow = shown["dynamic-run"], shown["shadow-run"]
    assert dynamic["compactions"] >= 1 and dynamic["summarizerCalls"] >= 1
    assert dynamic["clientTokens"] > dynamic["proxyTokens"]  # the point of the proxy
    assert shadow["sizeRefusals"] == 1 and dynamic["sizeRefusals"] == 0
    refused = [t for t in shadow["turns"] if t["providerError"]]
    assert len(refused) == 1 and refused[0]["candidateTokens"] < refused[0]["limit"] < refused[0]["clientTokens"]
    assert 'class="overflow"' in page and 'class="compaction"' in page  # both marked on the charts
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "").split("<script", 1)[0]


def test_the_page_draws_in_headless_chromium(traced_sessions: Path, tmp_path: Path) -> None:
    assert shutil.which(CHROMIUM), "chromium is installed by .ci/run (apt-get install chromium)"
    out = tmp_path / "report.html"
    assert cli(["report", "--traces", str(traced_sessions), "--out", str(out)]) == 0
    opened = "dynamic-run/turn-0003.json"
    flags = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        [*flags, "--dump-dom", f"{out.as_uri()}#open={opened}"], capture_output=True, text=True, timeout=120
    ).stdout
    assert dom.count('<tr class="session"') == 2
    assert "dynamic-run" in dom and "shadow-run" in dom
    assert dom.count("<polyline") >= 6  # three lines per session chart
    # The script ran and drew the opened turn: its candidate beside what was sent.
    assert 'class="detail"><td' in dom
    assert "Candidate (" in dom and "Sent to the provider (" in dom and "Window statistics" in dom
    shot = tmp_path / "shot.png"
    subprocess.run([*flags, "--window-size=1280,900", f"--screenshot={shot}", out.as_uri()], timeout=120, check=True)
    assert shot.stat().st_size > 20_000  # a blank 1280x900 page compresses to a few KB
