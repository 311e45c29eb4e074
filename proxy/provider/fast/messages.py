"""litellm's provider-independent message steps, for the plain messages the fast path accepts, in one pass.

``completion()`` runs three steps over the messages before a provider's transformation sees them
(``Adapter.prepare`` runs them in its order): ``validate_and_fix_openai_messages`` (each message copied
without its ``None`` fields, its tool calls copied one by one), ``get_completion_messages`` (a copy of
the list, roles not forced to alternate) and the config's ``translate_developer_role_to_system_role``.
For the messages ``Adapter.accepted`` takes (roles system, user, assistant and tool, text content, function
calls: no developer message) the last one hands the list back unchanged, in the two implementations
pinned here (the base config's, which maps developer messages only, and OpenAI's, which also folds a run
of system messages into one for a model that declares it must, so a list with two system messages in a
row goes through litellm). A history of thousands of messages went through each of them on every call.

``tests/provider/test_fast_messages.py`` compares this with litellm's own steps over generated message
lists and fails when a litellm upgrade changes what they make of them, or moves the pinned methods.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The messages the fast path takes (``Adapter.accepted``): these roles and keys, text content, function calls.
_ROLES = frozenset({"system", "user", "assistant", "tool"})
_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "refusal"})


@dataclass(frozen=True, slots=True)
class MessageScan:
    """One pass over a call's messages, every one of them taken (``scan_messages``).

    ``sendable``: what litellm's message steps leave of them as JSON (each message as it is, or a copy
    without its ``None`` fields: the steps' copies serialize alike), for a request that only serializes
    them (``splices_messages``); ``None`` where the translation step could change them (two system
    messages in a row), which then go through litellm's steps.
    """

    sendable: list[dict[str, Any]] | None


def scan_messages(messages: Sequence[Any]) -> MessageScan | None:
    """The fast path's rule for messages, and what it sends of them, in one pass; ``None`` when some message
    is not taken: each must be a dict with a role but developer, only the keys above, text content (a
    string, ``None`` or text parts) and function calls. The messages are not changed, and a sendable
    message that is not a copy is one of them. A resent history is thousands of messages: one loop body
    per message, its checks inlined (no generator, no call per message)."""
    sendable: list[dict[str, Any]] = []
    append, roles, keys = sendable.append, _ROLES, _MESSAGE_KEYS
    previous, translatable = None, False
    for message in messages:
        if not isinstance(message, dict):
            return None
        role = message.get("role")
        if role not in roles or not message.keys() <= keys:  # keys() <= a set: no set of each message's keys
            return None
        content = message.get("content")
        if content is not None and type(content) is not str and not isinstance(content, str):
            if not isinstance(content, list):
                return None
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    return None
        calls = message.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                return None
            for call in calls:
                if not isinstance(call, dict) or call.get("type") != "function":
                    return None
        translatable = translatable or role == previous == "system"
        previous = role
        # Nearly every message has no None field: then the message itself, not a comprehension over it.
        append(message if None not in message.values() else {k: v for k, v in message.items() if v is not None})
    return MessageScan(None if translatable else sendable)


def plain_messages(messages: Sequence[Any]) -> list[dict[str, Any]] | None:
    """What ``validate_and_fix_openai_messages`` and ``get_completion_messages`` make of ``messages``, which
    the fast path takes (``scan_messages``); ``None`` where the translation step could change them (two
    system messages in a row) or the fast path does not take them. ``messages`` are not changed."""
    scan = scan_messages(messages)
    return None if scan is None or scan.sendable is None else litellm_copies(scan.sendable)


def litellm_copies(sendable: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """What litellm's message steps make of ``MessageScan.sendable``: a copy of each message, its tool calls
    copied one by one (``jsonify_tools``), for a provider's transformation, which may rewrite them."""
    out: list[dict[str, Any]] = []
    for message in sendable:
        fixed = message.copy()
        calls = fixed.get("tool_calls")
        if calls:
            fixed["tool_calls"] = [dict(call) for call in calls]
        out.append(fixed)
    return out


def copied_messages(messages: Sequence[Any]) -> list[Any]:
    """A shallow copy of each message, for litellm's own message steps: they write into the messages they
    are handed (their tool-call fixes do), and those are the session's (the assembly passes the history's
    messages on as they are, ``context/composer.py``)."""
    return [dict(m) if isinstance(m, dict) else m for m in messages]


def pinned_translations(parts: dict[str, Any]) -> frozenset[Any]:
    """The developer-role translations that leave the lists ``plain_messages`` returns as they are: the base
    config's and OpenAI's (``parts``: ``surface.load()``)."""
    return frozenset(parts[name].translate_developer_role_to_system_role for name in ("BaseConfig", "OpenAIGPTConfig"))


def translates_unchanged(config: Any, pinned: Collection[Any]) -> bool:
    """Whether ``config`` translates developer roles with one of the ``pinned`` implementations (a config
    that overrides it, Azure's or an o-series model's, goes through its own)."""
    return type(config).translate_developer_role_to_system_role in pinned


# The OpenAI config's request transformation (``transform_request``) walks the messages several times:
# system messages first (only under ``litellm.openai_system_messages_first``), tool-reference and media
# parts out of tool messages, user content parts rebuilt, cache marks renamed, stripped or capped. For
# the plain messages the fast path takes whose every content is a string or None, none of these passes
# has anything to change: each hands the messages on as they are, and the rest of the request does not
# depend on them. So the request is built with no messages and the messages put in its place
# (``splices_messages``), in these implementations only.
_SPLICED = (
    "transform_request",
    "_transform_messages",
    "_prompt_cache_ordered_messages",
    "_messages_and_tools_in_cache_mark_dialect",
    "remove_cache_control_flag_from_messages_and_tools",
)


def pinned_request_transform(parts: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The OpenAI config's request-transformation methods ``splices_messages`` is pinned to
    (``parts``: ``surface.load()``)."""
    return tuple((name, getattr(parts["OpenAIGPTConfig"], name)) for name in _SPLICED)


def splices_messages(
    config: Any, pinned: Sequence[tuple[str, Any]], messages: Sequence[Mapping[str, Any]], litellm: Any
) -> bool:
    """Whether ``config.transform_request`` can be given no messages and ``messages`` (plain ones, as
    ``plain_messages`` made them) put into its request as they are: the pinned implementations, litellm's
    system-first reordering off, and no content that is a list of parts."""
    if getattr(litellm, "openai_system_messages_first", True):
        return False
    kind = type(config)
    if not all(getattr(kind, name, None) is method for name, method in pinned):
        return False
    return all(type(message.get("content")) is not list for message in messages)
