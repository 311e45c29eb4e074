"""Smoke test of the benchmark: the history-cost and estimator parts at tiny sizes, so CI catches a broken bench.

The servers run in threads here (the real command runs them as processes); the litellm-proxy venv is
never needed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from bench import against
from bench.estimator import run_estimator
from bench.history_cost import run_history_cost
from bench.long_run import prefix_share, tool_output
from bench.memory import run_memory
from bench.memory import tool_output as memory_output
from bench.report import render_markdown
from bench.scripted_server import LeanProvider, ok_script
from bench.servers import MASTER_KEY, MODEL
from proxy.app import create_app
from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.scripted import ScriptedProvider, serve_in_thread

JSON = {"content-type": "application/json"}
MACHINE = {"cpu": "x", "cores": 2, "platform": "p", "python": "3", "litellm": "1", "commit": "c"}


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(proxy URL, provider URL): our proxy in dynamic mode in front of the scripted provider."""
    with serve_in_thread(LeanProvider(ok_script).app()) as provider_url:
        route = ModelRoute(
            MODEL,
            {"model": "openai/scripted", "api_base": f"{provider_url}/v1", "api_key": "sk-provider"},
            max_input_tokens=4_000_000,
            max_output_tokens=4096,
        )
        settings = Settings(mode="dynamic", data_dir=tmp_path, master_key=MASTER_KEY, models=(route,))
        with serve_in_thread(create_app(settings)) as proxy_url:
            yield proxy_url, provider_url


def test_the_lean_provider_answers_as_the_scripted_one_with_a_quarter_of_the_compact_json_as_tokens() -> None:
    messages = [{"role": "user", "content": "Is the 298 K run finished? 温度"}]
    body = {"model": "scripted", "messages": messages}
    with (
        serve_in_thread(LeanProvider(ok_script).app()) as lean_url,
        serve_in_thread(ScriptedProvider(ok_script).app()) as plain_url,
    ):
        lean = httpx.post(f"{lean_url}/v1/chat/completions", json=body).json()
        plain = httpx.post(f"{plain_url}/v1/chat/completions", json=body).json()

    assert lean["choices"] == plain["choices"]
    assert lean["usage"]["prompt_tokens"] == len(orjson.dumps(messages)) // 4
    assert plain["usage"]["prompt_tokens"] > lean["usage"]["prompt_tokens"]  # the stdlib's spaced JSON


def test_the_skimming_provider_answers_and_counts_as_the_lean_one_without_building_the_messages() -> None:
    messages = [{"role": "user", "content": "Is the 298 K run finished? 温度"}, {"role": "assistant", "content": "no"}]
    plain = orjson.dumps({"model": "scripted", "messages": messages, "max_tokens": 8})
    streamed = orjson.dumps(
        {"model": "scripted", "messages": messages, "stream": True, "stream_options": {"include_usage": True}}
    )
    with (
        serve_in_thread(LeanProvider(ok_script, skim=True).app()) as skim_url,
        serve_in_thread(LeanProvider(ok_script).app()) as lean_url,
    ):
        answers = [
            [httpx.post(f"{url}/v1/chat/completions", content=body, headers=JSON).text for body in (plain, streamed)]
            for url in (skim_url, lean_url)
        ]
        broken = httpx.post(f"{skim_url}/v1/chat/completions", content=plain[:-9], headers=JSON)

    assert answers[0] == answers[1]  # the same answer, streamed or not, usage and all
    assert orjson.loads(answers[0][0])["usage"]["prompt_tokens"] == len(orjson.dumps(messages)) // 4
    assert broken.status_code >= 400  # the body is still checked as JSON


def test_history_cost_measures_every_size(servers: tuple[str, str]) -> None:
    proxy_url, provider_url = servers
    result = run_history_cost(proxy_url, provider_url, sizes=[10, 40], repeats=1, warm_requests=2)
    assert [row["messages"] for row in result["rows"]] == [10, 40]
    assert all(row["direct_ms"] > 0 and row["request_bytes"] > 0 for row in result["rows"])
    # Small histories: a new session (one cold request) per warm sample, each exactly n messages.
    assert all(row["warm_requests"] == row["cold_requests"] == 2 for row in result["rows"])
    assert result["rows"][1]["warm_messages_max"] == 40
    assert all(row["added_warm_ms"] <= row["added_warm_p99_ms"] for row in result["rows"])
    assert [stage["messages"] for stage in result["stages"]] == [10, 40]
    assert result["scaling"][0]["from"] == 10
    markdown = render_markdown(
        {"date": "2026-01-01T00:00:00+00:00", "quick": True, "machine": {**MACHINE}, "parts": {"history_cost": result}}
    )
    assert "warm p99 <= 2x p50 at 1,000 messages" in markdown and "| 40 |" in markdown


def test_history_cost_sets_ours_against_an_earlier_proxy_request_by_request(
    servers: tuple[str, str], tmp_path: Path
) -> None:
    """``--against``: every request also goes to the earlier proxy (here a second one of ours), and each
    size gets the ratios; the report renders them."""
    proxy_url, provider_url = servers
    route = ModelRoute(
        MODEL,
        {"model": "openai/scripted", "api_base": f"{provider_url}/v1", "api_key": "sk-provider"},
        max_input_tokens=4_000_000,
        max_output_tokens=4096,
    )
    settings = Settings(mode="dynamic", data_dir=tmp_path / "earlier", master_key=MASTER_KEY, models=(route,))
    with serve_in_thread(create_app(settings)) as earlier_url:
        result = run_history_cost(
            proxy_url, provider_url, sizes=[10], repeats=1, warm_requests=2, against_url=earlier_url
        )
    (row,) = result["rows"]
    compared = row["against"]
    assert compared["added_warm_ms"] > 0 and compared["warm_p50_ratio"] > 0
    assert compared["warm_p50_ratio"] == pytest.approx(row["added_warm_ms"] / compared["added_warm_ms"])
    markdown = render_markdown(
        {"date": "2026-01-01T00:00:00+00:00", "quick": True, "machine": MACHINE, "parts": {"history_cost": result}}
    )
    assert "Against the earlier commit" in markdown


def test_an_earlier_commit_is_checked_out_beside_the_repository_and_removed_after(tmp_path: Path) -> None:
    with against.checkout("HEAD", tmp_path) as (folder, commit):
        assert (folder / "proxy" / "app.py").is_file() and len(commit) >= 7
    assert not folder.exists()


def test_estimator_part_never_under_and_renders() -> None:
    result = run_estimator(quick=True)
    assert set(result["kinds"]) == {"research", "json", "code"}
    assert result["never_under"], result["kinds"]
    assert all(speed > 0 for speed in result["throughput_mb_s"].values())
    # Every corpus teaches and is judged at both provider scales (research paragraphs are joined into
    # tool results big enough to be samples).
    calibrated = result["calibrated"]
    assert {(row["kind"], row["scale"]) for row in calibrated.values()} == {
        (kind, scale) for kind in ("research", "json", "code") for scale in (1.3, 0.8)
    }
    assert all(row["requests"] >= 20 for row in calibrated.values()), calibrated
    report = {
        "date": "2026-01-01T00:00:00+00:00",
        "quick": True,
        "seconds": 1.0,
        "machine": {"cpu": "x", "cores": 2, "platform": "p", "python": "3", "litellm": "1", "commit": "c"},
        "parts": {"estimator": result},
    }
    markdown = render_markdown(report)
    assert "| estimator never under tiktoken | met | 0 cases under |" in markdown
    assert "| research | 1.3x |" in markdown and "| code | 0.8x |" in markdown


def test_prefix_share_counts_the_common_prefix() -> None:
    assert prefix_share("abcd", "abcdef") == (1.0, 4 / 6)
    assert prefix_share("abXd", "abcd") == (0.5, 0.5)
    assert prefix_share("", "abc") == (0.0, 0.0)


def test_tool_output_is_about_twelve_kilobytes_and_deterministic() -> None:
    assert 12_000 <= len(tool_output(3).encode()) < 12_200
    assert tool_output(3) == tool_output(3) != tool_output(4)


def test_memory_part_samples_rss_and_sends_distinct_outputs(servers: tuple[str, str]) -> None:
    proxy_url, _ = servers
    result = run_memory(proxy_url, os.getpid(), requests=6, sessions=2, tool_bytes=3_000, samples=3)
    assert result["failures"] == 0
    assert [p["requests"] for p in result["points"]] == [2, 4, 6]
    assert all(p["rss_mib"] > 0 for p in result["points"])
    assert "## 5. Resident memory" in render_markdown(
        {
            "date": "2026-01-01T00:00:00+00:00",
            "quick": True,
            "machine": {"cpu": "x", "cores": 2, "platform": "p", "python": "3", "litellm": "1", "commit": "c"},
            "parts": {"memory": result},
        }
    )
    assert memory_output(0, 1, 3_000) != memory_output(1, 0, 3_000)
    assert abs(len(memory_output(0, 1, 3_000)) - 3_000) < 80


def test_isolation_part_measures_small_requests_during_a_large_one(servers: tuple[str, str]) -> None:
    from bench.isolation import large_history, run_isolation

    assert len(large_history(301)) == 301
    result = run_isolation(servers[0], messages=2_000, idle_samples=1)
    assert result["messages"] == 2_000 and result["large_ms"] > 0 and result["small_idle_ms"] > 0
    report = {
        "date": "2026-01-01T00:00:00+00:00",
        "quick": True,
        "seconds": 1.0,
        "machine": {"cpu": "x", "cores": 2, "platform": "p", "python": "3", "litellm": "1", "commit": "c"},
        "parts": {"isolation": result},
    }
    assert "## 6. A very large request" in render_markdown(report)


def test_chained_warm_requests_continue_the_session_without_a_fork(tmp_path: Path) -> None:
    """Part 2's long sessions are only "warm" if the proxy sees each request as the next turn."""
    import json

    import httpx

    from bench.assembly import make_history
    from bench.history_cost import _payload, warm_histories

    with serve_in_thread(LeanProvider(ok_script).app()) as provider_url:
        route = ModelRoute(MODEL, {"model": "openai/scripted", "api_base": f"{provider_url}/v1", "api_key": "sk-p"})
        settings = Settings(
            mode="dynamic", data_dir=tmp_path, master_key=MASTER_KEY, models=(route,), trace_enabled=True
        )
        headers = {"authorization": f"Bearer {MASTER_KEY}", "content-type": "application/json", "x-session-id": "s"}
        history = make_history(12)
        with serve_in_thread(create_app(settings)) as proxy_url, httpx.Client(timeout=60.0) as client:
            for messages in [history[:-1], *warm_histories(history, 3)]:
                url = f"{proxy_url}/v1/chat/completions"
                assert client.post(url, content=_payload(messages), headers=headers).status_code == 200
    traces = sorted((tmp_path / "context-traces").rglob("turn-*.json"))
    sessions = [json.loads(path.read_text())["session"] for path in traces]
    assert [(s["knownMessages"], s["newMessages"], s["forked"]) for s in sessions] == [
        (0, 11, False),
        (11, 1, False),
        (12, 2, False),
        (14, 2, False),
    ]


def test_agent_shapes_are_what_agents_send_in_each_api() -> None:
    """About 20k tokens of system prompt, 24 tools, 12 history messages; byte-identical across calls."""
    import tiktoken

    from bench.agent_shapes import APIS, agent_body, system_prompt

    encoding = tiktoken.get_encoding("o200k_base")
    assert 18_000 <= len(encoding.encode(system_prompt())) <= 24_000
    chat, messages, responses = (agent_body(api, False) for api in APIS)
    assert len(chat["messages"]) == 13 and len(chat["tools"]) == 24  # the system message and 12
    assert len(messages["messages"]) == 12 and len(messages["tools"]) == 24 and messages["system"]
    assert len(responses["input"]) == 12 and len(responses["tools"]) == 24 and responses["instructions"]
    assert orjson.dumps(agent_body("messages", True)) == orjson.dumps(agent_body("messages", True))
    later = agent_body("chat", False, later=True)["messages"]
    assert later[:13] == chat["messages"] and [m["role"] for m in later[13:]] == ["assistant", "user"]


def test_the_answer_shape_streams_the_long_answer_through_the_proxy(servers: tuple[str, str]) -> None:
    """Part 8's ``answer`` shape: the scripted provider answers it at length, 16 characters a chunk, skimming
    the body or not, and the proxy relays every chunk of it."""
    from bench.agent_shapes import answer_body
    from bench.scripted_server import LONG_ANSWER, LONG_ANSWER_CHUNKS

    proxy_url, _ = servers
    headers = {"authorization": f"Bearer {MASTER_KEY}", "x-session-id": "answer-shape"}
    with httpx.stream("POST", f"{proxy_url}/v1/chat/completions", json=answer_body("chat", True), headers=headers) as r:
        events = [orjson.loads(line[5:]) for line in r.iter_lines() if line.startswith("data: {")]
    pieces = [c["choices"][0]["delta"].get("content") for c in events if c["choices"]]
    assert "".join(p for p in pieces if p) == LONG_ANSWER
    assert len([p for p in pieces if p]) == LONG_ANSWER_CHUNKS
    with serve_in_thread(LeanProvider(ok_script, skim=True).app()) as skimming:
        body = {"model": MODEL, "messages": answer_body("chat", False)["messages"]}
        answer = httpx.post(f"{skimming}/v1/chat/completions", json=body).json()
    assert answer["choices"][0]["message"]["content"] == LONG_ANSWER


def test_agent_part_times_every_case_on_both_proxies_and_renders(servers: tuple[str, str], tmp_path: Path) -> None:
    """Part 8 at tiny counts; a second proxy of ours stands in for the litellm proxy (same endpoints)."""
    from bench.agent import run_agent
    from bench.agent_shapes import APIS

    proxy_url, provider_url = servers
    route = ModelRoute(
        MODEL,
        {"model": "openai/scripted", "api_base": f"{provider_url}/v1", "api_key": "sk-provider"},
        max_input_tokens=4_000_000,
        max_output_tokens=4096,
    )
    settings = Settings(mode="dynamic", data_dir=tmp_path / "other", master_key=MASTER_KEY, models=(route,))
    legacy = Settings(mode="legacy", data_dir=tmp_path / "legacy", master_key=MASTER_KEY, models=(route,))
    with serve_in_thread(create_app(settings)) as other_url, serve_in_thread(create_app(legacy)) as legacy_url:
        urls = {"direct": provider_url, "dynamic": proxy_url, "litellm-proxy": other_url, "legacy": legacy_url}
        result = run_agent(urls, requests=1, throughput_requests=2, repeats=1, warmup=0)
    cases = result["cases"]
    # shapes x APIs x streamed or not, the long answer streamed on each API, and the later turns
    assert len(cases) == 2 * 3 * 2 + 3 + 3 * 2
    assert {name for name in cases if name.startswith("answer/")} == {f"answer/{api}/stream" for api in APIS}
    for name, case in cases.items():
        ours = case["dynamic"]
        assert ours["p50_ms"] > 0
        assert ("first_p50_ms" in ours) == name.endswith("/stream")  # a stream's first text delta was seen
        if name.startswith("later/"):
            assert ours["direct_p50_ms"] > 0 and "added_p50_vs_direct" in case["ratios"]
            # The same later turn through the proxy in legacy mode: the bound of a faster assembly.
            assert case["legacy"]["p50_ms"] > 0 and "legacy_added_p50_vs_direct" in case["ratios"]
        else:
            theirs = case["litellm-proxy"]
            assert ours["rps"] > 0 and theirs["rps"] > 0 and case["ratios"]["rps"] > 0
            # One request a path: on a busy machine the direct call's one sample can be the slower, and an
            # added time below zero gets no ratio (the report leaves it out rather than print a meaningless one).
            timed = ours["added_p50_ms"] >= 0 and theirs["added_p50_ms"] >= 0
            assert ("added_p50" in case["ratios"]) == timed
            first_timed = (
                name.endswith("/stream") and min(ours["added_first_p50_ms"], theirs["added_first_p50_ms"]) >= 0
            )
            assert ("added_first_p50" in case["ratios"]) == first_timed
            assert ("first_p50_ms" in theirs) == name.endswith("/stream")
    assert all("legacy" not in case for name, case in cases.items() if not name.startswith("later/"))
    assert result["chat_body_bytes"]["agent"] > 100_000
    markdown = render_markdown(
        {"date": "2026-01-01T00:00:00+00:00", "quick": True, "machine": {**MACHINE}, "parts": {"agent": result}}
    )
    assert "agent/responses/stream: added p50 and first token <= 0.5x" in markdown
    assert "later/messages/json: added p50 <= 3x the direct call's time" in markdown
    assert "| later/chat/stream | legacy |" in markdown and "; legacy mode " in markdown


def test_a_compacted_sessions_streams_stay_live_and_the_report_judges_it() -> None:
    """Part 8's compacted session: after the proxy compacts (and offers its own tool), a text answer still
    reaches the client as it is written: its first token well before its last byte, as in an uncompacted
    twin on the same steps (an answer held to its end would give a first/last ratio of about 1)."""
    from bench.compacted_stream import run_compacted_stream

    result = run_compacted_stream(steps=18, chunk_delay=0.01)
    assert "error" not in result, result  # the loop compacted, its uncompacted twin in the same proxy did not
    assert result["compacted_from"] < 17, result
    assert result["first_over_last_after"] < 0.5, result
    assert result["first_over_last_twin"] < 0.5, result
    assert len(result["twin_steps"]) == len(result["steps"]) == 18
    report = {"cases": {}, "compacted_stream": result, "chat_body_bytes": {}, "requests_per_repeat": 1}
    report |= {"repeats": 1, "throughput_requests": 1, "concurrency": 1}
    markdown = render_markdown(
        {"date": "2026-01-01T00:00:00+00:00", "quick": True, "machine": {**MACHINE}, "parts": {"agent": report}}
    )
    assert "compacted session, streamed: first token / last byte as before compaction" in markdown
    assert "x the uncompacted twin's (first/last" in markdown
