"""Everything litellm-internal the fast path relies on, in one list.

A unit test imports each name (``tests/provider/test_fast_path.py``), so a litellm upgrade that
moves or renames one fails loudly there instead of in a provider call.
"""

from __future__ import annotations

import importlib
from typing import Any

# By module and attribute; the routes read them from ``load()``'s answer, never by importing litellm.
LITELLM_SURFACE: dict[str, tuple[str, ...]] = {
    "litellm.utils": (
        "ProviderConfigManager",
        "get_optional_params",
        "validate_and_fix_openai_messages",
        "validate_and_fix_openai_tools",
        "validate_chat_completion_tool_choice",
        "validate_openai_optional_params",
    ),
    "litellm.types.utils": ("LlmProviders", "ModelResponse"),
    "litellm.litellm_core_utils.get_llm_provider_logic": ("get_llm_provider",),
    "litellm.litellm_core_utils.get_litellm_params": ("get_litellm_params",),
    "litellm.litellm_core_utils.prompt_templates.common_utils": ("get_completion_messages",),
    "litellm.litellm_core_utils.llm_response_utils.convert_dict_to_response": ("convert_to_model_response_object",),
    "litellm.litellm_core_utils.exception_mapping_utils": ("exception_type",),
    "litellm.litellm_core_utils.url_utils": ("ensure_api_route",),
    "litellm.llms.openai.common_utils": (
        "OpenAIError",
        "build_output_token_limit_response",
        "is_output_token_limit_error",
        "upstream_error_response",
    ),
    "litellm.llms.azure.common_utils": ("AzureOpenAIError",),
    "litellm.llms.azure.chat.gpt_transformation": ("AzureOpenAIConfig",),
    "litellm.llms.openai.chat.gpt_transformation": ("OpenAIGPTConfig",),
    "litellm.llms.base_llm.chat.transformation": ("BaseConfig",),
    "litellm.llms.anthropic.chat.transformation": ("ANTHROPIC_TOOL_NAME_REVERSE_MAP_KEY", "AnthropicConfig"),
    "litellm.llms.anthropic.common_utils": ("AnthropicError", "process_anthropic_headers"),
    # the connection pool: litellm's own transport (aiohttp unless disabled) and SSL settings, as the
    # OpenAI route's ``_get_async_http_client`` builds them (``pool.py``: for the fast path, native passage,
    # and the SDK routes' client, which also takes litellm's proxy mounts and HTTP/2 setting)
    "litellm.llms.custom_httpx.http_handler": (
        "AsyncHTTPHandler",
        "MaskedHTTPStatusError",
        "get_ssl_configuration",
        "http2_enabled",
    ),
    "litellm.anthropic_beta_headers_manager": ("update_request_with_filtered_beta",),
    "litellm.anthropic_beta_gated_fields": ("strip_beta_gated_request_body",),
    # streams (``streaming.py``): the OpenAI handler's stream options, litellm's stream wrapper, and
    # Anthropic's SSE reading (its handler's chunk iterator over litellm's SSE line splitter)
    "litellm.llms.openai.openai": ("OpenAIChatCompletion",),
    "litellm.litellm_core_utils.streaming_handler": ("CustomStreamWrapper",),
    "litellm": ("stream_chunk_builder",),  # the wrapper's end-of-stream step, run in the stream's task
    "litellm.llms.anthropic.chat.handler": ("ModelResponseIterator",),
    "litellm.llms.custom_httpx.sse_lines": ("aiter_sse_lines",),
}


def load() -> dict[str, Any]:
    """Each name in ``LITELLM_SURFACE``, loaded."""
    return {
        name: getattr(importlib.import_module(module), name)
        for module, names in LITELLM_SURFACE.items()
        for name in names
    }
