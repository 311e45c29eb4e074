"""A tool session that outgrows the real server's window, with the agent's side scripted and the model's
answers its own (``proxy/demo/local_run.py``, as ``context-proxy demo --local-model`` plays it).

What it shows, on the real tokenizer, overflow, stream and usage: every request is accepted by the server
although the client's history grows past its window; calibration learns the server's count from its usage
(the ratio in the trace, against tiktoken's); the checkpoint the model writes (eight tokens: nothing like
the sections asked for) is rejected by the validator while the deterministic trimming stands; and a
streamed turn, on which this server sends no usage, calibrates from the server's tokenizer endpoint.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from proxy.demo.local_run import MODEL, N_CTX, TOOLS, local_route, opening, step_messages
from tests.integration.local_model.conftest import sent_directly, traces

PAGES = 5  # the history passes the window at the fourth page


def test_a_tool_session_outgrows_the_window_and_goes_on(start_proxy, local_model):
    proxy = start_proxy(
        models=(local_route(local_model, answer_tokens=8),),
        trace_enabled=True,
        summary_max_attempts=1,
        summary_max_rounds=1,
    )
    client = proxy.client(timeout=600)
    headers = {"x-session-id": "local-session"}
    messages: list[dict[str, Any]] = opening()
    for page in range(1, PAGES + 1):
        messages += step_messages(page)
        answer = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, extra_headers=headers)
        messages.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
    question = "Which bird did I see most often across all the pages, and where? One short sentence, bird and place."
    messages.append({"role": "user", "content": question})
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, stream=True, extra_headers=headers
    )
    chunks = list(stream)
    assert chunks and chunks[-1].choices[0].finish_reason in {"stop", "length"}

    # The client's history outgrew the server's window: sent as it is, the server refuses it.
    direct = sent_directly(local_model, messages)
    assert direct.status_code == 400 and f"maximum context length is {N_CTX} tokens" in direct.text
    written = traces(proxy.settings.data_dir)
    turns = [written[name] for name in sorted(written)]
    assert len(turns) == PAGES + 1 and not any("recovery" in name for name in written)
    assert not [trace["providerError"] for trace in turns if "providerError" in trace]  # every call accepted
    for trace in turns[:-1]:
        usage = trace["usage"]
        assert usage["promptTokens"] + usage["completionTokens"] <= N_CTX

    # Compaction ran: the model's checkpoint was asked for and refused, the deterministic trimming stood
    # (the oldest tool steps left the window whole), and the session went on.
    compactions = [trace["compaction"] for trace in turns if trace["compaction"]["reason"] is not None]
    assert compactions and all(c["reason"] == "pressure" for c in compactions)
    summaries = [call for trace in turns for call in trace.get("summarizerCalls") or []]
    assert summaries and "error" not in summaries[-1]  # the model answered the summary request
    # Where the server counted a summary request over its window (its tokenizer counts prose more than ours),
    # the compactor asked once more with half the source, and that request was answered.
    for trace in turns:
        calls = trace.get("summarizerCalls") or []
        for refused, following in pairwise(calls):
            if "error" in refused:
                assert refused["error"]["code"] == "context_length_exceeded" and "error" not in following
    assert any(c["rejections"] for c in compactions) and not any(c["newCheckpoint"] for c in compactions)
    sent = turns[-1]["llmInput"]["messages"]
    assert len(sent) < len(messages) and sent[-1]["content"] == messages[-1]["content"]

    # Calibration learnt the server's count from its usage: each sample is the server's promptTokens over
    # tiktoken's count of the same request, and later turns count with the learnt ratio.
    for trace in turns[:-1]:
        assert trace["calibration"]["source"] == "usage"
        assert trace["calibration"]["providerTokens"] == trace["usage"]["promptTokens"]
    ratios = [t["calibration"]["providerTokens"] / t["calibration"]["localTokens"] for t in turns[:-1]]
    learnt = turns[-1]["budgets"]["estimator"]
    assert learnt["name"] == "calibrated" and learnt["samples"] >= PAGES - 1
    assert min(ratios) <= learnt["ratio"] <= max(ratios) and learnt["ratio"] != 1.0
    assert turns[0]["budgets"]["estimator"]["samples"] == 0

    # The streamed turn had no usage: calibration asked the server's tokenizer, never counted alone.
    streamed = turns[-1]
    assert "usage" not in streamed
    assert streamed["calibration"]["source"] == "tokenizer"
    assert streamed["calibration"]["providerTokens"] > 0
