"""The hidden call-local message format: ``<context ...>body</context>`` in a user message.

Contributor messages and attachments reach the model as user messages such as
``<context source="plan" authority="data_only" trust="trusted_data" id="plan.state" nonce="…">...</context>``.
``nonce`` is the session's framing nonce (``proxy/context/nonce.py``): a tool output or a user message
may imitate the wrapper, but not with the nonce it has never seen. The body is escaped so that
untrusted data can never close its wrapper or open a forged one: ``&``, ``<`` and ``>`` become
``&amp;``, ``&lt;`` and ``&gt;`` (reversible with :func:`unescape_body`).
"""

from __future__ import annotations

import re
from typing import Any

from proxy.context.nonce import NONCE_PATTERN
from proxy.context.types import ID_PATTERN, Attachment, ContextMessage, Trust

OPEN_PREFIX = "<context "
CLOSE = "</context>"
AUTHORITY = "data_only"
# The whole-message shape the validator accepts: one wrapper, attributes from a fixed grammar, and a
# body without any raw '<' (so no nested or forged tag can hide inside).
HIDDEN_MESSAGE = re.compile(
    rf'<context source="(?P<source>{ID_PATTERN})" authority="{AUTHORITY}" '
    rf'trust="(?P<trust>trusted_data|untrusted_data)" id="(?P<id>{ID_PATTERN})" nonce="(?P<nonce>{NONCE_PATTERN})">'
    rf"(?P<body>[^<]*)</context>",
    re.DOTALL,
)


def escape_body(text: str) -> str:
    """Escape ``&``, ``<`` and ``>`` so the text cannot contain markup."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def unescape_body(text: str) -> str:
    """Inverse of :func:`escape_body`."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def wrap(source: str, trust: Trust, item_id: str, body: str, *, nonce: str) -> str:
    """The hidden message content for one item, under the session's framing ``nonce``; ``body`` is escaped."""
    attrs = f'source="{source}" authority="{AUTHORITY}" trust="{trust}" id="{item_id}" nonce="{nonce}"'
    return f"{OPEN_PREFIX}{attrs}>\n{escape_body(body)}\n{CLOSE}"


def hidden_message(item: ContextMessage | Attachment, *, nonce: str) -> dict[str, Any]:
    """The user message carrying a contributor message or an attachment.

    A contributor's own message is trusted data (it comes from a registered package); an attachment
    carries the trust its contributor declared.
    """
    trust: Trust = item.trust if isinstance(item, Attachment) else "trusted_data"
    return {"role": "user", "content": wrap(item.source, trust, item.id, item.content, nonce=nonce)}


def is_hidden_message(message: dict[str, Any], nonce: str) -> bool:
    """True for a well-formed hidden message (role user, exact wrapper grammar) carrying ``nonce``."""
    content = message.get("content")
    if message.get("role") != "user" or not isinstance(content, str):
        return False
    match = HIDDEN_MESSAGE.fullmatch(content)
    return match is not None and match["nonce"] == nonce
