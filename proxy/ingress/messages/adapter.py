"""The Anthropic Messages ingress: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

A request is validated, translated into the canonical chat body (``messages_request``), checked by the
chat path's own rules (tool pairing), and run by the same ``TurnRunner`` as ``/v1/chat/completions``;
the answer is translated back (``messages_response``, ``messages_stream``). Every error, the proxy's
and the provider's, is rendered in Anthropic's shape by the caller through ``messages_errors``.

``count_tokens`` answers with the proxy's estimator over the translated request (its chat messages and
tools), the same estimator the assembly budgets with. It does not run the assembly: that reconciles
the session in the store and may call the model to write a checkpoint, neither of which a count may do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import Response, StreamingResponse

from proxy.context.types import TokenEstimator
from proxy.ingress.chat.wire import parse_chat_request
from proxy.ingress.identify import identify
from proxy.ingress.messages.errors import error_body, prompt_too_long
from proxy.ingress.messages.request import Translation, to_chat
from proxy.ingress.messages.response import to_message
from proxy.ingress.messages.stream import message_events
from proxy.ingress.messages.wire import parse_count_tokens_request, parse_messages_request
from proxy.kernel.config import Mode, ModelRoute, Settings
from proxy.kernel.errors import AssemblyFailed, ContextOverflow, ModelNotFound, ProxyError
from proxy.kernel.jsonio import JSONAnswer
from proxy.runtime.answers import Completion
from proxy.runtime.service import TurnRunner


async def create_message(
    body: Any, headers: Mapping[str, str], settings: Settings, runner: TurnRunner, mode: Mode
) -> Response:
    """Serve one Messages request; raises ``ProxyError`` (rendered in Anthropic's shape by the caller)."""
    request = parse_messages_request(body)
    route = _route(settings, request.model)
    translation = to_chat(request, body, route, headers)
    parse_chat_request(translation.body)  # the chat path's own checks: tool results answer their calls
    identity = identify(headers, translation.body)
    try:
        result = await runner.run(translation.body, identity, route, headers, mode, ingress=translation.notes)
    except (ContextOverflow, AssemblyFailed) as exc:
        limits = runner.limits_for(route)
        # The proxy's own assembly failing is measured against the window it assembles for (the operator's
        # cap included), not the model's: Claude Code shows both numbers to the user.
        limit = limits.effective_input_tokens if isinstance(exc, AssemblyFailed) else limits.model_max_tokens
        error = prompt_too_long(exc, limit, await _estimate(runner, route, translation))
        error.headers.update({"x-context-id": identity.context_id, "x-context-mode": mode})
        raise error from exc
    except ProxyError as exc:
        exc.headers.update({"x-context-id": identity.context_id, "x-context-mode": mode})
        raise
    if isinstance(result.answer, Completion):
        return JSONAnswer(to_message(result.answer.response, request.model), headers=result.headers)
    events = message_events(result.answer, request.model, error_body, await _estimate(runner, route, translation))
    return StreamingResponse(events, media_type="text/event-stream", headers=result.headers)


async def count_tokens(body: Any, headers: Mapping[str, str], settings: Settings, runner: TurnRunner) -> Response:
    """``{"input_tokens": N}``: the proxy's estimate of the translated request, with the route's estimator."""
    request = parse_count_tokens_request(body)
    route = _route(settings, request.model)
    translation = to_chat(request, body, route, headers)
    parse_chat_request({**translation.body, "max_tokens": 1})
    return JSONAnswer({"input_tokens": await _estimate(runner, route, translation)})


async def _estimate(runner: TurnRunner, route: ModelRoute, translation: Translation) -> int:
    # The route's calibrated estimator (or the one SCIENCE_AGENT_CONTEXT_ESTIMATOR names), as the
    # assembly budgets with: a client that plans with this count then agrees with the proxy's pressure.
    accounting = await runner.calibrator.accounting(route)
    return estimate_tokens(translation, accounting.estimator)


def estimate_tokens(translation: Translation, estimator: TokenEstimator) -> int:
    """The estimator's count of the translated messages and tools."""
    total = sum(estimator.count_message(message) for message in translation.body["messages"])
    return total + estimator.count_tools(translation.body.get("tools") or [])


def _route(settings: Settings, model: str) -> ModelRoute:
    route = settings.route(model)
    if route is None:
        raise ModelNotFound(f"model: {model}", param="model")
    return route
