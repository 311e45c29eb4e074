"""``GET /ui`` on a running proxy: served directly without a master key, behind a cookie sign-in with one,
and never a file outside the trace folder."""

from __future__ import annotations

import json
import os

import httpx

from proxy.report.inspector import COOKIE

KEY = "sk-master-key-for-ui"


def _session(proxy, session: str, key: str = "sk-client") -> None:
    proxy.client(api_key=key).chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": "hi"}], extra_headers={"x-session-id": session}
    )


def test_ui_serves_sessions_directly_without_a_master_key(start_proxy):
    proxy = start_proxy(mode="dynamic", trace_enabled=True)
    _session(proxy, "older-run")
    _session(proxy, "newer-run")
    trace = proxy.settings.data_dir / "context-traces" / "older-run" / "turn-0001.json"
    os.utime(trace, (1_000_000_000, 1_000_000_000))  # long ago: the other session is the recent one
    with httpx.Client(base_url=proxy.url) as client:
        page = client.get("/ui")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert page.text.index('data-context-id="newer-run"') < page.text.index('data-context-id="older-run"')
        session = client.get("/ui/session/older-run")
        assert session.status_code == 200 and 'data-file="older-run/turn-0001.json"' in session.text
        raw = client.get("/ui/session/older-run/turn-0001.json")
        assert raw.status_code == 200 and raw.json() == json.loads(trace.read_text())


def test_ui_asks_for_the_master_key_once_and_keeps_a_strict_httponly_cookie(start_proxy):
    proxy = start_proxy(mode="dynamic", trace_enabled=True, master_key=KEY)
    _session(proxy, "keyed-run", key=KEY)
    with httpx.Client(base_url=proxy.url) as client:
        asked = client.get("/ui")
        assert asked.status_code == 401 and 'name="key"' in asked.text and "keyed-run" not in asked.text
        assert client.get("/ui/session/keyed-run/turn-0001.json").status_code == 401
        wrong = client.post("/ui/login", data={"key": "not-the-key"})
        assert wrong.status_code == 401 and COOKIE not in wrong.headers.get("set-cookie", "")
        signed_in = client.post("/ui/login", data={"key": KEY})
        assert signed_in.status_code == 303 and signed_in.headers["location"] == "/ui"
        cookie = signed_in.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
        assert KEY.lower() not in cookie  # the cookie is a signed token, not the key
        page = client.get("/ui")  # the client kept the cookie, as a browser does
        assert page.status_code == 200 and 'data-context-id="keyed-run"' in page.text
        assert client.get("/ui/session/keyed-run").status_code == 200
    forged = httpx.get(f"{proxy.url}/ui", cookies={COOKIE: "99999999999.0000"})
    assert forged.status_code == 401
    scripted = httpx.get(f"{proxy.url}/ui", headers={"authorization": f"Bearer {KEY}"})
    assert scripted.status_code == 200


def test_ui_never_serves_a_file_outside_the_trace_folder(start_proxy, tmp_path):
    proxy = start_proxy(mode="dynamic", trace_enabled=True)
    _session(proxy, "run")
    secret = tmp_path / "turn-0001.json"
    secret.write_text('{"contextId": "secret-outside"}')
    traces = proxy.settings.data_dir / "context-traces"
    (traces / "run" / "turn-0002.json").symlink_to(secret)  # a link inside that points outside
    (traces / "linked").symlink_to(tmp_path)  # a session folder that is a link outside
    with httpx.Client(base_url=proxy.url) as client:
        for path in (
            "/ui/session/..%2F..%2F..%2Fetc%2Fpasswd",
            "/ui/session/../turn-0001.json",
            "/ui/session/%2E%2E/turn-0001.json",
            "/ui/session/run/..%2F..%2F..%2Fturn-0001.json",
            "/ui/session/run/turn-0002.json",
            "/ui/session/linked",
            "/ui/session/linked/turn-0001.json",
            "/ui/session/run/%2Fetc%2Fpasswd",
        ):
            answer = client.get(path)
            assert answer.status_code == 404, path
            assert "secret-outside" not in answer.text and "root:" not in answer.text, path
        assert "secret-outside" not in client.get("/ui").text
        assert "secret-outside" not in client.get("/ui/session/run").text
    # The planted links are not traces: gone before the fixture checks every trace against the schema.
    (traces / "run" / "turn-0002.json").unlink()
    (traces / "linked").unlink()
