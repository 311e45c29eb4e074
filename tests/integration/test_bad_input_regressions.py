"""One minimal body per class of failure the fuzz campaign (test_fuzz_requests.py) found, with its target answer.

Each case is sent through real HTTP on a keep-alive connection, then a normal turn of the same session is
sent on the same connection: it must succeed on the same connection (a 500 used to drop it silently, and a
streamed fault used to leave the session's lock held, so the next turn got 409 ``session_busy``).

The expected answers are the ones issue 12 asks for: client mistakes are 400 with an OpenAI error naming
the field where it is obvious; lone surrogates are replaced by U+FFFD and the turn succeeds; litellm's own
arguments are refused as ``unsupported_parameter``; the provider is never called for a refused request.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import jsonschema
import pytest

SCHEMAS = json.loads((Path(__file__).parents[1] / "data" / "openai-chat-schemas.json").read_text())["schemas"]
ERROR_VALIDATOR = jsonschema.Draft202012Validator(SCHEMAS["ErrorResponse"])
USER = '{"role": "user", "content": "hi"}'
CALL = USER + ', {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}'


def body(fields: str = "", messages: str = USER) -> bytes:
    """A request body written as JSON text, so that it can hold what json.dumps refuses to write."""
    extra = f", {fields}" if fields else ""
    return f'{{"model": "test-model", "messages": [{messages}]{extra}}}'.encode()


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


# (body, status, param, code): param and code are None where the target does not pin them.
CASES = [
    # JSON the decoder or the store cannot take: 500 today (app.py _read_json, reconcile.message_rows).
    pytest.param(
        b'{"model": "test-model", "messages": ' + deep(100_000).encode() + b"}", 400, None, None, id="nesting-100000"
    ),
    pytest.param(
        body(messages='{"role": "user", "content": [{"type": "text", "text": "x", "extra": ' + deep(2_000) + "}]}"),
        400,
        None,
        None,
        id="nesting-2000-in-content-part",
    ),
    pytest.param(body('"temperature": NaN'), 400, None, None, id="nan-temperature"),
    pytest.param(body('"temperature": Infinity'), 400, None, None, id="infinity-temperature"),
    pytest.param(
        body(messages='{"role": "user", "content": [{"type": "text", "text": "x", "score": NaN}]}'),
        400,
        None,
        None,
        id="nan-in-content-part",
    ),
    pytest.param(
        body(messages='{"role": "user", "content": [{"type": "text", "text": "x", "score": 1e999}]}'),
        400,
        None,
        None,
        id="float-overflow-1e999",
    ),
    pytest.param(body('"seed": ' + "9" * 5_000), 400, None, None, id="integer-5000-digits"),
    pytest.param(b'[{"model": "test-model"}]', 400, None, None, id="non-object-body"),
    # A message that is not an object, in a body long enough to be remembered for its resent prefix
    # (resent_requests.py, at least 8 messages): the memo's copy of its messages raised, a 500.
    pytest.param(body(messages=", ".join([USER] * 8 + ['"hi"'])), 400, None, None, id="string-message-in-long-body"),
    pytest.param(body(messages=", ".join([USER] * 8 + ["7"])), 400, None, None, id="number-message-in-long-body"),
    # Lone surrogates: 500 today from the fingerprint (identity.py), the estimator and the trace writer.
    pytest.param(
        body(messages='{"role": "user", "content": "a\\ud800b"}'), 200, None, None, id="surrogate-in-first-user-message"
    ),
    pytest.param(
        body(messages='{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}'),
        200,
        None,
        None,
        id="surrogate-in-text-part",
    ),
    pytest.param(
        body('"tools": [{"type": "function", "function": {"name": "f", "description": "\\ud800"}}]'),
        200,
        None,
        None,
        id="surrogate-in-tool-definition",
    ),
    pytest.param(body('"user": "a\\ud800"'), 200, None, None, id="surrogate-in-user-field"),
    pytest.param(body('"stream": true, "user": "a\\ud800"'), 200, None, None, id="surrogate-in-streamed-request"),
    # litellm's own arguments reach litellm.acompletion today (502, 500, 422 or a mocked 200).
    pytest.param(body('"base_url": "http://127.0.0.1:9/v1"'), 400, "base_url", "unsupported_parameter", id="base_url"),
    pytest.param(body('"api_key": "sk-client"'), 400, "api_key", "unsupported_parameter", id="api_key"),
    pytest.param(
        body('"mock_response": "not from the provider"'),
        400,
        "mock_response",
        "unsupported_parameter",
        id="mock_response",
    ),
    pytest.param(body('"fallbacks": {"a": "b"}'), 400, "fallbacks", "unsupported_parameter", id="fallbacks"),
    pytest.param(body('"timeout": "soon"'), 400, "timeout", "unsupported_parameter", id="timeout"),
    pytest.param(body('"num_retries": "many"'), 400, "num_retries", "unsupported_parameter", id="num_retries"),
    pytest.param(body('"extra_headers": 1'), 400, "extra_headers", "unsupported_parameter", id="extra_headers"),
    pytest.param(body('"extra_body": "x"'), 400, "extra_body", "unsupported_parameter", id="extra_body"),
    # Content parts litellm refuses while building the call: 502 "Could not reach the provider" today.
    pytest.param(
        body(messages='{"role": "user", "content": [{"type": "wizard", "wizard": "x"}]}'),
        400,
        "messages.0",
        None,
        id="unknown-content-part-type",
    ),
    pytest.param(
        body(messages='{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}'),
        400,
        "messages.0",
        None,
        id="refusal-part-in-user-message",
    ),
    pytest.param(
        body(messages='{"role": "user", "content": [{"type": "image_url"}]}'),
        400,
        "messages.0",
        None,
        id="image-part-without-image_url",
    ),
    # tool_calls on a message of another role than assistant: the chain hash read it as an assistant's
    # calls, so a non-list value was a 500 (a list passed on to the provider, which refuses it).
    *(
        pytest.param(
            body(messages=message),
            400,
            param,
            None,
            id=f"tool_calls-on-{role}-{kind}",
        )
        for kind, value in (("string", '"[]"'), ("object", '{"id": "c"}'), ("list", "[]"))
        for role, message, param in (
            ("user", '{"role": "user", "content": "x", "tool_calls": ' + value + "}", "messages.0.tool_calls"),
            (
                "system",
                '{"role": "system", "content": "x", "tool_calls": ' + value + "}, " + USER,
                "messages.0.tool_calls",
            ),
            (
                "developer",
                '{"role": "developer", "content": "x", "tool_calls": ' + value + "}, " + USER,
                "messages.0.tool_calls",
            ),
            (
                "tool",
                CALL + ', {"role": "tool", "tool_call_id": "c", "content": "r", "tool_calls": ' + value + "}, " + USER,
                "messages.2.tool_calls",
            ),
        )
    ),
]


def _local_port(response: httpx.Response) -> int:
    return int(response.extensions["network_stream"].get_extra_info("client_addr")[1])


@pytest.mark.parametrize(("raw", "status", "param", "code"), CASES)
def test_bad_input_gets_its_answer_and_the_session_keeps_working(
    start_proxy, provider, raw: bytes, status: int, param: str | None, code: str | None
) -> None:
    proxy = start_proxy(trace_enabled=True, session_lock_seconds=2)
    session = {"x-session-id": "regression"}
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        response = http.post(
            "/v1/chat/completions", content=raw, headers={"content-type": "application/json", **session}
        )
        port = _local_port(response)
        assert response.status_code == status, response.text[:500]
        if status >= 400:
            error = response.json()
            ERROR_VALIDATOR.validate(error)
            assert provider.history == []  # refused before the provider was called
            if param is not None:
                assert (error["error"]["param"] or "").startswith(param), error
            if code is not None:
                assert error["error"]["code"] == code, error
        elif response.headers["content-type"].startswith("text/event-stream"):
            assert response.text.rstrip().endswith("data: [DONE]"), response.text[-300:]
        else:
            assert response.json()["choices"][0]["message"]["content"] == "ok"
        if status == 200 and b"\\ud" in raw:
            sent = json.dumps(provider.history[-1])  # ASCII escapes: a lone surrogate would show as \\udXXX
            assert not re.search(r"\\ud[89a-f]", sent), sent[:500]  # nothing passed on
            if b'"user"' not in raw:
                # litellm does not send ``user`` to an OpenAI-compatible route (the scripted provider's), so
                # the replacement shows at the provider only for a surrogate in messages or tools.
                assert "\\ufffd" in sent, sent[:500]  # replaced at the edge
        follow_up = {"model": "test-model", "messages": [{"role": "user", "content": "next turn"}]}
        after = http.post("/v1/chat/completions", json=follow_up, headers=session)
        assert after.status_code == 200, after.text[:500]
        assert _local_port(after) == port  # the keep-alive connection survived the bad request
