"""What an empty stream means: an overflow the server would not name, or a failure to explain.

A server that accepts a streamed request with HTTP 200 and ends the stream without a chunk, usage or error
(``EmptyStream``) has said nothing about why. llama-cpp-python's server does exactly this for a streamed
prompt over its ``n_ctx``: the error is raised inside the stream, after the headers went out. So an empty
stream is taken for an overflow, and gets the one forced-compaction retry, only when the request could
have been one: what was sent plus the output it asked for fills ``OVERFLOW_FILL`` of the window or more
(the share ``OverflowHints`` also reads a local server's weak words at). Well under the window it is not
an overflow, and the client gets an error that says what happened and what to check, never a bare 502.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.kernel.errors import ContextOverflow, EmptyStream, ProxyError
from proxy.runtime.limits import ModelLimits

# The estimate may be short by the tokenizer's difference; at this fill an overflow is plausible.
OVERFLOW_FILL = 0.9


def requested_output(llm_input: Mapping[str, Any]) -> int:
    """The answer tokens the call asked for (``max_completion_tokens`` or ``max_tokens``), else 0."""
    requested = llm_input.get("max_completion_tokens") or llm_input.get("max_tokens")
    return requested if isinstance(requested, int) and not isinstance(requested, bool) else 0


def judge_empty_stream(empty: EmptyStream, sent_tokens: int, output_tokens: int, limits: ModelLimits) -> ProxyError:
    """The error an empty stream becomes: ``ContextOverflow`` (with ``sent_tokens``) when the request
    filled the window enough to have overflowed it, else ``empty`` with its cause spelled out."""
    window = limits.model_max_tokens
    needed = sent_tokens + output_tokens
    if needed >= OVERFLOW_FILL * window:
        explained = (
            f"The provider ended the streamed answer without any content (an empty stream) for a request of "
            f"about {sent_tokens} tokens plus {output_tokens} for the answer, {needed / window:.0%} of the "
            f"{window}-token window: taken for an overflow the server did not name."
        )
        overflow = ContextOverflow(explained, provider_message=explained)
        overflow.sent_tokens = sent_tokens
        return overflow
    return EmptyStream(
        f"The provider accepted the streamed request and ended the stream without any choice content, usage "
        f"or error (an empty stream). The request was about {sent_tokens} tokens plus {output_tokens} for the "
        f"answer, {needed / window:.0%} of the route's {window}-token window, so it is not taken for an "
        "overflow. Some servers (llama-cpp-python) answer a prompt over their real context this way: check "
        "the route's max_input_tokens against the server's context size (llama.cpp's n_ctx); otherwise see "
        "the server's log.",
        status=empty.status,
    )
