"""The checkpoint summarizer: the compactor's ``Summarizer`` port, backed by a real model call.

The call goes through the same provider backend as every turn, to the model named by
``SCIENCE_AGENT_SUMMARY_MODEL`` (default: the request's model); on a route that speaks Responses it is
made in Responses and asks the provider not to store it (``summary_input``). Its failures, overflow
included, are raised to the compactor, which records them and keeps the deterministic trimming: a
summarizer overflow is handled within the compactor's bound, never by recursing into another compaction.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from proxy.kernel.config import ModelRoute
from proxy.kernel.errors import ProxyError
from proxy.provider.base import ProviderBackend
from proxy.provider.call_tag import summarizer_call
from proxy.runtime.trace import redact_llm_input


class ModelSummarizer:
    """Summarizes with one non-streaming call per attempt, recording each call for the trace."""

    def __init__(self, backend: ProviderBackend, route: ModelRoute) -> None:
        self._backend = backend
        self._route = route
        self.calls: list[dict[str, Any]] = []

    async def summarize(self, messages: Sequence[dict[str, Any]]) -> str:
        """The model's checkpoint text for the summarization ``messages``."""
        llm_input = summary_input(self._route, messages)
        # The trace shows what the provider call is made with: the backend's own arguments too.
        arguments = self._backend.provider_arguments(llm_input)
        record: dict[str, Any] = {"model": self._route.model_name, "llmInput": redact_llm_input(arguments)}
        self.calls.append(record)
        started = time.perf_counter()
        try:
            with summarizer_call():  # record and replay tag this call as the summarizer's
                response = await self._backend.complete(llm_input)
        except ProxyError as exc:
            record["error"] = exc.body()["error"]
            raise
        finally:
            record["providerMs"] = round((time.perf_counter() - started) * 1000, 3)
        if response.get("usage"):
            record["usage"] = response["usage"]  # billed like any call: the trace prices it
        content = response["choices"][0]["message"].get("content") or ""
        record["checkpointChars"] = len(content)
        return str(content)


def summary_input(route: ModelRoute, messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The summary call's arguments for litellm on ``route``: in the route's API where litellm would not
    choose it, and never stored by the provider."""
    llm_input = {**route.litellm_params, "messages": list(messages)}
    if route.api != "responses":
        return llm_input
    provider, slash, name = str(llm_input.get("model") or "").partition("/")
    if route.configured_api == "responses" and slash and provider == "openai" and not name.startswith("responses/"):
        # The operator said this provider speaks Responses (it may serve nothing else): litellm takes the
        # ``responses/`` prefix as the order to bridge the chat call there, as it does by itself for the
        # models its map lists as Responses-only.
        llm_input["model"] = f"openai/responses/{name}"
    # OpenAI stores a Responses call unless told not to; the transcript is the client's, and a client on
    # such a route (Codex) may have asked for ``store: false``. The proxy never reads the call back.
    llm_input["store"] = False
    return llm_input
