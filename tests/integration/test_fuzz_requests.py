"""A generated campaign of bad and odd requests through real HTTP: no 5xx, OpenAI-shaped answers, a usable session.

Three families of request bodies, each tagged with how it was made so a failure names its shape:

- ``schema``: bodies drawn from ``CreateChatCompletionRequest`` in ``tests/data/openai-chat-schemas.json``
  (schema-valid, but with every odd optional field the spec allows);
- ``mutate``: a valid request of a few typical shapes with one to three mutations (wrong types,
  out-of-range or huge numbers, unknown content-part types, ``tool_calls`` not a list, missing fields,
  unknown top-level fields such as litellm's own arguments, ``NaN``/``Infinity`` literals, lone
  surrogate escapes and deep nesting written into the raw JSON text);
- ``raw``: bodies that are not a JSON object at all (arrays, scalars, deep nesting, bad UTF-8).

Some requests also carry odd headers (``x-agent-scope``, session headers, content type), and some reuse
the session of the fixed follow-up conversation, so bad input lands in the history it must survive.

Every answer must be a 2xx with a valid completion (a stream of valid chunks ending in ``[DONE]``), or
a 4xx with an OpenAI error body; a stream may end with an error event, then ``[DONE]``. The keep-alive
connection must stay usable: an answer that does not say ``connection: close`` must leave the
connection open for the next request. Every ``FOLLOW_UP_EVERY`` requests, and after the campaign, a
normal turn of the fixed session must succeed through the OpenAI SDK on the same connection pool.

Generation: hypothesis supplies one distinct seed per example (``derandomize=True``, so CI sends the same
requests every run) and each request is built from ``random.Random(seed)``. Drawing every choice through
hypothesis instead costs about half a millisecond per draw and grows with the run, which does not fit 2,000
requests into the CI budget; hypothesis-jsonschema does not run on this project's hypothesis, so the
schema family uses the small converter below for the keywords the OpenAI schema uses ($ref,
allOf/anyOf/oneOf, enum, const, type, properties/required, items, bounds). Failures are collected for
the whole campaign rather than shrunk one by one, so a run reports every class at once; set
``CONTEXT_PROXY_FUZZ_REPORT`` to a file path to get one JSON line per failing request with the
server-side exception and where it was raised.
"""

from __future__ import annotations

import collections
import copy
import json
import logging
import math
import os
import random
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SCHEMAS = json.loads((Path(__file__).parents[1] / "data" / "openai-chat-schemas.json").read_text())["schemas"]
REQUEST_SCHEMA = SCHEMAS["CreateChatCompletionRequest"]
ERROR_VALIDATOR = jsonschema.Draft202012Validator(SCHEMAS["ErrorResponse"])
COMPLETION_VALIDATOR = jsonschema.Draft202012Validator(SCHEMAS["CreateChatCompletionResponse"])
CHUNK_VALIDATOR = jsonschema.Draft202012Validator(SCHEMAS["CreateChatCompletionStreamResponse"])

MODEL = "test-model"
# At least 2,000 generated requests (the issue's proof); the variable is for longer runs by hand.
EXAMPLES = int(os.environ.get("CONTEXT_PROXY_FUZZ_EXAMPLES", "2000"))
FOLLOW_UP_EVERY = 200
ANCHOR_SESSION = "fuzz-anchor"
PROVIDER_ANSWER = "ok"  # what the scripted provider says; any other 2xx content did not come from it


# --- raw JSON text: values json.dumps cannot write (NaN literals, lone surrogates, deep nesting) ----------


@dataclass(frozen=True)
class Raw:
    """A piece of JSON text written into the body verbatim, where json.dumps would refuse or escape it."""

    text: str
    label: str

    def __repr__(self) -> str:
        return f"Raw({self.label})"  # the text can be 100,000 characters


def encode(body: Any) -> bytes:
    """The body as JSON bytes, with every ``Raw`` value spliced in as its literal text."""
    pieces: list[Raw] = []

    def placeholder(value: Any) -> str:
        if not isinstance(value, Raw):
            raise TypeError(f"not JSON: {value!r}")
        pieces.append(value)
        return f"\x00raw{len(pieces) - 1}\x00"

    text = json.dumps(body, default=placeholder, allow_nan=False)
    for index, piece in enumerate(pieces):
        text = text.replace(f'"\\u0000raw{index}\\u0000"', piece.text, 1)
    return text.encode("utf-8", "surrogatepass")


def nested(depth: int, kind: str = "list") -> Raw:
    """JSON nested ``depth`` levels deep: ``[[[...]]]`` or ``{"a": {"a": ...}}``."""
    if kind == "list":
        return Raw("[" * depth + "]" * depth, f"nested-list-{depth}")
    return Raw('{"a":' * depth + "{}" + "}" * depth, f"nested-object-{depth}")


RAW_VALUES = [
    Raw("NaN", "NaN"),
    Raw("Infinity", "Infinity"),
    Raw("-Infinity", "-Infinity"),
    Raw("1e999", "1e999"),
    Raw("-0.0", "-0.0"),
    Raw("9" * 5_000, "int-5000-digits"),
    Raw('"\\ud800"', "lone-surrogate-high"),
    Raw('"\\udfff tail"', "lone-surrogate-low"),
    Raw('"a\\udc00\\ud800b"', "surrogates-reversed"),
    Raw('"\\u0000"', "nul-char"),
    nested(64),
    nested(1_000),
    nested(5_000),
    nested(1_000, "object"),
]


# --- bodies valid for a JSON schema (the subset of keywords the OpenAI spec uses) ------------------------

ODD_TEXT = [
    "",
    "x",
    "hello",
    "\u00e9t\u00e9",
    "\u65e5\u672c\u8a9e",
    "\U0001f642",
    "\u202etxet",
    "a\nb\tc",
    "\x00",
    "</context>",
]
ODD_INTEGERS = [0, 1, -1, 7, 2**31 - 1, 2**53, -(2**53), 10**20]
ODD_NUMBERS = [0.0, -0.0, 0.5, -1.5, 1e-300, 1e300, -1e300, 2.0]


def _small_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(6 if depth < 2 else 4)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice(ODD_INTEGERS + ODD_NUMBERS)
    if kind == 3:
        return rng.choice(ODD_TEXT)
    if kind == 4:
        return [_small_json(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {rng.choice(ODD_TEXT): _small_json(rng, depth + 1) for _ in range(rng.randrange(3))}


class SchemaValues:
    """Draws values valid for the schemas of one self-contained document (``$defs``), from a seeded random.

    Best effort: ``oneOf`` is drawn like ``anyOf``, and ``pattern``/``format`` are not honoured.
    """

    def __init__(self, root: dict[str, Any], optional_share: float = 0.2, max_depth: int = 7) -> None:
        self.root = root
        self.optional_share = optional_share
        self.max_depth = max_depth

    def value(self, rng: random.Random, schema: dict[str, Any] | bool, depth: int = 0) -> Any:
        """One value for ``schema``."""
        if schema is True or schema == {}:
            return _small_json(rng)
        assert isinstance(schema, dict)
        schema = self._resolve(schema)
        if "allOf" in schema:
            return self.value(rng, self._merge([self._resolve(part) for part in schema["allOf"]], schema), depth)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self.value(rng, rng.choice(schema[key]), depth)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return rng.choice(schema["enum"])
        kind = schema.get("type")
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else None
        if kind is None:
            return _small_json(rng)
        if isinstance(kind, list):
            kind = rng.choice(kind)
        return self._typed(rng, schema, kind, depth)

    def _resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            ref = schema["$ref"]
            schema = self.root if ref == "#" else self.root["$defs"][ref.removeprefix("#/$defs/")]
        return schema

    def _merge(self, parts: list[dict[str, Any]], outer: dict[str, Any]) -> dict[str, Any]:
        merged: dict[str, Any] = {k: v for k, v in outer.items() if k != "allOf"}
        for part in parts:
            if "allOf" in part:
                part = self._merge([self._resolve(p) for p in part["allOf"]], part)
            merged.setdefault("type", part.get("type"))
            merged["properties"] = {**merged.get("properties", {}), **part.get("properties", {})}
            merged["required"] = sorted({*merged.get("required", []), *part.get("required", [])})
        return merged

    def _typed(self, rng: random.Random, schema: dict[str, Any], kind: str, depth: int) -> Any:
        if kind == "null":
            return None
        if kind == "boolean":
            return rng.choice([True, False])
        if kind in ("integer", "number"):
            low, high = schema.get("minimum"), schema.get("maximum")
            pool = [v for v in (ODD_INTEGERS if kind == "integer" else ODD_NUMBERS + ODD_INTEGERS)]
            pool = [v for v in pool if (low is None or v >= low) and (high is None or v <= high)]
            pool += [b for b in (low, high) if b is not None]
            return rng.choice(pool)
        if kind == "string":
            low = schema.get("minLength", 0)
            text = rng.choice([t for t in ODD_TEXT if len(t) >= low] or ["x" * low])
            return text[: schema["maxLength"]] if "maxLength" in schema else text
        if kind == "array":
            low = schema.get("minItems", 0)
            count = low if depth >= self.max_depth else low + rng.randrange(3)
            count = min(count, schema.get("maxItems", count))
            return [self.value(rng, schema.get("items", True), depth + 1) for _ in range(count)]
        if kind == "object":
            required = set(schema.get("required", []))
            share = 0.0 if depth >= self.max_depth else self.optional_share
            return {
                name: self.value(rng, sub, depth + 1)
                for name, sub in schema.get("properties", {}).items()
                if name in required or rng.random() < share
            }
        raise ValueError(f"unsupported schema type {kind!r}")


# --- the requests ---------------------------------------------------------------------------------------


@dataclass
class FuzzRequest:
    """One generated request: its body (possibly with ``Raw`` pieces), headers, and how it was made."""

    family: str
    body: Any
    tags: list[str] = field(default_factory=list)
    headers: dict[str, bytes] = field(default_factory=dict)
    raw: bytes | None = None  # when set, sent instead of encoding ``body``

    def content(self) -> bytes:
        """The exact bytes sent."""
        return self.raw if self.raw is not None else encode(self.body)

    def shape(self) -> str:
        """A short description of how the request was made, for grouping failures."""
        return " ".join([self.family, *self.tags])

    def __repr__(self) -> str:
        return f"FuzzRequest({self.shape()[:200]})"


def _base_requests() -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    return [
        {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]},
        {
            "model": MODEL,
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
            "temperature": 0.2,
            "max_tokens": 50,
        },
        {
            "model": MODEL,
            "tools": [tool],
            "messages": [
                {"role": "user", "content": "look it up"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "result"},
                {"role": "user", "content": "thanks"},
            ],
        },
        {
            "model": MODEL,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                    ],
                }
            ],
        },
        {
            "model": MODEL,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "stream please"}],
        },
    ]


BASE_REQUESTS = _base_requests()

# litellm's own call arguments (where to connect, credentials, mocks, retries), and extension fields.
FOREIGN_FIELDS = [
    "base_url",
    "api_base",
    "api_key",
    "custom_llm_provider",
    "extra_headers",
    "extra_body",
    "timeout",
    "num_retries",
    "mock_response",
    "fallbacks",
    "callbacks",
    "litellm_session_id",
    "top_k",
    "logit_bias",
    "functions",
    "function_call",
    "prediction",
    "audio",
]
FOREIGN_VALUES: list[Any] = ["http://127.0.0.1:9/v1", "sk-stolen", 1, {"a": "b"}, [], "ok", None]

ODD_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    2**31,
    2**63,
    -(2**63),
    10**30,
    1.5,
    -1e308,
    "",
    "x" * 2_000,
    [],
    {},
    [1, "x", None],
    {"type": "wizard"},
    {"role": "user"},
    *RAW_VALUES,
]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


def _path_label(path: tuple[Any, ...]) -> str:
    # Indices collapse to "*" so that failures group by shape, not by position.
    return ".".join("*" if isinstance(part, int) else str(part) for part in path) or "<body>"


def _value_label(value: Any) -> str:
    if isinstance(value, Raw):
        return value.label
    if isinstance(value, str):
        return f"str{len(value)}" if len(value) > 20 else json.dumps(value)
    return json.dumps(value, default=str)[:40]


def _set(body: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = body
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    return body


def _delete(body: Any, path: tuple[Any, ...]) -> Any:
    parent = body
    for part in path[:-1]:
        parent = parent[part]
    del parent[path[-1]]
    return body


def mutated_request(rng: random.Random) -> FuzzRequest:
    """A valid request of a typical shape with one to three mutations."""
    body: Any = copy.deepcopy(rng.choice(BASE_REQUESTS))
    tags: list[str] = []
    if rng.random() < 0.25 and not body.get("stream"):
        body["stream"] = True  # a fault after the first byte of a stream shows differently than before it
        tags.append("stream")
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        path = rng.choice(list(_paths(body)))
        action = rng.choice(["replace", "replace", "delete", "add-field", "semantic", "semantic"])
        if action == "delete" and path:
            body = _delete(body, path)
            tags.append(f"delete:{_path_label(path)}")
        elif action == "add-field":
            name, value = rng.choice(FOREIGN_FIELDS), rng.choice(FOREIGN_VALUES)
            body[name] = copy.deepcopy(value)
            tags.append(f"add:{name}={_value_label(value)}")
        elif action == "semantic":
            name, mutation = rng.choice(SEMANTIC_MUTATIONS)
            body = mutation(body)
            tags.append(f"semantic:{name}")
        else:
            value = rng.choice(ODD_VALUES)
            body = _set(body, path, copy.deepcopy(value))
            tags.append(f"set:{_path_label(path)}={_value_label(value)}")
        # The odd values are shared constants: copy, so no later mutation reaches into one of them.
        body = copy.deepcopy(body)
        if not isinstance(body, dict):
            break
    return FuzzRequest("mutate", body, tags)


def _with(key: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda body: {**body, key: value}


def _last_user_content(value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def apply(body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
            messages[-1] = {**messages[-1], "content": value}
        return body

    return apply


def _assistant_tool_calls(value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def apply(body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        return {**body, "messages": [*messages, {"role": "assistant", "content": "x", "tool_calls": value}]}

    return apply


SEMANTIC_MUTATIONS: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = [
    ("temperature=-1", _with("temperature", -1)),
    ("temperature=3", _with("temperature", 3)),
    ("temperature=1e10", _with("temperature", 1e10)),
    ("temperature=NaN", _with("temperature", Raw("NaN", "NaN"))),
    ("top_p=2", _with("top_p", 2)),
    ("max_tokens=0", _with("max_tokens", 0)),
    ("max_tokens=2**40", _with("max_tokens", 2**40)),
    ("max_completion_tokens=-3", _with("max_completion_tokens", -3)),
    ("n=0", _with("n", 0)),
    ("n=5", _with("n", 5)),
    ("top_logprobs=99", _with("top_logprobs", 99)),
    ("stop=list-of-10", _with("stop", [str(i) for i in range(10)])),
    ("stop=int", _with("stop", 7)),
    ("response_format=wizard", _with("response_format", {"type": "wizard"})),
    ("tool_choice=wizard", _with("tool_choice", "wizard")),
    ("tool_choice=unknown-function", _with("tool_choice", {"type": "function", "function": {"name": "nope"}})),
    ("tools=not-a-list", _with("tools", {"type": "function"})),
    ("tools=[{}]", _with("tools", [{}])),
    ("tools=[function-without-name]", _with("tools", [{"type": "function", "function": {}}])),
    ("stream=string", _with("stream", "yes")),
    ("stream_options=include_usage-string", _with("stream_options", {"include_usage": "yes"})),
    ("metadata=list", _with("metadata", [1])),
    ("metadata=session_id-object", _with("metadata", {"session_id": {"a": 1}})),
    ("user=int", _with("user", 5)),
    ("user=lone-surrogate", _with("user", Raw('"a\\ud800"', "lone-surrogate"))),
    ("metadata=lone-surrogate", _with("metadata", {"note": Raw('"\\udc00"', "lone-surrogate")})),
    ("messages=string", _with("messages", "hello")),
    ("messages=object", _with("messages", {"role": "user", "content": "x"})),
    ("messages=[null]", _with("messages", [None])),
    ("model=int", _with("model", 3)),
    ("model=unknown", _with("model", "no-such-model")),
    ("model=empty", _with("model", "")),
    ("content=part-type-wizard", _last_user_content([{"type": "wizard", "wizard": "x"}])),
    ("content=part-without-type", _last_user_content([{"text": "x"}])),
    ("content=part-text-int", _last_user_content([{"type": "text", "text": 5}])),
    ("content=part-image-url-string", _last_user_content([{"type": "image_url", "image_url": "http://x/a.png"}])),
    ("content=part-input_audio-empty", _last_user_content([{"type": "input_audio", "input_audio": {}}])),
    ("content=part-file-empty", _last_user_content([{"type": "file", "file": {}}])),
    ("content=part-refusal-in-user", _last_user_content([{"type": "refusal", "refusal": "no"}])),
    ("content=part-is-string", _last_user_content(["x"])),
    ("content=part-nested-list", _last_user_content([[{"type": "text", "text": "x"}]])),
    ("content=int", _last_user_content(5)),
    ("content=object", _last_user_content({"type": "text", "text": "x"})),
    ("content=NaN-in-part", _last_user_content([{"type": "text", "text": "x", "score": Raw("NaN", "NaN")}])),
    ("content=lone-surrogate", _last_user_content(Raw('"hi \\ud800 there"', "lone-surrogate"))),
    ("content=lone-surrogate-in-part", _last_user_content([{"type": "text", "text": Raw('"\\udfff"', "surr")}])),
    ("content=deep-part", _last_user_content([{"type": "text", "text": "x", "extra": nested(2_000)}])),
    ("tool_calls=string", _assistant_tool_calls("call")),
    ("tool_calls=object", _assistant_tool_calls({"id": "c", "function": {"name": "f", "arguments": "{}"}})),
    ("tool_calls=[null]", _assistant_tool_calls([None])),
    ("tool_calls=[{}]", _assistant_tool_calls([{}])),
    ("tool_calls=id-int", _assistant_tool_calls([{"id": 1, "function": {"name": "f", "arguments": "{}"}}])),
    ("tool_calls=arguments-object", _assistant_tool_calls([{"id": "c", "function": {"name": "f", "arguments": {}}}])),
    ("tool_calls=[]", _assistant_tool_calls([])),
]

SCHEMA_VALUES = SchemaValues(REQUEST_SCHEMA)


def schema_request(rng: random.Random) -> FuzzRequest:
    """A body valid for ``CreateChatCompletionRequest``, nine times in ten naming the served model."""
    body = SCHEMA_VALUES.value(rng, REQUEST_SCHEMA)
    if rng.random() < 0.9:
        body["model"] = MODEL
    odd = sorted(set(body) - {"model", "messages"})
    roles = ",".join(str(m.get("role")) for m in body.get("messages", []) if isinstance(m, dict))
    return FuzzRequest("schema", body, [f"roles={roles}", *(f"has:{name}" for name in odd)])


RAW_BODIES = [
    (b"[]", "array"),
    (b'"hello"', "string"),
    (b"1", "number"),
    (b"null", "null"),
    (b"true", "true"),
    (b"NaN", "NaN"),
    (b"", "empty"),
    (b'{"model": "test-model", "messages": [{"role": "user", "content": "hi"}]', "truncated"),
    (b'{"model": "test-model", "messages": [{"role": "user", "content": "\xff"}]}', "bad-utf8"),
    (b"\xef\xbb\xbf" + json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "bom"}]}).encode(), "bom"),
    (encode({"model": MODEL, "messages": nested(100_000)}), "messages-nested-100000"),
    (encode(nested(2_000)), "array-nested-2000"),
    (encode(nested(2_000, "object")), "object-nested-2000"),
    (b'{"model": "test-model", "model": 1, "messages": [{"role": "user", "content": "dup"}]}', "duplicate-key"),
]


def raw_request(rng: random.Random) -> FuzzRequest:
    """A body that is not a JSON object, or not JSON at all."""
    raw, label = rng.choice(RAW_BODIES)
    return FuzzRequest("raw", None, [label], raw=raw)


ODD_HEADERS: list[tuple[str, bytes]] = [
    ("x-agent-scope", b"admin"),
    ("x-agent-scope", b""),
    ("x-agent-scope", b"Subagent"),
    ("x-agent-scope", b"reviewer"),
    ("x-agent-scope", "\u00fcber".encode("latin-1")),
    ("x-agent-scope", b"x" * 300),
    ("x-session-id", b"../../etc/passwd"),
    ("x-session-id", b"a" * 2_000),
    ("x-session-id", "s\u00e9ance".encode("latin-1")),
    ("x-session-id", b""),
    ("x-session-id", ANCHOR_SESSION.encode()),
    ("x-claude-code-session-id", b"fuzz-vendor"),
    ("x-context-mode", b"legacy"),
    ("x-context-mode", b"wizard"),
    ("content-type", b"text/plain"),
    ("content-type", b"application/x-www-form-urlencoded"),
]

FAMILIES: list[Callable[[random.Random], FuzzRequest]] = [
    schema_request,
    schema_request,
    schema_request,
    mutated_request,
    mutated_request,
    mutated_request,
    mutated_request,
    raw_request,
]


def fuzz_request(seed: int) -> FuzzRequest:
    """The request for one seed: any family, one in four with odd headers."""
    rng = random.Random(seed)
    request = rng.choice(FAMILIES)(rng)
    if rng.random() < 0.25:
        for name, value in rng.sample(ODD_HEADERS, rng.choice([1, 1, 2])):
            request.headers[name] = value
            request.tags.append(f"header:{name}={value[:20].decode('latin-1')!r}")
    return request


# --- checking the answers -------------------------------------------------------------------------------


@dataclass
class Failure:
    """One request whose answer broke a rule."""

    rule: str
    status: int | None
    request: FuzzRequest
    detail: str
    server_errors: list[str] = field(default_factory=list)


class ServerLog(logging.Handler):
    """Keeps the tracebacks the proxy and uvicorn log while serving (they run in this process, in threads)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            frames = traceback.extract_tb(error.__traceback__)
            ours = [f for f in frames if "/proxy/" in f.filename or "/contributors/" in f.filename]
            where = ours[-1] if ours else frames[-1] if frames else None
            origin = f"{where.filename.split('/site-packages/')[-1]}:{where.lineno} {where.name}" if where else "?"
            text = f"{type(error).__name__}: {str(error)[:160]} [raised in {origin}]"
            if frames and where is not frames[-1]:
                last = frames[-1]
                text += f" [innermost {last.filename.split('/site-packages/')[-1]}:{last.lineno} {last.name}]"
        self.records.append(f"{record.name}: {text}")

    def take(self) -> list[str]:
        """The records logged since the last call."""
        records, self.records = self.records, []
        return records


CLOSED = -1


def _local_port(response: httpx.Response) -> int | None:
    """The client port of the connection that carried ``response``; ``CLOSED`` when it is closed already."""
    stream = response.extensions.get("network_stream")
    try:
        address = stream.get_extra_info("client_addr") if stream is not None else None
    except OSError:
        return CLOSED
    return int(address[1]) if address else None


def _check_stream(text: str) -> str | None:
    """None when ``text`` is a valid SSE completion stream, else what is wrong with it."""
    events = [line.removeprefix("data: ") for line in text.split("\n") if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        last = events[-1][:120] if events else "<no events>"
        return f"stream does not end with [DONE] (last event: {last})"
    for event in events[:-1]:
        chunk = json.loads(event)
        if "error" in chunk:
            if event is not events[-2]:
                return "an error event is followed by more chunks"
            ERROR_VALIDATOR.validate(chunk)
        else:
            CHUNK_VALIDATOR.validate(chunk)
    return None


def _stream_text(text: str) -> Iterator[str]:
    for line in text.split("\n"):
        if line.startswith("data: {"):
            for choice in json.loads(line.removeprefix("data: ")).get("choices", []):
                yield choice.get("delta", {}).get("content") or ""


def check_answer(response: httpx.Response) -> tuple[str, str] | None:
    """None when the answer follows the rules, else (rule, detail)."""
    status = response.status_code
    if status >= 500:
        return f"status {status}", response.text[:300]
    if status == 409:
        return "status 409", response.text[:300]  # requests are sequential: a busy session is a leaked lock
    try:
        if status >= 400:
            ERROR_VALIDATOR.validate(response.json())
            return None
        if not 200 <= status < 300:
            return f"status {status}", response.text[:300]
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            problem = _check_stream(response.text)
            if problem is not None:
                return "bad stream", problem
            text = "".join(_stream_text(response.text))
        else:
            COMPLETION_VALIDATOR.validate(response.json())
            text = response.json()["choices"][0]["message"]["content"]
        if text != PROVIDER_ANSWER:
            return "answer not from the provider", f"content {text!r}"
    except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
        return f"bad {status} body", f"{str(exc)[:200]}: {response.text[:200]}"
    return None


class _NoAnswer(Exception):
    """The request got no answer at all (the connection failed before the status line)."""


class _CutAnswer(Exception):
    """The answer started (status and headers came) but its body broke off."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


class Campaign:
    """Sends the generated requests on one keep-alive connection and records every broken rule."""

    def __init__(self, http: httpx.Client, log: ServerLog, follow_up: Callable[[], None]) -> None:
        self.http = http
        self.log = log
        self.follow_up = follow_up
        self.sent = 0
        self.answers: collections.Counter[tuple[int, str | None]] = collections.Counter()  # (status, code)
        self.examples: dict[tuple[int, str | None], str] = {}  # the first request shape of each answer kind
        self.streams = 0  # answers sent as server-sent events
        self.failures: list[Failure] = []
        self._last: tuple[int | None, bool, FuzzRequest | None] = (None, True, None)  # port, closing, request

    def send(self, request: FuzzRequest) -> None:
        """Send one request and record what went wrong; never raises, so hypothesis does not stop to shrink."""
        try:
            self._send(request)
        except Exception as exc:
            detail = "".join(traceback.format_exception(exc))[-600:]
            self.failures.append(Failure("harness", None, request, detail, self.log.take()))

    def _send(self, request: FuzzRequest) -> None:
        self.sent += 1
        try:
            response, port, closed = self._post(request)
        except _NoAnswer as exc:
            # Failing before any answer on a reused connection: the previous answer left it broken.
            self._blame_previous(f"the next request failed: {exc}")
            self._last = (None, True, request)
            try:
                response, port, closed = self._post(request)
            except _NoAnswer as again:
                self.failures.append(Failure("no answer", None, request, str(again), self.log.take()))
                return
        except _CutAnswer as exc:
            self.failures.append(Failure("answer cut", exc.status, request, str(exc), self.log.take()))
            self._last = (None, True, request)
            return
        closing = response.headers.get("connection", "").lower() == "close"
        previous_port, previous_closing, _ = self._last
        if previous_port not in (None, CLOSED) and not previous_closing and port != previous_port:
            self._blame_previous("the server closed the keep-alive connection without connection: close")
        if closed and not closing:
            detail = "the server closed the connection after this answer without connection: close"
            self.failures.append(Failure("keep-alive", response.status_code, request, detail))
        self._last = (CLOSED if closed else port, closing, request)
        problem = check_answer(response)
        code = response.json()["error"]["code"] if response.status_code >= 400 and problem is None else None
        kind = (response.status_code, code)
        self.answers[kind] += 1
        self.examples.setdefault(kind, request.shape())
        self.streams += response.headers.get("content-type", "").startswith("text/event-stream")
        server_errors = self.log.take()
        if problem is not None:
            self.failures.append(Failure(problem[0], response.status_code, request, problem[1], server_errors))
        if self.sent % FOLLOW_UP_EVERY == 0:
            try:
                self.follow_up()
            except Exception as exc:  # recorded, not raised: hypothesis would otherwise stop and shrink
                detail = f"follow-up turn after request {self.sent} failed: {type(exc).__name__}: {exc}"
                self.failures.append(Failure("follow-up", None, request, detail[:400], self.log.take()))

    def _post(self, request: FuzzRequest) -> tuple[httpx.Response, int | None, bool]:
        """The answer, the client port that carried it, and whether the connection was closed after it."""
        headers = {b"content-type": b"application/json", **{k.encode(): v for k, v in request.headers.items()}}
        try:
            with self.http.stream("POST", "/v1/chat/completions", content=request.content(), headers=headers) as answer:
                port = _local_port(answer)
                try:
                    answer.read()
                except httpx.TransportError as exc:
                    raise _CutAnswer(answer.status_code, f"{type(exc).__name__}: {exc}") from exc
                return answer, port, _local_port(answer) == CLOSED
        except httpx.TransportError as exc:
            raise _NoAnswer(f"{type(exc).__name__}: {exc}") from exc

    def statuses(self) -> dict[int, int]:
        """How many answers had each status."""
        counts: collections.Counter[int] = collections.Counter()
        for (status, _), count in self.answers.items():
            counts[status] += count
        return dict(sorted(counts.items()))

    def _blame_previous(self, detail: str) -> None:
        previous = self._last[2]
        if previous is not None:
            self.failures.append(Failure("keep-alive", None, previous, detail))

    def summary(self) -> str:
        """The failures grouped by rule and status, with the first request shape of each group."""
        groups: dict[tuple[str, int | None], list[Failure]] = collections.defaultdict(list)
        for failure in self.failures:
            groups[(failure.rule, failure.status)].append(failure)
        lines = [f"{len(self.failures)} of {self.sent} requests broke a rule (answers {self.statuses()}):"]
        for (rule, _), members in sorted(groups.items(), key=lambda item: -len(item[1])):
            first = members[0]
            lines.append(f"  {len(members):4d} x {rule}: e.g. {first.request.shape()[:200]}")
            lines.append(f"         answer: {first.detail[:200]}")
            lines.extend(f"         server: {entry[:300]}" for entry in first.server_errors[:2])
        return "\n".join(lines)

    def write_report(self, path: Path) -> None:
        """One JSON line per failure, with the exact bytes sent (for classifying by hand)."""
        with path.open("w") as report:
            for failure in self.failures:
                line = {
                    "rule": failure.rule,
                    "status": failure.status,
                    "shape": failure.request.shape(),
                    "headers": {k: v.decode("latin-1") for k, v in failure.request.headers.items()},
                    "body": failure.request.content()[:3_000].decode("utf-8", "backslashreplace"),
                    "answer": failure.detail,
                    "server": failure.server_errors,
                }
                report.write(json.dumps(line) + "\n")


# --- the test -------------------------------------------------------------------------------------------


@pytest.fixture
def server_log() -> Iterator[ServerLog]:
    handler = ServerLog()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)


def test_generated_bad_requests_get_no_5xx_and_the_session_keeps_working(start_proxy, provider, server_log):
    # A short lock wait: a turn that leaks its session lock shows as a 409 within seconds, not after a minute.
    proxy = start_proxy(trace_enabled=True, session_lock_seconds=2)
    started = time.monotonic()
    follow_ups: list[int] = []
    with httpx.Client(base_url=proxy.url, timeout=30, limits=httpx.Limits(max_connections=1)) as http:
        client = proxy.client(http_client=http)
        history: list[dict[str, Any]] = [{"role": "system", "content": "You are the fuzz anchor."}]

        def follow_up() -> None:
            history.append({"role": "user", "content": f"follow-up {len(follow_ups) + 1}"})
            answer = client.chat.completions.create(
                model=MODEL,
                messages=history,
                extra_headers={"x-session-id": ANCHOR_SESSION},  # type: ignore[arg-type]
            )
            assert answer.choices[0].message.content == PROVIDER_ANSWER
            history.append({"role": "assistant", "content": "ok"})
            follow_ups.append(campaign.sent)

        campaign = Campaign(http, server_log, follow_up)

        @settings(
            max_examples=EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
        )
        @given(st.integers(0, 2**64 - 1))
        def send(seed: int) -> None:
            campaign.send(fuzz_request(seed))

        send()
        follow_up()  # after the campaign: the same session, the same connection pool
    elapsed = time.monotonic() - started
    report = os.environ.get("CONTEXT_PROXY_FUZZ_REPORT")
    if report:
        campaign.write_report(Path(report))
    print(f"fuzz: {campaign.sent} requests in {elapsed:.1f} s, statuses {campaign.statuses()}")
    print(f"fuzz: {campaign.streams} streamed answers, {len(follow_ups)} follow-up turns")
    for kind, count in sorted(campaign.answers.items(), key=str):
        print(f"fuzz: {count:5d} x {kind}, e.g. {campaign.examples[kind][:150]}")
    assert campaign.sent >= EXAMPLES * 0.95  # hypothesis stops short only if it runs out of distinct inputs
    assert len(follow_ups) == math.floor(campaign.sent / FOLLOW_UP_EVERY) + 1
    assert not campaign.failures, campaign.summary()
