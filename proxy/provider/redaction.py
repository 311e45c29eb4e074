"""Credentials removed from what a trace records of a provider call.

``litellm.acompletion`` accepts credentials under many names: ``api_key``, ``client_secret``,
``azure_ad_token``, ``aws_secret_access_key``, ``aws_session_token``, ``vertex_credentials``,
``watsonx_token``, headers, and the same again inside ``extra_body`` or a URL
(``https://user:pass@host``, ``?api-key=...``). A list of today's names goes stale with the next
litellm release, so names are judged by their parts: every provider-prefixed parameter (``aws_*``,
``azure_*``, ``vertex_*``, ``watsonx_*``) and every name with a credential word in it is dropped, at any
depth outside the conversation itself. URL strings keep their host and path, not their secrets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# The conversation and tool schemas are what the trace is for; a tool parameter named "api_key"
# there is data, not a credential.
_CONTENT_KEYS = frozenset({"messages", "tools", "functions", "tool_choice", "response_format", "prediction"})
_PROVIDER_PREFIXES = ("aws_", "azure_", "vertex_", "watsonx_")
_CREDENTIAL_WORDS = frozenset(
    {
        "key",
        "apikey",
        "secret",
        "token",
        "password",
        "passwd",
        "credential",
        "credentials",
        "auth",
        "authorization",
        "cookie",
        "cookies",
        "headers",
        "signature",
        "sig",
        "jwt",
        "bearer",
    }
)
_CREDENTIAL_PARTS = ("secret", "passw", "apikey", "api_key", "api-key", "credential", "cookie")
_NOT_CREDENTIALS = frozenset({"prompt_cache_key"})  # OpenAI's cache routing hint: shown, not secret
_WORD = re.compile(r"[a-z0-9]+")
REDACTED = "***"
# Header names that carry credentials (the proxy's master key, a provider key a client forwards,
# cookies): neither contributors (plugins, possibly third-party) nor recordings ever see them. Matched as parts of
# the lower-cased name, so vendor variants (x-goog-api-key, x-amz-security-token) are covered too.
_CREDENTIAL_HEADER_PARTS = (
    "auth",
    "cookie",
    "api-key",
    "apikey",
    "api_key",
    "token",
    "secret",
    "password",
    "credential",
)


def redact_llm_input(llm_input: Mapping[str, Any]) -> dict[str, Any]:
    """``llm_input`` without credentials: what a trace may show of the provider call."""
    return {
        key: value if key in _CONTENT_KEYS else _redact(value)
        for key, value in llm_input.items()
        if not is_credential_name(key)
    }


def is_credential_name(name: object) -> bool:
    """Whether a parameter, header or query-parameter name may carry a credential."""
    if not isinstance(name, str):
        return False
    lowered = name.lower()
    if lowered in _NOT_CREDENTIALS:
        return False
    if lowered.startswith(_PROVIDER_PREFIXES) or any(part in lowered for part in _CREDENTIAL_PARTS):
        return True
    # Whole words, so that max_tokens or top_k stay: "tokens" is a count, "token" a credential.
    return any(word in _CREDENTIAL_WORDS or word.endswith("token") for word in _WORD.findall(lowered))


def _redact(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _redact(item) for key, item in value.items() if not is_credential_name(key)}
    if isinstance(value, list | tuple):
        return [_redact(item) for item in value]
    if isinstance(value, str):
        return redact_url(value)
    return value


def redact_url(text: str) -> str:
    """``text`` with the user info and credential query values of a URL masked; other text as is."""
    if "://" not in text:
        return text
    try:
        parts = urlsplit(text.strip())
    except ValueError:
        return REDACTED  # looks like a URL but does not parse: show nothing rather than a secret
    if not parts.scheme or not parts.netloc:
        return text
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    return urlunsplit((parts.scheme, netloc, parts.path, _masked_pairs(parts.query), _masked_pairs(parts.fragment)))


def _masked_pairs(text: str) -> str:
    """A query (or an OAuth-style fragment) with the values of credential parameters masked."""
    if "=" not in text:
        return text
    pairs = parse_qsl(text, keep_blank_values=True)
    if not any(is_credential_name(name) for name, _ in pairs):
        return text
    return urlencode([(name, REDACTED if is_credential_name(name) else item) for name, item in pairs], safe="*")


# One search per header name (every turn's headers are filtered for its contributors).
_CREDENTIAL_HEADER = re.compile("|".join(map(re.escape, _CREDENTIAL_HEADER_PARTS)))


def without_credentials(headers: Mapping[str, str]) -> dict[str, str]:
    """The request's headers without those carrying credentials: what a contributor sees and a recording keeps."""
    return {name: value for name, value in headers.items() if not _CREDENTIAL_HEADER.search(name.lower())}
