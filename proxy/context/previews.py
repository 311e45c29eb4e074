"""Tool-body projection: an old stored tool body becomes a small head/tail preview naming its reference.

The preview tells the model how big the output was, shows its first and last lines (or, for one
over-wide line such as compressed JSON, its first and last characters), says exactly which part was
left out in the units ``read_tool_output`` takes, and names the reference as plain ``ref=<REF>``.

The reader is named as the session offers it: ``read_tool_output``, or another name when the client
declares a tool of that name (``proxy/runtime/proxy_tools.py``). A preview is a pure function of the
body, the reference, the reader's name and the policy: the same input gives the same
bytes, so a history compacted the same way on the next turn keeps the provider's prompt cache hitting.
A body without a retrievable reference is never previewed (the caller keeps it for the summarizer),
and a body is never replaced by a preview that is not shorter than it.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.kernel.canonical import content_text

REF_PATTERN = re.compile(r"[A-Za-z0-9_.:-]+")
# How a reference appears in any text (previews, checkpoints). Sentence punctuation right after a ref
# is not part of it, hence the trimming in ``refs_in``.
REF_MENTION = re.compile(r"\bref=([A-Za-z0-9_.:-]+)")
PREVIEW_PREFIX = "[tool output compacted: "
# The reader's own name; ``tool_output_reader.py`` defines its schema under it.
READ_TOOL_OUTPUT = "read_tool_output"
ELLIPSIS = "…"


@dataclass(frozen=True)
class PreviewPolicy:
    """How much of a body a preview keeps: whole lines at the head and tail, each side capped in chars."""

    head_lines: int = 8
    tail_lines: int = 8
    side_chars: int = 600  # per side; also what one over-wide line shows of its start and of its end
    line_chars: int = 240  # a kept line longer than this is cut with an ellipsis


def is_valid_ref(ref: str) -> bool:
    """True if ``ref`` has the reference syntax ``[A-Za-z0-9_.:-]+``."""
    return bool(REF_PATTERN.fullmatch(ref))


def is_preview(text: str) -> bool:
    """True if ``text`` is a preview made by :func:`render_preview`."""
    return text.startswith(PREVIEW_PREFIX)


def refs_in(text: str) -> list[str]:
    """The references mentioned as ``ref=<REF>`` in ``text``, in order, without duplicates."""
    seen: dict[str, None] = {}
    for match in REF_MENTION.finditer(text):
        ref = match.group(1).rstrip(".:")
        if ref:
            seen.setdefault(ref, None)
    return list(seen)


def _clip(line: str, limit: int) -> str:
    return line if len(line) <= limit else line[: max(1, limit - 1)] + ELLIPSIS


def _side(lines: list[str], policy: PreviewPolicy, *, from_end: bool) -> list[str]:
    """Up to ``head_lines``/``tail_lines`` clipped lines whose total stays within ``side_chars``."""
    count = policy.tail_lines if from_end else policy.head_lines
    picked: list[str] = []
    used = 0
    for line in reversed(lines) if from_end else lines:
        if len(picked) >= count:
            break
        clipped = _clip(line, policy.line_chars)
        if picked and used + len(clipped) > policy.side_chars:
            break
        picked.append(clipped)
        used += len(clipped) + 1
    return list(reversed(picked)) if from_end else picked


def render_preview(
    body: str, ref: str, policy: PreviewPolicy | None = None, *, reader: str = READ_TOOL_OUTPUT
) -> str | None:
    """The preview text for ``body`` stored under ``ref``, or ``None`` if it would not be shorter.

    Several lines: the first and last lines, with ``[lines a-b omitted]`` between (1-based, inclusive,
    as ``start_line``/``end_line`` take them). One line: its first and last ``side_chars`` characters
    with ``[chars a-b omitted]`` (0-based, end exclusive, as ``start_char``/``end_char`` take them).
    """
    if not is_valid_ref(ref):
        raise ValueError(f"invalid tool-output reference {ref!r}")
    policy = policy or PreviewPolicy()
    lines = body.split("\n")
    how = f"read the rest with {reader}(ref={ref}, query=... | start_line/end_line | start_char/end_char)"
    if len(lines) == 1:
        n = len(body)
        side = policy.side_chars
        if n <= 2 * side:
            return None
        header = f"{PREVIEW_PREFIX}{n:,} chars, 1 line; first/last characters below; {how}]"
        middle = f"{ELLIPSIS} [chars {side}-{n - side} omitted] {ELLIPSIS}"
        text = "\n".join((header, body[:side], middle, body[n - side :]))
    else:
        head = _side(lines, policy, from_end=False)
        tail = _side(lines[len(head) :], policy, from_end=True)
        first_omitted, last_omitted = len(head) + 1, len(lines) - len(tail)
        header = f"{PREVIEW_PREFIX}{len(body):,} chars, {len(lines):,} lines; first/last lines below; {how}]"
        if first_omitted > last_omitted:
            middle = f"{ELLIPSIS} [long lines cut] {ELLIPSIS}"
        else:
            middle = f"{ELLIPSIS} [lines {first_omitted}-{last_omitted} omitted] {ELLIPSIS}"
        text = "\n".join((header, *head, middle, *tail))
    return text if len(text) < len(body) else None


def preview_message(
    message: Mapping[str, Any], ref: str, policy: PreviewPolicy | None = None, *, reader: str = READ_TOOL_OUTPUT
) -> dict[str, Any] | None:
    """A copy of the tool ``message`` with its body replaced by the preview, or ``None`` to leave it.

    Everything but ``content`` (role, ``tool_call_id``, name) is kept, so the call/result structure
    stays exactly as it was. A body that already is a preview is left alone.
    """
    body = content_text(message.get("content"))
    if is_preview(body):
        return None
    text = render_preview(body, ref, policy, reader=reader)
    if text is None:
        return None
    out = dict(message)
    out["content"] = text
    return out


class PreviewMemo:
    """The preview texts made before, by body, reference and reader: a resent history's bodies are
    previewed again on every turn (the compactor re-applies what earlier turns decided), and rendering a
    preview splits the whole body into lines.

    A body is named by the chain hash of the prefix ending in its tool message (``chain_hash``), which
    covers the message's content; with the policy fixed per memo, the preview (or ``None``: not shorter)
    is then a pure function of that hash, the reference it is stored under and the reader's name. Only
    the text (and its name) is kept; each caller gets a dict of its own. At most ``max_entries`` are
    kept, the least recently used go first; thread-safe (a large history is compacted on a worker
    thread).
    """

    DEFAULT_MAX_ENTRIES = 20_000  # previews are at most ~1.3 KB of text: a few tens of MB at most

    def __init__(self, policy: PreviewPolicy, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.policy = policy
        self.max_entries = max_entries
        # (chain hash, reference, reader) -> (text, name), or None: no shorter preview
        self._texts: OrderedDict[tuple[str, str, str], tuple[str, str] | None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._texts)

    def preview_message(
        self, message: Mapping[str, Any], chain_hash: str, ref: str, *, reader: str = READ_TOOL_OUTPUT
    ) -> dict[str, Any] | None:
        """:func:`preview_message` of ``message`` (the tool message named ``chain_hash``, its body stored
        under ``ref``), remembered."""
        named = self.named_preview(message, chain_hash, ref, reader=reader)
        return None if named is None else named[0]

    def named_preview(
        self, message: Mapping[str, Any], chain_hash: str, ref: str, *, reader: str = READ_TOOL_OUTPUT
    ) -> tuple[dict[str, Any], str] | None:
        """``preview_message``, with a name for the preview as a chain hash names a history message: equal
        names mean equal canonical messages (the same body, reference, reader and policy), so a token
        counter can count it by name (``PrefixTokenEstimator.count_message_at``) on every later turn."""
        key = (chain_hash, ref, reader)
        with self._lock:
            known = self._texts.get(key, _UNKNOWN)
            if known is not _UNKNOWN:
                self._texts.move_to_end(key)
        if known is _UNKNOWN:
            body = content_text(message.get("content"))
            text = None if is_preview(body) else render_preview(body, ref, self.policy, reader=reader)
            known = None if text is None else (text, self._name(chain_hash, ref, reader))
            with self._lock:
                self._texts[key] = known
                while len(self._texts) > self.max_entries:
                    self._texts.popitem(last=False)
        if known is None:
            return None
        text, name = known
        out = dict(message)
        out["content"] = text
        return out, name

    def _name(self, chain_hash: str, ref: str, reader: str) -> str:
        # A space of its own: a chain hash is the SHA-256 of "<previous>\n<message hash>".
        return hashlib.sha256(f"preview\n{chain_hash}\n{ref}\n{reader}\n{self.policy!r}".encode()).hexdigest()


_UNKNOWN: Any = object()
