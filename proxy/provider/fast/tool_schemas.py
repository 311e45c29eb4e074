"""litellm's sanitizing of tool schemas for OpenAI-compatible servers, remembered.

``OpenAIGPTConfig.transform_request`` walks every tool's JSON schema on every call (it drops ``pattern``
regexes Python cannot compile and, for api.openai.com, flattens combinators): a third of a millisecond
for an agent's two dozen tools, which are byte-identical on every call of every session of that agent.
``remember_sanitized_tools`` puts a memo in front of that step on the one config instance a call builds
its body with (litellm makes a new one per call, so nothing else sees it): the first call with a given
list of tools runs litellm's own step, later ones get its answer again, as litellm gives it: a new list
holding the call's own tool where litellm left a tool as it was (its step returns the very object then,
and nearly every tool is left so), and a fresh copy of litellm's rewrite where it changed one (the body it
goes into is the call's: a trace keeps it). Copying every tool on every call (decoding the remembered
answer whole) cost half of what the memo saved. The answer depends on the tools, the provider and the
api_base (litellm's own arguments), so those key it; an answer of another shape (no ``tools`` list of
the same length: litellm's nothing-to-update for another provider) is not remembered, and a litellm that
no longer has the step keeps its plain transformation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import orjson

from proxy.kernel.canonical import memo_digest

_STEP = "_sanitized_tools_update_for_openai"
_KEPT = 64  # distinct tool lists remembered (an agent has one or a few)
Update = Callable[[Mapping[str, object], Mapping[str, object]], Mapping[str, object]]


class SanitizedTools:
    """The memo, shared by every call of one fast route."""

    def __init__(self) -> None:
        # per tool of a list: None where litellm left it as it was, else the JSON of its rewrite
        self._answers: dict[tuple[bytes, Any, Any, type], tuple[bytes | None, ...]] = {}

    def remember_on(self, config: Any) -> None:
        """Put the memo in front of ``config``'s own sanitizing step (this instance only)."""
        step = getattr(config, _STEP, None)
        if callable(step):
            setattr(config, _STEP, self._remembered(step, type(config)))

    def _remembered(self, step: Update, config_type: type) -> Update:
        def update(optional_params: Mapping[str, object], litellm_params: Mapping[str, object]) -> Mapping[str, object]:
            tools = optional_params.get("tools")
            if not isinstance(tools, list) or not tools:
                return step(optional_params, litellm_params)
            try:
                schema = orjson.dumps(tools)
            except TypeError:  # not JSON (never from a request): litellm's step as it is
                return step(optional_params, litellm_params)
            key = (
                memo_digest(schema),
                litellm_params.get("custom_llm_provider"),
                litellm_params.get("api_base"),
                config_type,
            )
            known = self._answers.get(key)
            if known is None:
                answer = step(optional_params, litellm_params)
                remembered = _per_tool(answer, tools)
                if remembered is not None:
                    if len(self._answers) >= _KEPT:
                        self._answers.pop(next(iter(self._answers)))
                    self._answers[key] = remembered
                return answer
            return MappingProxyType(
                {"tools": [tool if new is None else orjson.loads(new) for tool, new in zip(tools, known, strict=True)]}
            )

        return update


def _per_tool(answer: Mapping[str, object], tools: list[Any]) -> tuple[bytes | None, ...] | None:
    """What to remember of litellm's ``answer`` for ``tools``, or ``None`` when it is not a list of as many
    tools (or not JSON)."""
    sanitized = answer.get("tools")
    if set(answer) != {"tools"} or not isinstance(sanitized, list) or len(sanitized) != len(tools):
        return None
    try:
        return tuple(None if new is old else orjson.dumps(new) for new, old in zip(sanitized, tools, strict=True))
    except TypeError:
        return None
