"""The proxy's own provider connections: one pooled ``httpx.AsyncClient`` per path that posts for itself
(the fast path, ``fast/``; native passage, ``native_transport.py``), on litellm's own transport.

Built as litellm's OpenAI route builds its client (``_get_async_http_client``): the transport
``AsyncHTTPHandler.create_async_transport`` makes with litellm's SSL settings (aiohttp's, unless the operator
disables it with ``DISABLE_AIOHTTP_TRANSPORT``, then httpx's), so a call connects, and fails to connect,
as acompletion's does. Redirects are not followed. httpx's own pool (httpcore, h11) cost an agent's
140 KB call a third more CPU: its pure-Python HTTP parsing, and a readability check of every pooled
connection on every request.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

import httpx


def litellm_client(parts: Mapping[str, Any]) -> httpx.AsyncClient:
    """A new pooled client on litellm's transport; ``parts``: the fast path's litellm surface
    (``fast/surface.py``: ``AsyncHTTPHandler``, ``get_ssl_configuration``)."""
    ssl_config = parts["get_ssl_configuration"]()
    transport = parts["AsyncHTTPHandler"].create_async_transport(
        ssl_context=ssl_config if isinstance(ssl_config, ssl.SSLContext) else None,
        ssl_verify=ssl_config if isinstance(ssl_config, bool) else None,
    )
    return httpx.AsyncClient(verify=ssl_config, transport=transport, follow_redirects=False)
