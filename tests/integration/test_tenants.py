"""Teams over real HTTP (issue 41): virtual keys from the key API in the litellm proxy's shapes, the
official OpenAI and Anthropic SDKs as clients, on SQLite and PostgreSQL.

Two teams sending the same session id and the same opening never see each other's history, stored
responses or tool outputs; a key's model list and rate limits refuse a request before anything of it is
stored; a revoked key stops on every replica within the key cache's bound; ``/ui`` shows a team only its
own sessions and ``/metrics`` is the master key's, with a bounded ``team`` label.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.cli import main as cli
from proxy.provider.science_script import PLANTED_FACT, TOOLS, ScienceModel, client_tool_result
from proxy.provider.scripted import Reply, ToolCall
from proxy.replay.replay import replay
from proxy.replay.verdict import judge
from proxy.session import open_store
from tests.integration.conftest import STORE_BACKENDS, ProviderHandle, ProxyHandle, route_to, store_url_for
from tests.session.store_rows import session_info

MASTER = "sk-master-of-the-gateway"
ADMIN = {"Authorization": f"Bearer {MASTER}"}
OPENING = [
    {"role": "system", "content": "You are the lab's assistant."},
    {"role": "user", "content": "Start the assay."},
]


@pytest.fixture(params=STORE_BACKENDS)
async def store_url(request: pytest.FixtureRequest) -> AsyncIterator[str | None]:
    """``None`` (the SQLite default) or a fresh PostgreSQL schema, dropped afterwards."""
    async for url in store_url_for(request.param, "test_tenants", pool_size=3, lock_connections=8):
        yield url


def generate(proxy: ProxyHandle, **body: Any) -> dict[str, Any]:
    """``POST /key/generate`` with the master key, as a litellm operator's script sends it."""
    answer = httpx.post(f"{proxy.url}/key/generate", json=body, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    made: dict[str, Any] = answer.json()
    return made


def echo_secret(body: dict[str, Any]) -> Reply:
    """Answer with how many messages the provider was sent (the history it saw is in ``provider.history``)."""
    return Reply(content=f"saw {len(body['messages'])} messages")


def test_two_teams_with_one_session_id_and_opening_never_see_each_other(
    start_proxy: Callable[..., ProxyHandle], provider: ProviderHandle, store_url: str | None
) -> None:
    provider.script(echo_secret)
    proxy = start_proxy(master_key=MASTER, store_url=store_url, trace_enabled=True)
    keys = {team: generate(proxy, team_id=team)["key"] for team in ("alpha", "beta")}
    clients = {team: proxy.client(api_key=key) for team, key in keys.items()}
    same = {"x-session-id": "shared"}

    first = clients["alpha"].chat.completions.with_raw_response.create(
        model="test-model",
        messages=[*OPENING, {"role": "user", "content": "alpha's secret is ORCHID-7"}],
        extra_headers=same,
    )
    assert first.headers["x-context-id"] == "team.alpha.shared"
    history = [*OPENING, {"role": "user", "content": "beta's note"}]
    for turn in range(2):
        answer = clients["beta"].chat.completions.with_raw_response.create(
            model="test-model", messages=history, extra_headers=same
        )
        assert answer.headers["x-context-id"] == "team.beta.shared"
        history += [{"role": "assistant", "content": answer.parse().choices[0].message.content}]
        history += [{"role": "user", "content": f"go on {turn}"}]
    beta_inputs = [json.dumps(body["messages"]) for body in provider.history[1:]]
    assert beta_inputs and all("ORCHID-7" not in sent for sent in beta_inputs)
    # The same opening without any session id: a fingerprint, per team.
    fingerprinted = {
        team: client.chat.completions.with_raw_response.create(model="test-model", messages=OPENING).headers[
            "x-context-id"
        ]
        for team, client in clients.items()
    }
    assert fingerprinted["alpha"].startswith("team.alpha.fp-") and fingerprinted["beta"].startswith("team.beta.fp-")
    assert fingerprinted["alpha"].split(".", 2)[2] == fingerprinted["beta"].split(".", 2)[2]

    # Stored responses are found by their own team only.
    stored = clients["alpha"].responses.create(model="test-model", input="remember ORCHID-7", store=True)
    assert clients["alpha"].responses.retrieve(stored.id).id == stored.id
    with pytest.raises(openai.NotFoundError):
        clients["beta"].responses.retrieve(stored.id)
    with pytest.raises(openai.NotFoundError) as refused:
        clients["beta"].responses.create(model="test-model", input="and then?", previous_response_id=stored.id)
    assert refused.value.code == "previous_response_not_found"

    # The Anthropic SDK with its x-api-key: the same team, the same namespace.
    claude = proxy.anthropic_client(api_key=keys["beta"])
    message = claude.messages.with_raw_response.create(
        model="test-model", max_tokens=50, messages=[{"role": "user", "content": "hi"}], extra_headers=same
    )
    assert message.headers["x-context-id"] == "team.beta.shared"

    # Traces: a folder per team.
    traces = proxy.settings.data_dir / "context-traces"
    assert sorted(p.name for p in (traces / "teams").iterdir()) == ["alpha", "beta"]
    assert (traces / "teams" / "alpha" / "team.alpha.shared").is_dir()
    assert not (traces / "team.alpha.shared").exists()


def _science_run(client: openai.OpenAI, steps: int, task: str) -> tuple[str, list[dict[str, Any]]]:
    """A client agent loop to its final answer (``tests/integration/test_dynamic_compaction.py``'s)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an autonomous lab agent. Run the protocol step by step."},
        {"role": "user", "content": task},
    ]
    for _ in range(steps + 5):
        completion = client.chat.completions.create(
            model="science-model", messages=messages, tools=TOOLS, extra_headers={"x-session-id": "shared"}
        )
        message = {k: v for k, v in completion.choices[0].message.model_dump(exclude_none=True).items() if v}
        messages.append(message)
        if not message.get("tool_calls"):
            return str(message.get("content")), messages
        messages += [client_tool_result(call) for call in message["tool_calls"]]
    raise AssertionError("the agent did not finish")


def test_a_reference_copied_from_another_teams_preview_is_not_found(
    start_proxy: Callable[..., ProxyHandle], provider: ProviderHandle
) -> None:
    steps, window = 25, 16_000
    proxy = start_proxy(master_key=MASTER, models=(route_to(provider.url, "science-model", window=window),))
    alpha, beta = (proxy.client(api_key=generate(proxy, team_id=team)["key"]) for team in ("alpha", "beta"))

    provider.script(ScienceModel(steps), context_window=window)
    answer, _ = _science_run(alpha, steps, f"Run the {steps}-step calibration protocol, then report the fact.")
    assert PLANTED_FACT in answer  # alpha read its own output back through its reference
    reads = [
        json.loads(call["function"]["arguments"])["ref"]
        for body in provider.history
        for m in body["messages"]
        for call in m.get("tool_calls") or []
        if call["function"]["name"] == "read_tool_output"
    ]
    stolen = reads[0]

    model = ScienceModel(steps)

    def with_alphas_reference(body: dict[str, Any]) -> Reply:
        reply = model(body)
        calls = tuple(
            ToolCall(c.name, {**c.arguments, "ref": stolen}, c.id) if c.name == "read_tool_output" else c
            for c in reply.tool_calls
        )
        return Reply(content=reply.content, tool_calls=calls)

    provider.history.clear()
    provider.script(with_alphas_reference, context_window=window)
    answer, _ = _science_run(beta, steps, f"Run the {steps}-step calibration protocol (beta), then report the fact.")
    assert PLANTED_FACT not in answer
    read_results = [
        m["content"]
        for body in provider.history
        for m in body["messages"]
        if m.get("role") == "tool" and f"ref={stolen}" in str(m.get("content"))
    ]
    assert read_results and all("unknown reference" in str(text) for text in read_results)


def test_a_keys_models_and_rate_limits_refuse_before_anything_is_stored(
    start_proxy: Callable[..., ProxyHandle], provider: ProviderHandle, store_url: str | None
) -> None:
    proxy = start_proxy(
        master_key=MASTER,
        store_url=store_url,
        models=(route_to(provider.url), route_to(provider.url, "other-model")),
    )
    limited = generate(proxy, team_id="alpha", models=["test-model"], rpm_limit=2)["key"]
    client = proxy.client(api_key=limited)
    claude = proxy.anthropic_client(api_key=limited)

    with pytest.raises(openai.PermissionDeniedError) as denied:
        client.chat.completions.create(model="other-model", messages=OPENING)
    assert denied.value.code == "model_not_allowed"
    with pytest.raises(anthropic.PermissionDeniedError) as denied_claude:
        claude.messages.create(model="other-model", max_tokens=20, messages=[{"role": "user", "content": "hi"}])
    assert denied_claude.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    assert [m.id for m in client.models.list()] == ["test-model"]

    for _ in range(2):
        client.chat.completions.create(model="test-model", messages=OPENING, extra_headers={"x-session-id": "s"})
    calls = len(provider.history)
    with pytest.raises(openai.RateLimitError) as limited_error:
        client.chat.completions.create(
            model="test-model",
            messages=[*OPENING, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "NEVER-STORED"}],
            extra_headers={"x-session-id": "s"},
        )
    assert 1 <= int(limited_error.value.response.headers["retry-after"]) <= 60
    with pytest.raises(anthropic.RateLimitError) as limited_claude:
        claude.messages.create(model="test-model", max_tokens=20, messages=[{"role": "user", "content": "hi"}])
    assert limited_claude.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert "retry-after" in limited_claude.value.response.headers
    assert len(provider.history) == calls  # no provider call

    tokens = generate(proxy, team_id="beta", tpm_limit=1)["key"]
    beta = proxy.client(api_key=tokens)
    beta.chat.completions.create(model="test-model", messages=OPENING)  # the minute's tokens are now used
    with pytest.raises(openai.RateLimitError) as over_tokens:
        beta.chat.completions.create(model="test-model", messages=OPENING)
    assert "tokens per minute" in over_tokens.value.message
    assert "retry-after" in over_tokens.value.response.headers

    proxy.stop()
    store = open_store(store_url, proxy.settings.data_dir, 5)

    async def stored() -> str:
        await store.open()
        try:
            info = await session_info(store, "team.alpha.s")
            assert info is not None
            return json.dumps([entry.message for entry in await store.transcript("team.alpha.s", info.head_hash)])
        finally:
            await store.close()

    transcript = asyncio.run(stored())
    assert "Start the assay." in transcript and "NEVER-STORED" not in transcript


def test_the_key_api_speaks_litellms_shapes_and_is_the_master_keys(
    start_proxy: Callable[..., ProxyHandle], provider: ProviderHandle
) -> None:
    proxy = start_proxy(master_key=MASTER)
    made = generate(
        proxy,
        team_id="alpha",
        models=["test-model"],
        duration="30d",
        key_alias="alpha-ci",
        rpm_limit=100,
        tpm_limit=100_000,
        metadata={"owner": "platform"},
    )
    assert made["key"].startswith("sk-cp-") and made["team_id"] == "alpha" and made["expires"]
    assert made["token"] != made["key"] and made["key_alias"] == "alpha-ci"
    info = httpx.get(f"{proxy.url}/key/info", params={"key": made["key"]}, headers=ADMIN).json()
    assert info["key"] == made["token"] and info["info"]["models"] == ["test-model"]
    assert made["key"] not in json.dumps(info)

    # What litellm has and this proxy does not enforce is refused, not ignored.
    budget = httpx.post(f"{proxy.url}/key/generate", json={"team_id": "a", "max_budget": 10}, headers=ADMIN)
    assert budget.status_code == 400 and budget.json()["error"]["code"] == "unsupported_parameter"
    # Only the master key manages keys.
    as_team = {"Authorization": f"Bearer {made['key']}"}
    assert httpx.post(f"{proxy.url}/key/generate", json={"team_id": "x"}, headers=as_team).status_code == 403
    assert httpx.post(f"{proxy.url}/key/generate", json={"team_id": "x"}).status_code == 401
    assert httpx.get(f"{proxy.url}/metrics", headers=as_team).status_code == 403

    rotated = httpx.post(f"{proxy.url}/key/alpha-ci/regenerate", headers=ADMIN).json()
    assert rotated["key"] != made["key"] and rotated["key_id"] == made["key_id"]
    with pytest.raises(openai.AuthenticationError):
        proxy.client(api_key=made["key"]).chat.completions.create(model="test-model", messages=OPENING)
    proxy.client(api_key=rotated["key"]).chat.completions.create(model="test-model", messages=OPENING)

    deleted = httpx.post(f"{proxy.url}/key/delete", json={"key_aliases": ["alpha-ci"]}, headers=ADMIN)
    assert deleted.json() == {"deleted_keys": ["alpha-ci"]}
    again = httpx.post(f"{proxy.url}/key/delete", json={"keys": [rotated["key"]]}, headers=ADMIN)
    assert again.status_code == 404


@pytest.mark.postgres
async def test_a_revoked_key_stops_on_every_replica_within_the_cache_bound(
    start_proxy: Callable[..., ProxyHandle], provider: ProviderHandle, tmp_path: Any
) -> None:
    bound = 2
    async for url in store_url_for("postgres", "test_tenants_replicas", pool_size=3, lock_connections=8):
        one = start_proxy(master_key=MASTER, store_url=url, key_cache_seconds=bound, data_dir=tmp_path / "one")
        two = start_proxy(master_key=MASTER, store_url=url, key_cache_seconds=bound, data_dir=tmp_path / "two")
        key = await asyncio.to_thread(generate, one, team_id="alpha")
        clients = [replica.async_client(api_key=key["key"]) for replica in (one, two)]
        try:
            for client in clients:  # made on one, served by both: each replica's cache now holds it
                await client.chat.completions.create(model="test-model", messages=OPENING)
            async with httpx.AsyncClient() as admin:
                answer = await admin.post(f"{one.url}/key/delete", json={"keys": [key["key"]]}, headers=ADMIN)
                assert answer.status_code == 200
            revoked_at = time.monotonic()
            for client in clients:
                while True:
                    try:
                        await client.chat.completions.create(model="test-model", messages=OPENING)
                    except openai.AuthenticationError:
                        break
                    assert time.monotonic() - revoked_at < bound + 1, "the revoked key still worked past the bound"
                    await asyncio.sleep(0.1)
        finally:
            for client in clients:
                await client.close()


def test_ui_shows_a_team_its_own_sessions_and_metrics_count_by_team(
    start_proxy: Callable[..., ProxyHandle], provider: ProviderHandle
) -> None:
    proxy = start_proxy(master_key=MASTER, trace_enabled=True)
    keys = {team: generate(proxy, team_id=team)["key"] for team in ("alpha", "beta")}
    for team, key in keys.items():
        proxy.client(api_key=key).chat.completions.create(
            model="test-model", messages=OPENING, extra_headers={"x-session-id": f"{team}-run"}
        )
    proxy.client(api_key=MASTER).chat.completions.create(
        model="test-model", messages=OPENING, extra_headers={"x-session-id": "admin-run"}
    )

    def ui(path: str, key: str) -> httpx.Response:
        return httpx.get(f"{proxy.url}{path}", headers={"Authorization": f"Bearer {key}"})

    alpha_view = ui("/ui", keys["alpha"]).text
    assert "team.alpha.alpha-run" in alpha_view and "beta-run" not in alpha_view and "admin-run" not in alpha_view
    everything = ui("/ui", MASTER).text
    assert all(name in everything for name in ("team.alpha.alpha-run", "team.beta.beta-run", "admin-run"))
    assert ui("/ui/session/team.alpha.alpha-run", keys["alpha"]).status_code == 200
    assert ui("/ui/session/team.alpha.alpha-run", keys["beta"]).status_code == 404
    assert ui("/ui/session/team.alpha.alpha-run/turn-0001.json", keys["beta"]).status_code == 404
    assert ui("/ui/session/team.alpha.alpha-run/turn-0001.json", MASTER).status_code == 200

    # A team's login cookie works like its key, and stops with it.
    with httpx.Client(base_url=proxy.url) as browser:
        assert browser.post("/ui/login", data={"key": keys["beta"]}).status_code == 303
        assert "team.beta.beta-run" in browser.get("/ui").text
        httpx.post(f"{proxy.url}/key/delete", json={"keys": [keys["beta"]]}, headers=ADMIN)  # this replica: at once
        assert browser.get("/ui").status_code == 401

    metrics = httpx.get(f"{proxy.url}/metrics", headers=ADMIN)
    assert metrics.status_code == 200
    teams = {
        sample.labels["team"]: sample.value
        for family in text_string_to_metric_families(metrics.text)
        if family.name == "context_proxy_requests"
        for sample in family.samples
        if sample.name == "context_proxy_requests_total"
    }
    assert teams == {"alpha": 1.0, "beta": 1.0, "default": 1.0}


def test_the_keys_command_makes_keys_the_proxy_takes_and_the_report_filters_by_team(
    start_proxy: Callable[..., ProxyHandle],
    provider: ProviderHandle,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = tmp_path / "data"
    monkeypatch.setenv("SCIENCE_AGENT_DATA_DIR", str(data))
    assert cli(["keys", "create", "--team", "alpha", "--models", "test-model", "--alias", "alpha-ci"]) == 0
    alpha = capsys.readouterr().out.strip()
    assert cli(["keys", "create", "--team", "beta", "--max-tokens-per-minute", "5000", "--expires", "1d"]) == 0
    beta = capsys.readouterr().out.strip()
    assert cli(["keys", "create", "--team", "Not A Team"]) == 2
    capsys.readouterr()
    assert cli(["keys", "list"]) == 0
    listed = capsys.readouterr().out
    assert "alpha\talpha-ci\ttest-model" in listed and "5000 tpm" in listed
    assert alpha not in listed and beta not in listed
    assert cli(["keys", "rotate", "alpha-ci"]) == 0
    rotated = capsys.readouterr().out.strip()
    assert rotated.startswith("sk-cp-") and rotated != alpha

    proxy = start_proxy(master_key=MASTER, data_dir=data, trace_enabled=True)
    with pytest.raises(openai.AuthenticationError):
        proxy.client(api_key=alpha).chat.completions.create(model="test-model", messages=OPENING)
    for key, session in ((rotated, "a-run"), (beta, "b-run"), (MASTER, "admin-run")):
        proxy.client(api_key=key).chat.completions.create(
            model="test-model", messages=OPENING, extra_headers={"x-session-id": session}
        )
    proxy.stop()  # a SQLite store is one process's: the command runs once the proxy is stopped
    assert cli(["keys", "revoke", "alpha-ci"]) == 0
    assert cli(["keys", "revoke", "alpha-ci"]) == 1
    assert "revoked alpha-ci" in capsys.readouterr().err

    traces = data / "context-traces"
    for team, present, absent in (
        ("alpha", "team.alpha.a-run", ("b-run", "admin-run")),
        ("default", "admin-run", ("a-run", "b-run")),
    ):
        out = tmp_path / f"{team}.html"
        assert cli(["report", "--traces", str(traces), "--out", str(out), "--team", team]) == 0
        page = out.read_text()
        assert present in page and not any(other in page for other in absent)


def test_two_teams_recordings_replay_as_two_sessions(
    start_proxy: Callable[..., ProxyHandle], provider: ProviderHandle, tmp_path: Any
) -> None:
    folder = tmp_path / "recorded"
    proxy = start_proxy(master_key=MASTER, record_dir=folder)
    for team in ("alpha", "beta"):
        client = proxy.client(api_key=generate(proxy, team_id=team)["key"])
        history = [*OPENING, {"role": "user", "content": f"{team}'s question"}]
        for turn in range(2):
            answer = client.chat.completions.create(
                model="test-model", messages=history, extra_headers={"x-session-id": "shared"}
            )
            history += [{"role": "assistant", "content": answer.choices[0].message.content or ""}]
            history += [{"role": "user", "content": f"{team} goes on {turn}"}]
    proxy.stop()  # the last recording is written as its answer ends
    assert sorted(p.name for p in folder.iterdir()) == ["team.alpha.shared", "team.beta.shared"]
    replayed = replay([folder], proxy.settings)
    assert sorted(turn.context_id for turn in replayed) == ["team.alpha.shared"] * 2 + ["team.beta.shared"] * 2
    assert judge(replayed).summary() == "4 identical, 0 changed, 0 failed"


def test_a_gateways_team_header_is_believed_only_with_its_secret_or_from_its_network(
    start_proxy: Callable[..., ProxyHandle], provider: ProviderHandle
) -> None:
    secret = {"x-context-proxy-gateway-secret": "gw-shared-secret"}
    proxy = start_proxy(master_key=MASTER, team_header="x-team", team_header_secret="gw-shared-secret")
    gateway = proxy.client(api_key="not-a-key")  # the gateway authenticated the agent; it sends no key of ours
    answer = gateway.chat.completions.with_raw_response.create(
        model="test-model", messages=OPENING, extra_headers={"x-team": "alpha", "x-session-id": "s", **secret}
    )
    assert answer.headers["x-context-id"] == "team.alpha.s"
    claude = proxy.anthropic_client(api_key="not-a-key")
    message = claude.messages.with_raw_response.create(
        model="test-model",
        max_tokens=20,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-team": "beta", "x-session-id": "s", **secret},
    )
    assert message.headers["x-context-id"] == "team.beta.s"
    # A bare client naming a team: refused, the master key notwithstanding.
    for client in (gateway, proxy.client(api_key=MASTER)):
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="test-model", messages=OPENING, extra_headers={"x-team": "alpha"})
    with pytest.raises(openai.BadRequestError):
        gateway.chat.completions.create(
            model="test-model", messages=OPENING, extra_headers={"x-team": "Not A Team", **secret}
        )
    # A team named by the gateway is a team: not the administrator.
    as_gateway = {"x-team": "alpha", **secret, "Authorization": f"Bearer {MASTER}"}
    assert httpx.get(f"{proxy.url}/metrics", headers=as_gateway).status_code == 403
    proxy.stop()

    trusted = start_proxy(master_key=MASTER, team_header="x-team", team_header_from=("127.0.0.0/8",))
    answer = trusted.client(api_key="none").chat.completions.with_raw_response.create(
        model="test-model", messages=OPENING, extra_headers={"x-team": "alpha", "x-session-id": "s"}
    )
    assert answer.headers["x-context-id"] == "team.alpha.s"


def test_another_teams_compaction_token_is_dropped_like_one_never_issued(
    start_proxy: Callable[..., ProxyHandle], provider: ProviderHandle
) -> None:
    proxy = start_proxy(master_key=MASTER)
    keys = {team: generate(proxy, team_id=team)["key"] for team in ("alpha", "beta")}
    history = [
        {"type": "message", "role": "user", "content": "The sample code is ORCHID-7. Note it."},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Noted."}]},
    ]
    compacted = httpx.post(
        f"{proxy.url}/v1/responses/compact",
        json={"model": "test-model", "input": history},
        headers={"Authorization": f"Bearer {keys['alpha']}", "x-session-id": "s"},
        timeout=60,
    )
    assert compacted.status_code == 200, compacted.text
    item = compacted.json()["output"][-1]
    assert item["type"] == "compaction"

    def continue_with(team: str) -> str:
        provider.history.clear()
        answer = proxy.client(api_key=keys[team]).responses.create(
            model="test-model",
            input=[item, {"type": "message", "role": "user", "content": "What was the code?"}],  # type: ignore[list-item]
            extra_headers={"x-session-id": "s"},
        )
        assert answer.status == "completed"
        return json.dumps(provider.history[-1]["messages"])

    assert "ORCHID-7" in continue_with("alpha")  # its own checkpoint stands in for the compacted history
    assert "ORCHID-7" not in continue_with("beta")
