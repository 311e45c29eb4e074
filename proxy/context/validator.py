"""``ContextValidator``: the last check of a composed model input before it reaches the provider.

It re-checks what the earlier stages promise (roles, tool pairing, the limit, hidden-message markers
carrying the session's framing nonce, no contributor-made assistant or tool messages) and reports
every problem at once.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.context.composer import ComposedContext
from proxy.context.hidden import HIDDEN_MESSAGE
from proxy.context.shortfall import ContextDoesNotFit, Shortfall
from proxy.context.turn_estimator import counts_of
from proxy.context.types import TokenEstimator
from proxy.context.units import RESULT_ROLES, call_ids
from proxy.kernel.errors import AssemblyFailed

VALID_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class ContextValidator:
    """Raises AssemblyFailed listing every problem of a composed input; returns its token estimate."""

    def validate(
        self,
        composed: ComposedContext,
        *,
        limit_tokens: int,
        estimator: TokenEstimator,
        nonce: str,
        tools: Sequence[Mapping[str, Any]] = (),
        require_user: bool = True,
    ) -> int:
        """Check ``composed`` (plus ``tools``) against the protocol, the session's framing ``nonce`` and
        ``limit_tokens``; return the estimate.

        ``require_user``: the history had a user message (the task anchor), so the input must still hold
        one. OpenAI accepts a conversation without any (a system prompt alone, an assistant prefill), so a
        request that never had one is not refused for it."""
        messages = composed.messages
        problems = _protocol_problems(messages, require_user)
        problems += _hidden_problems(composed, nonce)
        total = sum(counts_of(estimator, messages)) + (estimator.count_tools(tools) if tools else 0)
        if total > limit_tokens:
            problems.append(f"estimated {total} tokens, over the limit of {limit_tokens}")
        if not problems:
            return total
        message = "invalid model input: " + "; ".join(problems)
        if total > limit_tokens:
            raise ContextDoesNotFit(message, Shortfall("input_limit", total, limit_tokens))
        raise AssemblyFailed(message)


def _protocol_problems(messages: Sequence[Mapping[str, Any]], require_user: bool) -> list[str]:
    """The roles and tool-call fields, then the pairing (every call answered right after it, exactly once,
    no result without its call), in one walk: the composed input of a long run is hundreds of messages."""
    roles: list[str] = ["no messages"] if not messages else []
    pairing: list[str] = []
    pending: list[str] = []
    pending_at = -1
    users = 0
    valid, results = VALID_ROLES, RESULT_ROLES
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in valid:
            roles.append(f"message {i} has invalid role {role!r}")
        if "tool_calls" in message and (message.get("tool_calls") == [] or role != "assistant"):
            # OpenAI rejects tool_calls: [] and tool calls on any role but assistant.
            roles.append(f"message {i} ({role}) has invalid tool_calls")
        if role in results:
            rid = "function_call" if role == "function" else str(message.get("tool_call_id", ""))
            if rid in pending:
                pending.remove(rid)
            else:
                pairing.append(f"message {i}: tool result {rid!r} has no matching call right before it")
            continue
        if role == "user":
            users += 1
        if pending:
            pairing.append(f"message {pending_at}: tool calls {pending} have no results")
        # Only a message with calls has call ids (``call_ids``): the others skip the call and its set.
        if role == "assistant" and (message.get("tool_calls") or message.get("function_call")):
            pending = call_ids(message)
            if len(set(pending)) != len(pending):
                pairing.append(f"message {i}: duplicate tool call ids")
        else:
            pending = []
        pending_at = i
    if pending:
        pairing.append(
            f"message {pending_at}: tool calls {pending} have no results (an unfinished call cannot be sent)"
        )
    if require_user and messages and not users:
        roles.append("no user message")
    return roles + pairing


def _hidden_problems(composed: ComposedContext, nonce: str) -> list[str]:
    problems: list[str] = []
    for i in composed.hidden_indices:
        if not 0 <= i < len(composed.messages):
            problems.append(f"hidden message index {i} out of range")
            continue
        message = composed.messages[i]
        if message.get("role") != "user" or any(
            message.get(k) for k in ("tool_calls", "tool_call_id", "function_call")
        ):
            problems.append(f"message {i}: contributor message is not a plain user message")
            continue
        content = message.get("content")
        match = HIDDEN_MESSAGE.fullmatch(content) if isinstance(content, str) else None
        if match is None:
            problems.append(f"message {i}: malformed hidden context marker")
        elif not hmac.compare_digest(match["nonce"], nonce):
            problems.append(f"message {i}: hidden context marker does not carry the session's framing nonce")
    return problems
