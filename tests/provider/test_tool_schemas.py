"""The remembered tool-schema sanitizing (``proxy/provider/fast/tool_schemas.py``) answers as litellm's own
step answers, object for object, on every call: the bytes a provider receives are pinned by
``test_fast_path.py``; this pins what the body's builder is handed (whose objects it may keep)."""

from __future__ import annotations

import copy
from typing import Any

import litellm

from proxy.provider.fast.tool_schemas import SanitizedTools

PLAIN = {
    "type": "function",
    "function": {"name": "read", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
}
PATTERNED = {  # a regex Python cannot compile: litellm drops it
    "type": "function",
    "function": {
        "name": "measure",
        "parameters": {"type": "object", "properties": {"sample": {"type": "string", "pattern": "(?<id>[A-Z])"}}},
    },
}
ROUTE = {"custom_llm_provider": "openai", "api_base": "http://127.0.0.1:9/v1"}


def _litellm(tools: list[Any], memo: SanitizedTools | None = None) -> Any:
    config = litellm.OpenAIGPTConfig()
    if memo is not None:
        memo.remember_on(config)
    return config._sanitized_tools_update_for_openai({"tools": tools}, ROUTE)


def test_every_call_gets_litellms_answer_with_its_own_tools_where_litellm_left_them() -> None:
    memo = SanitizedTools()
    answers = []
    for _ in range(3):  # the first call runs litellm's step, the later ones the memo
        tools = [copy.deepcopy(PLAIN), copy.deepcopy(PATTERNED)]
        answer = _litellm(tools, memo)
        assert answer == _litellm(copy.deepcopy(tools))  # the same answer as litellm's own step
        assert answer["tools"] is not tools
        assert answer["tools"][0] is tools[0]  # left as it was: the call's own object, as litellm returns it
        assert "pattern" not in str(answer["tools"][1]) and "pattern" in str(tools[1])
        answers.append(answer)
    rewrites = [id(answer["tools"][1]) for answer in answers]
    assert len(set(rewrites)) == 3  # a rewritten tool is each call's own copy: one call's body never shares it


def test_an_answer_of_another_shape_is_not_remembered() -> None:
    memo = SanitizedTools()
    config = litellm.OpenAIGPTConfig()
    memo.remember_on(config)
    route = {**ROUTE, "custom_llm_provider": "hosted_vllm"}  # litellm sanitizes for "openai" only
    for _ in range(2):
        tools = [copy.deepcopy(PATTERNED)]
        assert dict(config._sanitized_tools_update_for_openai({"tools": tools}, route)) == {}  # nothing to update
    assert memo._answers == {}
