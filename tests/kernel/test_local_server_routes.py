"""A local server's route options (``null_content_as_empty``, ``tokenizer_url``): read from the config file,
checked at start-up, and what the provider is sent with them (nothing changes on a route without them)."""

from __future__ import annotations

import pytest

from proxy.kernel.config import ConfigError, ModelRoute, Settings
from proxy.runtime.calls import build_llm_input

LOCAL = """
model_list:
  - model_name: local
    litellm_params: {model: openai/smollm2-135m, api_base: "http://127.0.0.1:8000/v1", api_key: none}
    model_info: {max_input_tokens: 2048, max_output_tokens: 256}
    null_content_as_empty: true
    tokenizer_url: http://127.0.0.1:8000/extras/tokenize
"""
CALL = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
HISTORY = [
    {"role": "user", "content": "go"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "assistant", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": None},
]


def test_the_options_are_read_from_the_config_file(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(LOCAL)
    (route,) = Settings.from_env({}, config_path=config).models
    assert route.null_content_as_empty is True
    assert route.tokenizer_url == "http://127.0.0.1:8000/extras/tokenize"


def test_a_tokenizer_url_that_is_not_http_stops_start_up_naming_it(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(LOCAL.replace("http://127.0.0.1:8000/extras/tokenize", "file:///etc/passwd"))
    with pytest.raises(ConfigError, match="tokenizer_url"):
        Settings.from_env({}, config_path=config)


def test_only_assistant_messages_without_content_are_sent_with_an_empty_string():
    route = ModelRoute("local", {"model": "openai/smollm2-135m"}, null_content_as_empty=True)
    sent = build_llm_input({"messages": HISTORY}, route, None)["messages"]
    assert [m.get("content", "absent") for m in sent] == ["go", "", "", None]
    assert HISTORY[1]["content"] is None  # the client's own history is not changed


def test_a_route_without_the_option_sends_the_messages_as_they_were():
    route = ModelRoute("other", {"model": "openai/gpt-4o"})
    assert build_llm_input({"messages": HISTORY}, route, None)["messages"] == HISTORY
