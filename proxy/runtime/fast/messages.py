"""litellm's provider-independent message steps, for the plain messages the fast path accepts, in one pass.

``completion()`` runs three steps over the messages before a provider's transformation sees them
(``Route.prepare`` runs them in its order): ``validate_and_fix_openai_messages`` (each message copied
without its ``None`` fields, its tool calls copied one by one), ``get_completion_messages`` (a copy of
the list, roles not forced to alternate) and the config's ``translate_developer_role_to_system_role``.
For the messages ``Route.accepts`` takes (roles system, user, assistant and tool, text content, function
calls: no developer message) the last one hands the list back unchanged, in the two implementations
pinned here (the base config's, which maps developer messages only, and OpenAI's, which also folds a run
of system messages into one for a model that declares it must, so a list with two system messages in a
row goes through litellm). A history of thousands of messages went through each of them on every call.

``tests/runtime/test_fast_messages.py`` compares this with litellm's own steps over generated message
lists and fails when a litellm upgrade changes what they make of them, or moves the pinned methods.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any


def plain_messages(messages: Sequence[Any]) -> list[dict[str, Any]] | None:
    """What ``validate_and_fix_openai_messages`` and ``get_completion_messages`` make of ``messages``, which
    ``Route.accepts`` took; ``None`` where the translation step could change them (a developer message, two
    system messages in a row), which then goes through litellm's steps. ``messages`` are not changed (litellm
    writes the copied tool calls back into them: the values are the same)."""
    out: list[dict[str, Any]] = []
    previous = None
    for message in messages:
        role = message.get("role")
        if not role or role == "developer" or (role == previous == "system"):
            return None
        previous = role
        # Nearly every message has no None field: then a C-speed copy, not a comprehension over its fields.
        if None in message.values():
            fixed = {key: value for key, value in message.items() if value is not None}
        else:
            fixed = message.copy()
        calls = fixed.get("tool_calls")
        if calls:
            fixed["tool_calls"] = [dict(call) for call in calls]  # jsonify_tools: a copy of each dict
        out.append(fixed)
    return out


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
