"""Sessions through real HTTP: identity, restart survival, isolation, and concurrent sessions."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import httpx

from proxy.session import open_store


def _trace(data_dir: Path, context_id: str, turn: int) -> dict[str, Any]:
    path = data_dir / "context-traces" / context_id / f"turn-{turn:04d}.json"
    return json.loads(path.read_text())


def _turn(http: httpx.Client, messages: list[dict[str, Any]], **headers: str) -> httpx.Response:
    response = http.post("/v1/chat/completions", json={"model": "test-model", "messages": messages}, headers=headers)
    assert response.status_code == 200, response.text
    return response


def test_session_survives_a_restart(start_proxy, provider):
    messages = [{"role": "system", "content": "lab agent"}, {"role": "user", "content": "start"}]
    first = start_proxy(mode="legacy", trace_enabled=True)
    with httpx.Client(base_url=first.url) as http:
        reply = _turn(http, messages, **{"x-session-id": "run-42"}).json()["choices"][0]["message"]
    messages += [{"role": "assistant", "content": reply["content"]}, {"role": "user", "content": "go on"}]

    first.stop()  # one process per SQLite data folder: the restart comes after the first one ends
    second = start_proxy(mode="legacy", trace_enabled=True)  # a new process image on the same data dir
    with httpx.Client(base_url=second.url) as http:
        response = _turn(http, messages, **{"x-session-id": "run-42"})
    assert response.headers["x-context-id"] == "run-42"
    trace = _trace(second.settings.data_dir, "run-42", 2)  # the turn counter continued too
    assert trace["session"] == {
        "headHash": trace["session"]["headHash"],
        "knownMessages": 2,
        "newMessages": 2,
        "forked": False,
        # the second model call on this branch, after the first (whose head was the opening)
        "branch": {"turn": 2, "parentHeadHash": _trace(second.settings.data_dir, "run-42", 1)["session"]["headHash"]},
    }


def test_two_sessions_never_see_each_others_data(start_proxy, provider, tmp_path):
    proxy = start_proxy(mode="legacy", trace_enabled=True)
    a = [
        {"role": "user", "content": "alpha"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "secret of A"},
    ]
    b = [{"role": "user", "content": "alpha"}]
    with httpx.Client(base_url=proxy.url) as http:
        _turn(http, a, **{"x-session-id": "sess-a"})
        _turn(http, b, **{"x-session-id": "sess-b"})

    proxy.stop()  # the proxy holds its SQLite store until it ends

    async def inspect() -> None:
        store = open_store(None, proxy.settings.data_dir, 5)
        await store.open()
        try:
            head_a = _trace(proxy.settings.data_dir, "sess-a", 1)["session"]["headHash"]
            transcript_a = await store.transcript("sess-a", head_a)
            assert [m.message for m in transcript_a] == a
            ref = transcript_a[-1].tool_output_ref
            assert ref is not None
            assert await store.tool_output("sess-a", ref) == "secret of A"
            assert await store.tool_output("sess-b", ref) is None
            assert await store.transcript("sess-b", head_a) == []
        finally:
            await store.close()

    asyncio.run(inspect())


def test_session_id_from_body_metadata_and_unsafe_ids_are_hashed(legacy_proxy, provider):
    with httpx.Client(base_url=legacy_proxy.url) as http:
        from_body = http.post(
            "/v1/chat/completions",
            json={
                "model": "test-model",
                "messages": [{"role": "user", "content": "x"}],
                "metadata": {"session_id": "m-1"},
            },
        )
        unsafe = _turn(http, [{"role": "user", "content": "x"}], **{"x-session-id": "../../etc/passwd"})
        vendor = _turn(http, [{"role": "user", "content": "x"}], **{"x-acme-session-id": "acme-7"})
    assert from_body.headers["x-context-id"] == "m-1"
    assert unsafe.headers["x-context-id"].startswith("sid-") and "/" not in unsafe.headers["x-context-id"]
    assert vendor.headers["x-context-id"] == "acme-7"


def test_trace_files_are_private(start_proxy, provider):
    proxy = start_proxy(mode="shadow", trace_enabled=True)
    with httpx.Client(base_url=proxy.url) as http:
        _turn(http, [{"role": "user", "content": "x"}], **{"x-session-id": "private-1"})
    folder = proxy.settings.data_dir / "context-traces" / "private-1"
    path = folder / "turn-0001.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    trace = json.loads(path.read_text())
    assert trace["schemaVersion"] == 5 and trace["mode"] == "shadow" and trace["scope"] == "main"
    assert "api_key" not in trace["llmInput"] and "sk-test-provider" not in path.read_text()
    assert trace["renderedContext"] is not None  # shadow records the candidate beside what was sent


async def test_concurrent_sessions_all_complete(start_proxy, provider):
    proxy = start_proxy(mode="legacy")
    client = proxy.async_client()

    async def one(index: int) -> str:
        raw = await client.chat.completions.with_raw_response.create(
            model="test-model",
            messages=[{"role": "user", "content": f"task {index}"}],
            extra_headers={"x-session-id": f"c-{index}"},
        )
        return raw.headers["x-context-id"]

    ids = await asyncio.gather(*(one(i) for i in range(12)))
    await client.close()
    assert sorted(ids) == sorted(f"c-{i}" for i in range(12))


def test_per_request_mode_header_only_when_the_operator_allows_it(start_proxy, provider):
    body = {"model": "test-model", "messages": [{"role": "user", "content": "x"}]}
    locked = start_proxy(mode="dynamic")
    with httpx.Client(base_url=locked.url) as http:
        ignored = http.post("/v1/chat/completions", json=body, headers={"x-context-mode": "legacy"})
    assert ignored.headers["x-context-mode"] == "dynamic"
    locked.stop()  # one process per SQLite data folder
    open_proxy = start_proxy(mode="dynamic", allow_mode_header=True)
    with httpx.Client(base_url=open_proxy.url) as http:
        chosen = http.post("/v1/chat/completions", json=body, headers={"x-context-mode": "legacy"})
        bad = http.post("/v1/chat/completions", json=body, headers={"x-context-mode": "turbo"})
    assert chosen.headers["x-context-mode"] == "legacy"
    assert bad.status_code == 400 and "x-context-mode" in bad.json()["error"]["message"]
