"""``proxy.provider.fast.messages``: litellm's provider-independent message steps in one pass, for the plain
messages the fast path accepts, make exactly what litellm's own steps make (values, types and key order),
for every config the fast path uses; a litellm upgrade that changes them fails here."""

from __future__ import annotations

import copy
import itertools
import json
import os
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.provider.fast.messages import (
    pinned_request_transform,
    pinned_translations,
    plain_messages,
    scan_messages,
    splices_messages,
    translates_unchanged,
)
from proxy.provider.fast.surface import load

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
PARTS = load()
PINNED = pinned_translations(PARTS)
# (config, model, provider, api_base): an OpenAI-compatible server, OpenAI itself, Azure, Anthropic.
CONFIGS = {
    "openai-compatible": (PARTS["OpenAIGPTConfig"](), "scripted", "openai", "http://127.0.0.1:9/v1"),
    "openai": (PARTS["OpenAIGPTConfig"](), "gpt-4o", "openai", "https://api.openai.com/v1"),
    "azure": (PARTS["AzureOpenAIConfig"](), "gpt-4o", "azure", "https://x.openai.azure.com"),
    "anthropic": (PARTS["AnthropicConfig"](), "claude-3-5-sonnet-20240620", "anthropic", "https://api.anthropic.com"),
}

_TEXT = st.text(max_size=8)
_CALL = st.fixed_dictionaries(
    {"id": _TEXT, "type": st.just("function"), "function": st.fixed_dictionaries({"name": _TEXT, "arguments": _TEXT})}
)
_CONTENT = st.none() | _TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}), max_size=2)
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": _CONTENT},
    optional={
        "name": st.none() | _TEXT,
        "tool_calls": st.none() | st.lists(_CALL, max_size=2),
        "tool_call_id": st.none() | _TEXT,
        "refusal": st.none() | _TEXT,
    },
)


def _litellm_steps(messages: list[dict[str, Any]], name: str) -> list[Any]:
    """What ``Adapter.prepare`` ran before: litellm's three steps, on a copy (the first writes into it)."""
    config, model, provider, api_base = CONFIGS[name]
    fixed = PARTS["validate_and_fix_openai_messages"](messages=copy.deepcopy(messages))
    fixed = PARTS["get_completion_messages"](
        messages=fixed, ensure_alternating_roles=False, user_continue_message=None, assistant_continue_message=None
    )
    return list(
        config.translate_developer_role_to_system_role(
            messages=fixed, model=model, custom_llm_provider=provider, api_base=api_base, model_info={}
        )
    )


def _fast_steps(messages: list[dict[str, Any]], name: str) -> list[Any] | None:
    """What ``Adapter.prepare`` runs now: the one pass, and the translation only for a config not pinned."""
    config, model, provider, api_base = CONFIGS[name]
    plain = plain_messages(messages)
    if plain is None:
        return None
    if translates_unchanged(config, PINNED):
        return plain
    return list(
        config.translate_developer_role_to_system_role(
            messages=plain, model=model, custom_llm_provider=provider, api_base=api_base, model_info={}
        )
    )


@settings(max_examples=150, deadline=None)
@given(messages=st.lists(_MESSAGE, max_size=8), name=st.sampled_from(list(CONFIGS)))
def test_the_one_pass_makes_what_litellm_s_steps_make(messages: list[dict[str, Any]], name: str) -> None:
    assert scan_messages(messages) is not None  # what the fast path accepts, and nothing else
    before = copy.deepcopy(messages)
    fast = _fast_steps(messages, name)
    assert messages == before  # the one pass leaves the request's messages as they were
    if fast is None:  # two system messages in a row: litellm's steps decide
        assert any(a["role"] == b["role"] == "system" for a, b in itertools.pairwise(messages))
        return
    assert json.dumps(fast) == json.dumps(_litellm_steps(messages, name))
    # Copies, as litellm's are: the provider's transformation may rewrite them, never the request's.
    assert not {id(m) for m in messages} & {id(m) for m in fast}
    sent_calls = {id(call) for message in fast for call in message.get("tool_calls") or ()}
    assert not sent_calls & {id(call) for message in messages for call in message.get("tool_calls") or ()}


def test_the_pinned_translations_are_the_ones_the_fast_routes_meet() -> None:
    # OpenAI-compatible servers and Anthropic take the one pass whole; Azure overrides the translation.
    assert translates_unchanged(CONFIGS["openai"][0], PINNED)
    assert translates_unchanged(CONFIGS["anthropic"][0], PINNED)
    assert not translates_unchanged(CONFIGS["azure"][0], PINNED)


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi."}],
        [{"role": "system", "content": "A."}, {"role": "system", "content": "B."}, {"role": "user", "content": "C"}],
        [{"content": "no role"}],
    ],
)
def test_what_the_translation_could_change_goes_through_litellm(messages: list[dict[str, Any]]) -> None:
    assert plain_messages(messages) is None


# The request transformation, with and without the splice: the OpenAI configs the fast route meets.
_STRING_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": st.none() | _TEXT},
    optional={"name": _TEXT, "tool_calls": st.lists(_CALL, min_size=1, max_size=2), "tool_call_id": _TEXT},
)
_TOOL = {"type": "function", "function": {"name": "run", "description": "d", "parameters": {"type": "object"}}}
_OPTIONAL = st.fixed_dictionaries(
    {},
    optional={
        "max_tokens": st.integers(1, 64),
        "temperature": st.floats(0, 1),
        "tools": st.just([_TOOL]),
        "tool_choice": st.just("auto"),
        "user": _TEXT,
    },
)
PINNED_REQUEST = pinned_request_transform(PARTS)


def _request(name: str, messages: list[dict[str, Any]], optional: dict[str, Any], drop_params: bool) -> dict[str, Any]:
    config, model, provider, api_base = CONFIGS[name]
    litellm_params = PARTS["get_litellm_params"](
        api_key="sk-x", custom_llm_provider=provider, api_base=api_base, acompletion=True, drop_params=drop_params
    )
    return config.transform_request(
        model=model,
        messages=messages,
        optional_params=copy.deepcopy(optional),
        litellm_params=litellm_params,
        headers={},
    )


@settings(max_examples=150, deadline=None)
@given(
    messages=st.lists(_STRING_MESSAGE, min_size=1, max_size=8),
    optional=_OPTIONAL,
    name=st.sampled_from(["openai-compatible", "openai"]),
    drop_params=st.booleans(),
)
def test_a_spliced_request_is_the_one_the_config_builds_from_the_messages(
    messages: list[dict[str, Any]], optional: dict[str, Any], name: str, drop_params: bool
) -> None:
    import litellm

    plain = plain_messages(messages)
    if plain is None:
        return  # litellm's own steps: never spliced
    assert splices_messages(CONFIGS[name][0], PINNED_REQUEST, plain, litellm)
    built = _request(name, copy.deepcopy(plain), optional, drop_params)
    spliced = _request(name, [], optional, drop_params)
    spliced["messages"] = list(plain)
    assert orjson.dumps(spliced) == orjson.dumps(built)  # the same bytes, keys in the same order


def test_the_splice_is_refused_for_content_parts_another_config_and_system_messages_first() -> None:
    import litellm

    plain = plain_messages([{"role": "user", "content": "hi"}])
    parts = plain_messages([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert plain is not None and parts is not None
    assert splices_messages(CONFIGS["openai"][0], PINNED_REQUEST, plain, litellm)
    assert not splices_messages(CONFIGS["openai"][0], PINNED_REQUEST, parts, litellm)
    assert not splices_messages(CONFIGS["azure"][0], PINNED_REQUEST, plain, litellm)
    saved = litellm.openai_system_messages_first
    litellm.openai_system_messages_first = True
    try:
        assert not splices_messages(CONFIGS["openai"][0], PINNED_REQUEST, plain, litellm)
    finally:
        litellm.openai_system_messages_first = saved
