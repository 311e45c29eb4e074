"""What every fast route shares: the shape of a call it accepts, and the steps ``litellm.completion`` runs
for every provider before it hands the call to the provider's handler (main.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from proxy.kernel import jsonio
from proxy.provider.fast.messages import (
    MessageScan,
    copied_messages,
    litellm_copies,
    pinned_request_transform,
    pinned_translations,
    scan_messages,
    translates_unchanged,
)
from proxy.provider.pool import PooledClient

# Keys of a provider call every route understands; a route adds its own (Azure's ``api_version``).
ROUTE_KEYS = frozenset({"model", "messages", "api_base", "api_key", "timeout", "max_retries", "num_retries"})
_STREAM_KEYS = frozenset({"stream", "stream_options"})  # what a streamed call adds, on a route that streams
# ``stream: false``, which many clients send, asks for a whole answer; passed on to the parameter mapping as
# acompletion passes it (Azure's handler sends it, the others leave it out).
_UNSTREAMED_KEYS = frozenset({"stream"})
_TOOL_KEYS = frozenset({"type", "function"})
_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})


@dataclass
class Prepared:
    """A call after litellm's provider-independent steps: what the provider's handler receives."""

    model: str  # without the provider prefix (an Azure deployment name, say)
    provider: str
    api_base: str
    api_key: str
    messages: list[Any]
    optional: dict[str, Any]  # litellm's optional params, mapped for the provider
    config: Any  # the provider's chat config
    litellm_params: dict[str, Any]  # what completion() hands the provider's handler as litellm_params
    # The messages are the call's own (``MessageScan.sendable``), for a request that puts them in as they
    # are (``Adapter._splices``); otherwise they are copies, which a transformation may rewrite.
    spliced: bool = False


class Adapter:
    """One provider's way through the fast path: ``accepts`` says whether it would send exactly what
    acompletion sends, ``complete`` makes the call over the shared pool."""

    provider = ""  # litellm's custom_llm_provider, and the model prefix
    route_keys = ROUTE_KEYS
    params: tuple[str, ...] = ()  # the OpenAI parameters this route maps
    streams = False  # whether ``stream`` serves this route's streamed calls (``stream: true``)
    # Whether ``stream`` can leave a usage the caller did not ask for to the provider's own report (one
    # usage chunk, OpenAI's shape) rather than have litellm's wrapper rebuild the answer for it.
    reports_provider_usage = False

    def __init__(self, litellm: Any, parts: dict[str, Any]) -> None:
        self._litellm = litellm
        self._parts = parts
        self._pinned = pinned_translations(parts)
        self._pinned_request = pinned_request_transform(parts)

    def accepted(self, llm_input: dict[str, Any]) -> MessageScan | None:
        """The shape every route asks for, with the messages' scan (``scan_messages``: the rule for messages
        and what is sent of them, in one pass) for ``complete`` (or ``stream``, for a route that ``streams``);
        ``_accepts`` adds the provider's own conditions. ``None``: not a call this route takes."""
        model, api_base = llm_input.get("model"), llm_input.get("api_base")
        if not (isinstance(model, str) and model.startswith(f"{self.provider}/")):
            return None
        stream = llm_input.get("stream")
        if not (isinstance(api_base, str) and api_base) or (stream and not self.streams):
            return None
        keys = self.route_keys | frozenset(self.params) | (_STREAM_KEYS if stream is True else _UNSTREAMED_KEYS)
        if not set(llm_input) <= keys or not (stream is None or type(stream) is bool):
            return None
        options = llm_input.get("stream_options")
        if options is not None and not (stream is True and isinstance(options, dict)):
            return None
        if not isinstance(llm_input.get("api_key"), str) or not isinstance(llm_input.get("messages"), list):
            return None
        timeout = llm_input.get("timeout")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):  # a string or httpx.Timeout
            return None
        if self._litellm.proxy_auth is not None:  # litellm would add its headers to every call
            return None
        for name in (model, model.split("/", 1)[1]):
            if (self._litellm.model_cost.get(name) or {}).get("mode") == "responses":
                return None  # litellm bridges such models to the Responses API
        tools = llm_input.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(map(_plain_tool, tools))):
            return None
        scan = scan_messages(llm_input["messages"])
        return scan if scan is not None and self._accepts(llm_input) else None

    def _accepts(self, llm_input: dict[str, Any]) -> bool:
        raise NotImplementedError

    async def complete(self, client: PooledClient, llm_input: dict[str, Any], timeout: float, scan: MessageScan) -> Any:
        """One provider call of a shape ``accepted`` took (``scan``: what it made of the messages); returns
        litellm's ``ModelResponse`` or raises what acompletion raises."""
        raise NotImplementedError

    async def stream(
        self,
        client: PooledClient,
        llm_input: dict[str, Any],
        timeout: float,
        scan: MessageScan,
        *,
        usage_to_caller: bool = True,
    ) -> Any:
        """A streamed call of a shape ``accepted`` took, on a route that ``streams``: the stream opened, its
        chunks as litellm's stream wrapper yields them to acompletion's caller; or raises what acompletion
        raises. ``usage_to_caller=False`` (on a route that ``reports_provider_usage``): the usage ``llm_input``
        asks for is the proxy's own, so the chunks are those of a caller that did not ask for it, and the
        provider's usage stays in the wrapper's ``chunks`` (read there by ``LiteLLMBackend.stream``)."""
        raise NotImplementedError

    def prepare(self, llm_input: dict[str, Any], scan: MessageScan, **provider_params: Any) -> Prepared:
        """The steps ``litellm.completion`` runs for every provider, in its order (main.py): message, tool
        and ``stop`` validation, the provider, the developer role, the optional params. The message steps
        are ``scan``'s one pass where it made them (``fast/messages.py``), else litellm's own; for plain
        messages they cannot fail, so the provider's config is found before their copies are made."""
        p = self._parts
        params = {key: llm_input.get(key) for key in self.params}
        sendable = scan.sendable
        messages: list[Any] = []
        if sendable is None:
            messages = p["validate_and_fix_openai_messages"](messages=copied_messages(llm_input["messages"]))
        params["tools"] = p["validate_and_fix_openai_tools"](tools=params.get("tools"))
        params["tool_choice"] = p["validate_chat_completion_tool_choice"](
            tool_choice=params.get("tool_choice"), model=llm_input["model"]
        )
        params["stop"] = p["validate_openai_optional_params"](stop=params.get("stop"))
        if sendable is None:
            messages = p["get_completion_messages"](
                messages=messages,
                ensure_alternating_roles=False,
                user_continue_message=None,
                assistant_continue_message=None,
            )
        model, provider, dynamic_key, api_base = p["get_llm_provider"](
            model=llm_input["model"], api_base=llm_input["api_base"], api_key=llm_input["api_key"]
        )
        config = p["ProviderConfigManager"].get_provider_chat_config(model=model, provider=p["LlmProviders"](provider))
        untranslated = sendable is not None and translates_unchanged(config, self._pinned)
        spliced = False
        if sendable is not None:  # the call's own messages where they are only serialized, else copies
            spliced = untranslated and self._splices(config, sendable)
            messages = sendable if spliced else litellm_copies(sendable)
        if not untranslated:
            messages = list(
                config.translate_developer_role_to_system_role(
                    messages=messages, model=model, custom_llm_provider=provider, api_base=api_base, model_info={}
                )
            )
        optional = p["get_optional_params"](
            model=model,
            custom_llm_provider=provider,
            messages=messages,
            stream=llm_input.get("stream"),  # as acompletion passes it: ``stream: false`` is not left out
            **({"stream_options": llm_input["stream_options"]} if "stream_options" in llm_input else {}),
            max_retries=llm_input.get("num_retries", 0),
            **provider_params,
            **params,
        )
        api_key = dynamic_key or llm_input["api_key"]
        # The transformation reads some of these (the provider and api_base decide whether cache_control
        # marks are kept and how tool schemas are sanitized), so they are made as completion() makes them.
        litellm_params = p["get_litellm_params"](
            api_key=llm_input["api_key"],
            custom_llm_provider=provider,
            api_base=api_base,
            acompletion=True,
            model_alias_map=self._litellm.model_alias_map,
            api_version=provider_params.get("api_version"),
            max_retries=llm_input.get("max_retries"),
            timeout=llm_input.get("timeout"),
        )
        return Prepared(model, provider, api_base, api_key, messages, optional, config, litellm_params, spliced=spliced)

    def _splices(self, config: Any, sendable: list[dict[str, Any]]) -> bool:
        """Whether this route's request takes ``sendable`` as they are, only to serialize them (no route
        does unless it says so)."""
        return False

    def model_response(self, answer: dict[str, Any], headers: dict[str, str], **conversion: Any) -> Any:
        """An OpenAI-shaped answer as litellm's ``ModelResponse``, the way its OpenAI-SDK handlers convert it."""
        model_response = self.fresh_response()
        return self._parts["convert_to_model_response_object"](
            response_object=answer,
            model_response_object=model_response,
            hidden_params={"headers": headers},
            _response_headers=headers,
            **conversion,
        )

    def fresh_response(self) -> Any:
        """The empty ``ModelResponse`` ``completion()`` hands to every handler."""
        model_response = self._parts["ModelResponse"]()
        model_response.usage = self._litellm.Usage()
        return model_response

    def mapped(self, model: str, exc: Exception) -> Exception:
        """``exc`` as litellm's ``exception_type`` maps a failure of this provider's call."""
        try:
            mapped: Exception = self._parts["exception_type"](
                model=model,
                original_exception=exc,
                custom_llm_provider=self.provider,
                completion_kwargs={},
                extra_kwargs={},
            )
        except Exception as raised:  # exception_type raises its answer rather than returning it
            mapped = raised
        return mapped


async def post_json(
    client: PooledClient, url: str, data: Any, headers: dict[str, str], timeout: float, *, stream: bool = False
) -> httpx.Response:
    """``client.post(url, json=data, ...)`` as the pool sends it (``PooledClient.post_bytes``; ``stream``: a
    streamed call's POST, returning once the answer's head has arrived, its body unread), with the body
    encoded by orjson (``proxy.kernel.jsonio``) instead of the standard library: the same compact UTF-8 JSON
    httpx writes, in a fraction of the time (a 1,000-message history is megabytes, encoded on every call),
    and ``Content-Type`` added unless the provider's headers set it, as httpx adds it. Where the two could
    differ the request never gets here: the edge rejects ``NaN``/``Infinity`` (httpx refuses them, orjson
    writes ``null``) and replaces lone surrogates (which httpx cannot encode)."""
    if not any(name.lower() == "content-type" for name in headers):
        headers = {**headers, "Content-Type": "application/json"}
    # The pool leaves no cycle between the response and its stream (``PooledClient``): the request, megabytes
    # of body on a long history, goes with the response.
    return await client.post_bytes(url, jsonio.dumps(data), headers, timeout, stream=stream)


def chained(new: Exception, cause: BaseException) -> Exception:
    new.__cause__ = cause
    return new


def _plain_tool(tool: Any) -> bool:
    return (
        isinstance(tool, dict)
        and tool.get("type") == "function"
        and set(tool) <= _TOOL_KEYS
        and isinstance(tool.get("function"), dict)
        and set(tool["function"]) <= _FUNCTION_KEYS
    )
