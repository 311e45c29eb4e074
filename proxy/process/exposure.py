"""Whether the proxy may serve an address without ``CONTEXT_PROXY_MASTER_KEY``.

Whoever reaches an unauthenticated proxy spends the operator's provider keys and reads every
session's transcript through the model. On loopback only local processes can, so the proxy serves
there with a warning; on any other address it refuses to start, unless the operator says that
something in front of it authenticates (``--allow-unauthenticated`` or
``CONTEXT_PROXY_ALLOW_UNAUTHENTICATED=1``).
"""

from __future__ import annotations

import ipaddress
import logging

from proxy.kernel.config import ConfigError, Settings

log = logging.getLogger("context_proxy")


def is_loopback(host: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1 (also written ``[::1]`` or as an IPv4-mapped address)."""
    name = host.strip().strip("[]").rstrip(".").lower()
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False  # another host name: it may resolve to anything, so it counts as exposed
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def check_exposure(settings: Settings, host: str, allow_unauthenticated: bool) -> None:
    """Refuse (``ConfigError``) to serve a non-loopback ``host`` without a master key unless allowed;
    log a warning whenever the proxy serves without one."""
    if settings.master_key is not None:
        return
    if is_loopback(host):
        log.warning("serving on %s without CONTEXT_PROXY_MASTER_KEY: any local process can use the provider keys", host)
        return
    if allow_unauthenticated or settings.allow_unauthenticated:
        log.warning(
            "serving on %s WITHOUT authentication (--allow-unauthenticated): whoever reaches this address "
            "can use the provider keys",
            host,
        )
        return
    raise ConfigError(
        f"--host {host} is not a loopback address and CONTEXT_PROXY_MASTER_KEY is not set: anyone who can reach "
        "it could use the provider keys. Set CONTEXT_PROXY_MASTER_KEY (clients send it as Authorization: Bearer "
        "<key> or x-api-key), serve on 127.0.0.1, or pass --allow-unauthenticated "
        "(CONTEXT_PROXY_ALLOW_UNAUTHENTICATED=1) if something in front of the proxy authenticates."
    )
