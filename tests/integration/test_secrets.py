"""Credentials through real HTTP: the master key as x-api-key, and no credential reaches a contributor,
the provider's input or a trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

GOOD = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
PROBE = '''
"""A third-party contributor that shows the model every request header it was handed."""

import json


class _Probe:
    id = "header_probe"
    scopes = ("main",)
    protected = False

    async def contribute(self, request):
        seen = json.dumps(dict(request.headers), sort_keys=True)
        return {"attachments": [{"id": "probe.headers", "source": "probe", "content": "HEADERS " + seen}]}


class _Factory:
    id = "header_probe"

    def create(self, scope):
        return _Probe() if scope == "main" else None


factory = _Factory()
'''


def test_the_master_key_is_accepted_as_x_api_key(start_proxy):
    proxy = start_proxy(mode="legacy", master_key="sk-master")
    with httpx.Client(base_url=proxy.url) as http:
        assert http.post("/v1/chat/completions", json=GOOD, headers={"x-api-key": "sk-master"}).status_code == 200
        assert http.get("/v1/models", headers={"x-api-key": "sk-master"}).status_code == 200
        wrong = http.post("/v1/chat/completions", json=GOOD, headers={"x-api-key": "sk-wrong"})
        bearer = http.post("/v1/chat/completions", json=GOOD, headers={"authorization": "Bearer sk-master"})
    assert wrong.status_code == 401 and "x-api-key" in wrong.json()["error"]["message"]
    assert bearer.status_code == 200


@pytest.fixture
def header_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Install the probe the way pip would: a module and a *.dist-info with its entry point on sys.path."""
    site = tmp_path / "site"
    dist = site / "header_probe-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (site / "header_probe.py").write_text(PROBE)
    dist.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: header-probe\nVersion: 0.1.0\n")
    points = "[science_context.contributors]\nheader_probe = header_probe:factory\n"
    dist.joinpath("entry_points.txt").write_text(points)
    monkeypatch.syspath_prepend(str(site))


def test_a_contributor_never_receives_a_credential_header(start_proxy, provider, header_probe):
    proxy = start_proxy(mode="dynamic", master_key="sk-master-SECRET", trace_enabled=True)
    credentials = {
        "authorization": "Bearer sk-master-SECRET",
        "x-api-key": "sk-master-SECRET",
        "proxy-authorization": "Basic cHJveHktU0VDUkVU",
        "cookie": "session=cookie-SECRET",
        "x-goog-api-key": "goog-SECRET",
        "api-key": "azure-SECRET",
        "x-amz-security-token": "amz-SECRET",
    }
    with httpx.Client(base_url=proxy.url) as http:
        answer = http.post(
            "/v1/chat/completions",
            json=GOOD,
            headers={**credentials, "x-session-id": "probe-1", "x-trace-note": "visible"},
        )
    assert answer.status_code == 200, answer.text

    received = json.dumps(provider.history[-1])
    seen = _probe_headers(provider.history[-1])
    assert seen["x-session-id"] == "probe-1" and seen["x-trace-note"] == "visible"  # the probe did run
    assert not set(credentials) & set(seen), seen
    assert "SECRET" not in received and "cHJveHktU0VDUkVU" not in received
    traces = list((proxy.settings.data_dir / "context-traces" / "probe-1").glob("turn-*.json"))
    assert traces and all("SECRET" not in path.read_text() for path in traces)


def _probe_headers(body: dict[str, Any]) -> dict[str, str]:
    for message in body["messages"]:
        content = str(message.get("content"))
        if 'source="probe"' in content and "HEADERS " in content:
            text = content.split("HEADERS ", 1)[1]
            return dict(json.JSONDecoder().raw_decode(text)[0])
    raise AssertionError("the probe's attachment did not reach the provider")
