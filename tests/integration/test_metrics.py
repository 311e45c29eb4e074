"""``GET /metrics`` after a scripted run through real HTTP: the counters match what the provider saw.

The run is the science agent in dynamic mode against a provider with a 16,000-token window: it
compacts (previews, checkpoints from the summarizer), refuses one request for size once (the proxy's
one forced retry), and ends with the model reading step 1's output back through the proxy-owned
``read_tool_output``. Traces are off: metrics do not depend on them.
"""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from proxy.kernel.config import ModelRoute
from proxy.provider.science_script import PLANTED_FACT, TOOLS, ScienceModel, client_tool_result, is_summary_request
from proxy.provider.scripted import Reply

WINDOW = 16_000
STEPS = 36
MASTER_KEY = "sk-master"
OVERFLOW = {
    "error": {
        "message": "This model's maximum context length is 16000 tokens. However, your messages "
        "resulted in 16500 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}


def science_route(provider_url: str) -> ModelRoute:
    return ModelRoute(
        "science-model",
        {"model": "openai/scripted", "api_base": f"{provider_url}/v1", "api_key": "sk-test-provider"},
        max_input_tokens=WINDOW,
        max_output_tokens=2_000,
    )


def refusing_once(model: ScienceModel, at: int) -> Any:
    """The science model, refusing its ``at``-th agent request (summaries not counted) for size, once."""
    seen = {"agent": 0}

    def script(body: dict[str, Any]) -> Reply:
        if not is_summary_request(body):
            seen["agent"] += 1
            if seen["agent"] == at:
                return Reply(error_status=400, error_body=OVERFLOW)
        return model(body)

    return script


def run_agent(client: Any, steps: int, session: str) -> str:
    """The client's agent loop, resending its whole history each turn; returns the final answer."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an autonomous lab agent. Run the protocol step by step."},
        {"role": "user", "content": f"Run the {steps}-step calibration protocol, then report the calibration fact."},
    ]
    for _ in range(steps + 5):
        completion = client.chat.completions.create(
            model="science-model", messages=messages, tools=TOOLS, extra_headers={"x-session-id": session}
        )
        message = {k: v for k, v in completion.choices[0].message.model_dump(exclude_none=True).items() if v}
        message["role"] = "assistant"
        messages.append(message)
        if not message.get("tool_calls"):
            return str(message.get("content"))
        messages += [client_tool_result(call) for call in message["tool_calls"]]
    raise AssertionError("the agent did not finish")


def scrape(url: str, key: str | None = MASTER_KEY) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{url}/metrics", headers=headers, timeout=30)


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of the exposition by its sample name (``..._total``, ``..._count``), with its labels."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


def total(found: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(value for got, value in found.get(name, []) if all(got.get(k) == v for k, v in labels.items()))


def test_metrics_count_every_client_model_call_of_a_compacting_run_with_one_overflow_retry(start_proxy, provider):
    model = ScienceModel(STEPS)
    provider.script(refusing_once(model, at=STEPS // 2), context_window=WINDOW)
    proxy = start_proxy(
        mode="dynamic", models=(science_route(provider.url),), trace_enabled=False, master_key=MASTER_KEY
    )
    answer = run_agent(proxy.client(api_key=MASTER_KEY), STEPS, "metrics-run")
    assert PLANTED_FACT in answer

    response = scrape(proxy.url)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    found = samples(response.text)

    agent_calls = [body for body in provider.history if not is_summary_request(body)]
    summary_calls = [body for body in provider.history if is_summary_request(body)]
    requests = "context_proxy_requests_total"
    # One per model call made for the client: each turn, the refused call and its retry, the read-back round.
    assert total(found, requests) == len(agent_calls)
    assert total(found, requests, status="400") == 1
    assert total(found, requests, status="200", mode="dynamic", scope="main", endpoint="chat") == len(agent_calls) - 1
    assert total(found, "context_proxy_overflow_retries_total") == 1
    assert total(found, "context_proxy_overflow_retries_total", outcome="success") == 1
    assert model.summaries >= 1 and len(summary_calls) == model.summaries
    assert total(found, "context_proxy_summarizer_calls_total", outcome="success") == len(summary_calls)
    assert total(found, "context_proxy_compactions_total", reason="forced") == 1
    assert total(found, "context_proxy_compactions_total", reason="pressure") >= 1
    assert total(found, "context_proxy_proxy_tool_calls_total", tool="read_tool_output") == 1

    client_tokens = total(found, "context_proxy_prompt_tokens_total", kind="client")
    sent_tokens = total(found, "context_proxy_prompt_tokens_total", kind="sent")
    assert client_tokens > sent_tokens > 0
    # Dynamic mode sends the candidate, so what was sent is what was assembled.
    assert total(found, "context_proxy_prompt_tokens_total", kind="candidate") == sent_tokens
    assert total(found, "context_proxy_provider_seconds_count") == len(agent_calls)
    assert total(found, "context_proxy_assembly_seconds_count") == len(agent_calls)


def test_metrics_need_the_master_key_when_one_is_set(start_proxy):
    proxy = start_proxy(mode="legacy", master_key=MASTER_KEY)
    refused = scrape(proxy.url, key=None)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert scrape(proxy.url, key="sk-wrong").status_code == 401
    assert scrape(proxy.url).status_code == 200


def test_metrics_count_shadow_and_legacy_calls_by_mode_and_endpoint(start_proxy, provider):
    proxy = start_proxy(mode="shadow", allow_mode_header=True)
    client = proxy.client()
    messages = [{"role": "user", "content": "Analyse the spectra."}]
    client.chat.completions.create(model="test-model", messages=messages)
    client.chat.completions.create(model="test-model", messages=messages, extra_headers={"x-context-mode": "legacy"})
    # A stream relayed live is counted when it ends.
    streamed = client.chat.completions.create(
        model="test-model", messages=messages, stream=True, extra_headers={"x-context-mode": "legacy"}
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices) == "ok"
    assert client.responses.create(model="test-model", input="Analyse the spectra.").output_text == "ok"
    anthropic = proxy.anthropic_client()
    anthropic.messages.create(model="test-model", max_tokens=100, messages=messages)
    provider.script(lambda body: Reply(error_status=429, error_body={"error": {"message": "slow down"}}))
    refused = httpx.post(
        f"{proxy.url}/v1/chat/completions", json={"model": "test-model", "messages": messages}, timeout=30
    )
    assert refused.status_code == 429

    found = samples(scrape(proxy.url, key=None).text)
    requests = "context_proxy_requests_total"
    assert total(found, requests) == len(provider.history) == 6
    assert total(found, requests, mode="shadow", endpoint="chat", status="200") == 1
    assert total(found, requests, mode="legacy", endpoint="chat", status="200") == 2
    assert total(found, requests, mode="shadow", endpoint="messages", status="200") == 1
    assert total(found, requests, mode="shadow", endpoint="responses", status="200") == 1
    assert total(found, requests, mode="shadow", endpoint="chat", status="429") == 1
    # Shadow forwards the client's request: sent equals client; legacy assembles no candidate.
    client_tokens = total(found, "context_proxy_prompt_tokens_total", kind="client")
    assert total(found, "context_proxy_prompt_tokens_total", kind="sent") == client_tokens > 0
    assert total(found, "context_proxy_assembly_seconds_count") == 4  # the shadow calls
