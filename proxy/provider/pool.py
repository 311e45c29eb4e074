"""The proxy's own provider connections: one pooled ``httpx.AsyncClient`` per path that posts for itself
(the fast path, ``fast/``; native passage, ``native_transport.py``), on litellm's own transport.

Built as litellm's OpenAI route builds its client (``_get_async_http_client``): the transport
``AsyncHTTPHandler.create_async_transport`` makes with litellm's SSL settings (aiohttp's, unless the operator
disables it with ``DISABLE_AIOHTTP_TRANSPORT``, then httpx's), so a call connects, and fails to connect,
as acompletion's does. Redirects are not followed. httpx's own pool (httpcore, h11) cost an agent's
140 KB call a third more CPU: its pure-Python HTTP parsing, and a readability check of every pooled
connection on every request.

The client keeps no cookies. Every team's calls share it, and a cookie jar would send what a provider set
on one call (a load balancer's affinity, the login session of a gateway in front of a self-hosted model)
with every later call to that host, another team's and another route's included. A call carries its own
route's credentials and headers, nothing an earlier call left behind. litellm's own shared HTTP handler
refuses them the same way (``blocked_cookie_jar``); the policy is the standard library's, so it holds
whichever litellm is installed.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from http.cookiejar import CookieJar, DefaultCookiePolicy
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
    keeps_none = CookieJar(DefaultCookiePolicy(allowed_domains=[]))  # refuses every Set-Cookie (module docstring)
    return httpx.AsyncClient(verify=ssl_config, transport=transport, follow_redirects=False, cookies=keeps_none)
