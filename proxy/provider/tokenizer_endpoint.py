"""A server's own tokenizer endpoint: how many tokens the server makes of a text.

Local servers that send no ``usage`` on a stream (llama-cpp-python ignores ``stream_options``) still say
how they tokenize: llama-cpp-python at ``/extras/tokenize`` (``{"input": ...}`` -> ``{"tokens": [...]}``),
llama.cpp's own server at ``/tokenize`` (``{"content": ...}`` -> ``{"tokens": [...]}``). The body carries
both spellings, so one route option (``tokenizer_url``) serves either. A failure is ``None``: a count that
cannot be had teaches nothing and must never fail the answer it was asked for.
"""

from __future__ import annotations

import logging

import httpx

logger = logging.getLogger(__name__)

TOKENIZE_TIMEOUT_SECONDS = 10.0


async def server_token_count(url: str, text: str, model: str | None = None) -> int | None:
    """The number of tokens the server at ``url`` makes of ``text``; ``None`` when it cannot say."""
    body: dict[str, object] = {"input": text, "content": text, "add_special": False}
    if model:
        body["model"] = model
    try:
        async with httpx.AsyncClient(timeout=TOKENIZE_TIMEOUT_SECONDS) as client:
            response = await client.post(url, json=body)
        response.raise_for_status()
        answer = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        logger.warning("the tokenizer endpoint %s did not count (%s)", url, exc)
        return None
    count = answer.get("count") if isinstance(answer, dict) else None
    if count is None and isinstance(answer, dict) and isinstance(answer.get("tokens"), list):
        count = len(answer["tokens"])
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None
