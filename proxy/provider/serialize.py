"""litellm's response objects as the dicts OpenAI's chat-completions schema describes.

Neither of pydantic's dumps fits: ``exclude_none`` drops keys the schema requires (``finish_reason`` on
every stream choice, ``content``, ``refusal`` and ``logprobs`` on a message), while a plain dump emits
``"tool_calls": null`` / ``"function_call": null``, which the schema forbids, plus litellm's own fields
(``provider_specific_fields``, ``citations``, ...). So each object is rebuilt from the keys the schema
knows, with ``reasoning_content`` kept as the one widely read extension, and ``thinking_blocks`` (litellm's
name for Anthropic's thinking and redacted-thinking blocks, with their signatures: a client that sends an
answer back must send them unchanged, and the Messages ingress rebuilds Anthropic's blocks from them).
Empty ``tool_calls`` arrays are omitted (OpenAI itself rejects them when a client sends them back).

``StreamSerializer`` adds what one chunk cannot know: a tool call's ``function.name`` must arrive whole
in exactly one delta (the OpenAI Agents SDK keeps only the last fragment, LangChain concatenates them).
"""

from __future__ import annotations

from typing import Any

_FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})
# Provider-native reasons litellm sometimes lets through.
_FINISH_ALIASES = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "eos": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "safety": "content_filter",
    "recitation": "content_filter",
}
_SERVICE_TIERS = frozenset({"auto", "default", "flex", "scale", "priority", "fast"})
_DELTA_ROLES = frozenset({"developer", "system", "user", "assistant", "tool"})
_COMPLETION_DETAILS = (
    "accepted_prediction_tokens",
    "audio_tokens",
    "reasoning_tokens",
    "text_tokens",
    "rejected_prediction_tokens",
)
_USAGE_CHUNK_ENVELOPE = ("id", "object", "created", "model")
_PROMPT_DETAILS = ("audio_tokens", "cached_tokens", "text_tokens", "image_tokens", "cache_write_tokens")


def response_to_openai(resp: Any) -> dict[str, Any]:
    """A litellm ``ModelResponse`` (or its dict) as a schema-valid ``chat.completion`` dict."""
    data = _dump(resp)
    out = _envelope(data, "chat.completion")
    out["choices"] = [_choice(choice, index) for index, choice in enumerate(_list(data.get("choices")))]
    if (usage := _usage(data.get("usage"))) is not None:
        out["usage"] = usage
    return out


def chunk_to_openai(chunk: Any) -> dict[str, Any]:
    """A litellm ``ModelResponseStream`` (or its dict) as a schema-valid ``chat.completion.chunk`` dict.

    Stateless: one chunk at a time. Use ``StreamSerializer`` for a whole stream, so that tool-call
    names split over deltas (or repeated in every delta) reach the client whole, once.
    """
    data = _dump(chunk)
    out = _envelope(data, "chat.completion.chunk")
    if isinstance(data.get("obfuscation"), str):
        out["obfuscation"] = data["obfuscation"]
    out["choices"] = [_stream_choice(choice, index) for index, choice in enumerate(_list(data.get("choices")))]
    if (usage := _usage(data.get("usage"))) is not None:
        out["usage"] = usage
    return out


class StreamSerializer:
    """Serializes a stream's chunks, holding back a tool call until its name is complete.

    A name is complete once its call's arguments start, another call starts, the choice finishes or
    the stream ends; the held-back arguments go out with it. Later repeats of the name are dropped.
    """

    def __init__(self) -> None:
        self._pending: dict[tuple[int, int], dict[str, Any]] = {}  # (choice, call) -> call being held
        self._named: set[tuple[int, int]] = set()  # calls whose name has gone out
        self._last: dict[str, Any] | None = None

    def feed(self, chunk: Any) -> list[dict[str, Any]]:
        """The dicts to send for this chunk: none while it only carried a held-back name fragment."""
        out = chunk_to_openai(chunk)
        self._last = out
        had_content = any(choice["delta"] for choice in out["choices"])
        for choice in out["choices"]:
            self._fix_tool_calls(choice)
        if had_content and not _worth_sending(out):
            return []
        return [out]

    def usage_chunk(self, chunk: Any) -> dict[str, Any]:
        """A chunk with no choice that carries ``chunk``'s usage, as litellm's stream wrapper makes its usage
        chunk: the id, clock and model of the stream's last chunk (``chunk``'s own when there was none)."""
        out = chunk_to_openai(chunk)
        envelope = self._last or out
        base = {key: envelope[key] for key in _USAGE_CHUNK_ENVELOPE if key in envelope}
        return {**base, "choices": [], **({"usage": out["usage"]} if "usage" in out else {})}

    def finish(self) -> list[dict[str, Any]]:
        """The calls still held when the stream ends (a provider that never finished its choice)."""
        if not self._pending or self._last is None:
            return []
        flushed: dict[int, list[dict[str, Any]]] = {}
        for key in sorted(self._pending):
            flushed.setdefault(key[0], []).extend(self._release(key[0], only=key[1]))
        base = {k: v for k, v in self._last.items() if k not in ("choices", "usage")}
        choices = [
            {"index": index, "delta": {"tool_calls": calls}, "finish_reason": None} for index, calls in flushed.items()
        ]
        return [{**base, "choices": choices}]

    def _fix_tool_calls(self, choice: dict[str, Any]) -> None:
        index = choice["index"]
        ready: list[dict[str, Any]] = []
        for call in choice["delta"].pop("tool_calls", []):
            # Another call starting completes the ones held before it.
            ready += self._release(index, besides=call["index"])
            ready += self._merge((index, call["index"]), call)
        if choice.get("finish_reason") is not None:
            ready += self._release(index)
        if ready:
            choice["delta"]["tool_calls"] = ready

    def _merge(self, key: tuple[int, int], call: dict[str, Any]) -> list[dict[str, Any]]:
        function = call.get("function", {})
        name = function.pop("name", None)
        if key in self._named:
            return [call] if function or "id" in call else []  # a repeated name alone says nothing new
        held = self._pending.setdefault(key, {"index": key[1], "function": {}})
        if "id" in call:
            held["id"], held["type"] = call["id"], "function"
        if name is not None and name != held["function"].get("name"):  # equal: a provider repeating it whole
            held["function"]["name"] = held["function"].get("name", "") + name
        arguments = function.get("arguments")
        if arguments is not None:
            held["function"]["arguments"] = held["function"].get("arguments", "") + arguments
        if arguments and "name" in held["function"]:
            return self._release(key[0], only=key[1])
        return []

    def _release(self, choice: int, *, only: int | None = None, besides: int | None = None) -> list[dict[str, Any]]:
        """Send the held calls of ``choice`` (just call ``only``, or all but ``besides``), names complete."""
        released = []
        keys = [k for k in self._pending if k[0] == choice and k[1] != besides and only in (None, k[1])]
        for key in sorted(keys):
            call = self._pending.pop(key)
            self._named.add(key)
            call["function"].setdefault("arguments", "")
            released.append(call)
        return released


def _worth_sending(chunk: dict[str, Any]) -> bool:
    return "usage" in chunk or any(c["delta"] or c["finish_reason"] is not None for c in chunk["choices"])


def _dump(obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return obj
    dumped = obj.model_dump(warnings=False)
    if not isinstance(dumped, dict):
        raise TypeError(f"cannot serialize {type(obj).__name__} as an OpenAI object")
    return dumped


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _envelope(data: dict[str, Any], kind: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": str(data.get("id") or ""),
        "object": kind,
        "created": int(data.get("created") or 0),
        "model": str(data.get("model") or ""),
    }
    if isinstance(data.get("system_fingerprint"), str):
        out["system_fingerprint"] = data["system_fingerprint"]
    if data.get("service_tier") in _SERVICE_TIERS:
        out["service_tier"] = data["service_tier"]
    return out


def _finish_reason(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return value if value in _FINISH_REASONS else _FINISH_ALIASES.get(value, "stop")


def _choice(choice: Any, position: int) -> dict[str, Any]:
    choice = choice if isinstance(choice, dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    out_message: dict[str, Any] = {
        "role": "assistant",
        "content": _text(message.get("content")),
        "refusal": message.get("refusal") if isinstance(message.get("refusal"), str) else None,
    }
    calls = [c for c in map(_tool_call, _list(message.get("tool_calls"))) if c is not None]
    if calls:
        out_message["tool_calls"] = calls
    if (function_call := _function(message.get("function_call"), whole=True)) is not None:
        out_message["function_call"] = function_call
    if isinstance(message.get("reasoning_content"), str):
        out_message["reasoning_content"] = message["reasoning_content"]
    if blocks := _thinking_blocks(message.get("thinking_blocks")):
        out_message["thinking_blocks"] = blocks
    annotations = [a for a in _list(message.get("annotations")) if _is_url_citation(a)]
    if annotations:
        out_message["annotations"] = annotations
    return {
        "index": choice.get("index") if isinstance(choice.get("index"), int) else position,
        "message": out_message,
        # The non-stream schema requires a string; a provider that sent none stopped on its own.
        "finish_reason": _finish_reason(choice.get("finish_reason")) or "stop",
        "logprobs": _logprobs(choice.get("logprobs")),
    }


def _stream_choice(choice: Any, position: int) -> dict[str, Any]:
    choice = choice if isinstance(choice, dict) else {}
    delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
    out_delta: dict[str, Any] = {}
    if delta.get("role") in _DELTA_ROLES:
        out_delta["role"] = delta["role"]
    for key in ("content", "refusal", "reasoning_content"):
        if isinstance(delta.get(key), str):
            out_delta[key] = delta[key]
    if blocks := _thinking_blocks(delta.get("thinking_blocks")):
        out_delta["thinking_blocks"] = blocks
    calls = [c for c in map(_tool_call_chunk, _list(delta.get("tool_calls"))) if c is not None]
    if calls:
        out_delta["tool_calls"] = calls
    if (function_call := _function(delta.get("function_call"), whole=False)) is not None:
        out_delta["function_call"] = function_call
    out: dict[str, Any] = {
        "index": choice.get("index") if isinstance(choice.get("index"), int) else position,
        "delta": out_delta,
        "finish_reason": _finish_reason(choice.get("finish_reason")),  # required, null allowed
    }
    if choice.get("logprobs") is not None:
        out["logprobs"] = _logprobs(choice["logprobs"])
    return out


def _thinking_blocks(value: Any) -> list[dict[str, Any]]:
    """litellm's thinking blocks as Anthropic's: a thinking block's text and signature, a redacted one's data."""
    out: list[dict[str, Any]] = []
    for item in _list(value):
        block = item if isinstance(item, dict) else getattr(item, "__dict__", {})
        if block.get("type") == "thinking":
            out.append(
                {
                    "type": "thinking",
                    "thinking": str(block.get("thinking") or ""),
                    "signature": str(block.get("signature") or ""),
                }
            )
        elif block.get("type") == "redacted_thinking":
            out.append({"type": "redacted_thinking", "data": str(block.get("data") or "")})
    return out


def _text(content: Any) -> str | None:
    if isinstance(content, str) or content is None:
        return content
    if isinstance(content, list):  # content parts from providers that answer in parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return str(content)


def _function(value: Any, *, whole: bool) -> dict[str, str] | None:
    if not isinstance(value, dict):
        return None
    out = {key: value[key] for key in ("name", "arguments") if isinstance(value.get(key), str)}
    if whole:
        return {"name": out.get("name", ""), "arguments": out.get("arguments", "")} if "name" in out else None
    return out or None


def _tool_call(call: Any) -> dict[str, Any] | None:
    if not isinstance(call, dict):
        return None
    if call.get("type") == "custom" and isinstance(call.get("custom"), dict):
        custom = call["custom"]
        return {
            "id": str(call.get("id") or ""),
            "type": "custom",
            "custom": {"name": str(custom.get("name") or ""), "input": str(custom.get("input") or "")},
        }
    function = _function(call.get("function"), whole=True)
    if function is None:
        return None
    return {"id": str(call.get("id") or ""), "type": "function", "function": function}


def _tool_call_chunk(call: Any) -> dict[str, Any] | None:
    if not isinstance(call, dict):
        return None
    out: dict[str, Any] = {"index": call.get("index") if isinstance(call.get("index"), int) else 0}
    if isinstance(call.get("id"), str) and call["id"]:
        out["id"] = call["id"]
        out["type"] = "function"
    out["function"] = _function(call.get("function"), whole=False) or {}
    return out


def _is_url_citation(annotation: Any) -> bool:
    citation = annotation.get("url_citation") if isinstance(annotation, dict) else None
    return (
        annotation.get("type") == "url_citation"
        and isinstance(citation, dict)
        and all(key in citation for key in ("end_index", "start_index", "url", "title"))
    )


def _logprobs(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    return {
        key: [_token(t) for t in value[key]] if isinstance(value.get(key), list) else None
        for key in ("content", "refusal")
    }


def _token(token: Any) -> dict[str, Any]:
    token = token if isinstance(token, dict) else {}
    out: dict[str, Any] = {
        "token": str(token.get("token", "")),
        "logprob": float(token.get("logprob") or 0.0),
        "bytes": token.get("bytes") if isinstance(token.get("bytes"), list) else None,
    }
    if "top_logprobs" in token:
        out["top_logprobs"] = [
            {"token": str(t.get("token", "")), "logprob": float(t.get("logprob") or 0.0), "bytes": t.get("bytes")}
            for t in _list(token.get("top_logprobs"))
            if isinstance(t, dict)
        ]
    return out


def _usage(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    out: dict[str, Any] = {key: _int(value.get(key)) for key in ("prompt_tokens", "completion_tokens", "total_tokens")}
    # Anthropic's cache figures as litellm reports them (a write is billed apart, and the Messages ingress
    # hands both back to its client).
    for key in ("cache_creation_input_tokens", "cache_read_input_tokens"):
        if isinstance(value.get(key), int) and value[key]:
            out[key] = value[key]
    for key, allowed in (
        ("completion_tokens_details", _COMPLETION_DETAILS),
        ("prompt_tokens_details", _PROMPT_DETAILS),
    ):
        details = value.get(key)
        if isinstance(details, dict):
            kept = {k: details[k] for k in allowed if isinstance(details.get(k), int)}
            if kept:
                out[key] = kept
    return out


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0
