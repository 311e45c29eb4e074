"""The recording format: one client request and the provider exchanges it caused.

Per session folder (``<record-dir>/<context-id>/``, 0700), each client request is two files (0600):

- ``<stamp>.request.json``: the request as received (credential headers and fields removed), the
  status and body the client got, the session's framing nonce, and in shadow mode the candidates.
- ``<stamp>.cassette.yaml``: the provider exchanges in vcrpy's cassette format (``version: 1``,
  ``interactions: [{request: {method, uri, body, headers}, response: {status, headers, body}}]``).
  The request body is the (redacted) ``litellm.acompletion`` arguments, the response body the OpenAI
  answer or, for a stream, its chunks as server-sent events; the call's tag is in the request headers
  (``x-context-call``: ``turn``, ``tool_round:k``, ``summarizer:k``, ``overflow_retry:k``, and
  ``x-context-call-index``: its index among calls of that kind in the request).

``<stamp>`` is the arrival time in milliseconds and a per-process counter: unique per replica, and
sortable across replicas, which is the order replay re-sends them in.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

FORMAT_VERSION = 1
CASSETTE_VERSION = 1  # vcrpy's cassette format version
REQUEST_SUFFIX = ".request.json"
CASSETTE_SUFFIX = ".cassette.yaml"
CALL_HEADER = "x-context-call"
INDEX_HEADER = "x-context-call-index"
_SSE = "text/event-stream"


@dataclass
class Exchange:
    """One provider call: its tag, what it was asked and what it answered (a response, chunks or an error)."""

    key: str  # ``CallTag.key``
    index: int  # among the calls of this key in the client request
    llm_input: dict[str, Any]
    response: dict[str, Any] | None = None
    chunks: list[dict[str, Any]] | None = None
    error: dict[str, Any] | None = None  # {"status", "body", "class", "limit", "providerMessage", "countsOutput"}

    def interaction(self) -> dict[str, Any]:
        """This exchange as a vcrpy interaction."""
        headers = {"content-type": ["application/json"], CALL_HEADER: [self.key], INDEX_HEADER: [str(self.index)]}
        request = {
            "method": "POST",
            "uri": f"litellm://acompletion/{self.llm_input.get('model', '')}",
            "body": json.dumps(self.llm_input, ensure_ascii=False, separators=(",", ":")),
            "headers": headers,
        }
        if self.error is not None:
            status = int(self.error.get("status") or 502)
            body = json.dumps(self.error, ensure_ascii=False)
            content_type = "application/json"
        elif self.chunks is not None:
            status = 200
            body = "".join(f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in self.chunks) + "data: [DONE]\n\n"
            content_type = _SSE
        else:
            status, body, content_type = 200, json.dumps(self.response, ensure_ascii=False), "application/json"
        response = {
            "status": {"code": status, "message": "OK" if status == 200 else "Error"},
            "headers": {"content-type": [content_type]},
            "body": {"string": body},
        }
        return {"request": request, "response": response}

    @classmethod
    def from_interaction(cls, interaction: dict[str, Any]) -> Exchange:
        """The exchange a vcrpy interaction written by :meth:`interaction` holds."""
        request, response = interaction["request"], interaction["response"]
        headers = {k.lower(): v for k, v in (request.get("headers") or {}).items()}
        key = _first(headers.get(CALL_HEADER)) or "turn"
        index = int(_first(headers.get(INDEX_HEADER)) or 0)
        body = response["body"]["string"]
        if isinstance(body, bytes):
            body = body.decode("utf-8")
        llm_input = json.loads(request["body"])
        if int(response["status"]["code"]) != 200:
            return cls(key, index, llm_input, error=json.loads(body))
        content_type = _first({k.lower(): v for k, v in response["headers"].items()}.get("content-type")) or ""
        if content_type.startswith(_SSE):
            chunks = [
                json.loads(line[len("data: ") :])
                for line in body.split("\n\n")
                if line.startswith("data: ") and line != "data: [DONE]"
            ]
            return cls(key, index, llm_input, chunks=chunks)
        return cls(key, index, llm_input, response=json.loads(body))


@dataclass
class RecordedRequest:
    """One client request of a recording, with its provider exchanges."""

    stamp: str
    context_id: str
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # the JSON body (credentials removed), or the text of a body that was not JSON
    status: int = 0
    answer: str = ""  # the body the client got (JSON or server-sent events), for ids the proxy minted
    mode: str = ""
    nonce: str = ""  # the session's framing nonce, so that replay can tell it from a change
    shadow: dict[str, dict[str, Any]] = field(default_factory=dict)  # "<key>#<index>": the candidate input
    exchanges: list[Exchange] = field(default_factory=list)
    folder: Path | None = None

    def write(self, root: Path) -> None:
        """Write both files of this request under ``root/<context-id>/`` (0600, folders 0700)."""
        folder = root / self.context_id
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        os.chmod(folder, 0o700)
        record = {
            "formatVersion": FORMAT_VERSION,
            "contextId": self.context_id,
            "stamp": self.stamp,
            "request": {"method": self.method, "path": self.path, "headers": self.headers, "body": self.body},
            "response": {"status": self.status, "mode": self.mode, "body": self.answer},
            "framingNonce": self.nonce,
            "shadowCandidates": self.shadow,
        }
        cassette = {"interactions": [e.interaction() for e in self.exchanges], "version": CASSETTE_VERSION}
        # The cassette first: a request file is only ever read with its cassette beside it.
        _write_private(folder / f"{self.stamp}{CASSETTE_SUFFIX}", yaml.safe_dump(cassette, allow_unicode=True))
        _write_private(folder / f"{self.stamp}{REQUEST_SUFFIX}", json.dumps(record, ensure_ascii=False, indent=1))

    @classmethod
    def read(cls, path: Path) -> RecordedRequest:
        """The request recorded in ``path`` (a ``.request.json``) and its cassette; ``ValueError`` if unreadable."""
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            stamp = path.name[: -len(REQUEST_SUFFIX)]
            cassette = yaml.safe_load((path.parent / f"{stamp}{CASSETTE_SUFFIX}").read_text(encoding="utf-8"))
            request, response = record["request"], record["response"]
            return cls(
                stamp=stamp,
                context_id=str(record["contextId"]),
                method=str(request["method"]),
                path=str(request["path"]),
                headers=dict(request["headers"]),
                body=request["body"],
                status=int(response["status"]),
                answer=str(response.get("body") or ""),
                mode=str(response.get("mode") or ""),
                nonce=str(record.get("framingNonce") or ""),
                shadow=dict(record.get("shadowCandidates") or {}),
                exchanges=[Exchange.from_interaction(i) for i in cassette.get("interactions") or []],
                folder=path.parent,
            )
        except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError) as exc:
            raise ValueError(f"{path}: not a readable recording ({exc})") from exc


def read_recordings(folders: list[Path]) -> list[RecordedRequest]:
    """Every recorded request under ``folders`` (each a record dir of one replica), in arrival order."""
    found = []
    for folder in folders:
        if not folder.is_dir():
            raise ValueError(f"{folder}: not a folder")
        found += [RecordedRequest.read(path) for path in sorted(folder.glob(f"*/*{REQUEST_SUFFIX}"))]
    return sorted(found, key=lambda r: (r.stamp, r.context_id))


def _first(values: Any) -> str | None:
    if isinstance(values, list):
        return str(values[0]) if values else None
    return None if values is None else str(values)


def _write_private(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)
