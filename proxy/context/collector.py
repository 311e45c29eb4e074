"""``collect_detailed``: run a scope's contributors concurrently and validate what they give.

Each contributor runs under a timeout; its raw output, duration, status and error are recorded for the
trace. Output is validated before anything downstream sees it: contributor messages may only be user
messages, so a package can never forge an assistant tool call or a tool result.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from proxy.context.registry import ContextContributorRegistry
from proxy.context.types import (
    ID_PATTERN,
    TRUST_LEVELS,
    Attachment,
    ContextMessage,
    ContributionRequest,
    Contributor,
    ContributorOutput,
    Diagnostic,
    Section,
)
from proxy.kernel.canonical import stable_json
from proxy.kernel.errors import AssemblyFailed

Status: TypeAlias = Literal["ok", "error", "timeout", "invalid"]
DEFAULT_TIMEOUT_SECONDS = 5.0
_ID = re.compile(ID_PATTERN)
# Keys that make a "message" something other than a plain user message.
_FORGERY_KEYS = ("tool_calls", "tool_call_id", "function_call")


class InvalidOutput(ValueError):
    """A contributor's output broke the contract; the message says how."""


class ProtectedContributorFailed(AssemblyFailed):
    """A protected contributor failed: the turn cannot be assembled. ``runs`` are every contributor's
    runs (the failed ones among them), kept so the failed turn's trace can say what each one did."""

    def __init__(self, message: str, runs: tuple[ContributorRun, ...]) -> None:
        super().__init__(message)
        self.runs = runs


@dataclass(frozen=True)
class ContributorRun:
    """One contributor's run: what it returned, how long it took, and what became of it."""

    contributor_id: str
    protected: bool
    status: Status
    duration_ms: float
    error: str = ""
    raw_output: Any = None
    output: ContributorOutput = dataclasses.field(default_factory=ContributorOutput)


@dataclass(frozen=True)
class Collection:
    """The validated collection before budget admission, in registration order."""

    scope: str
    runs: tuple[ContributorRun, ...]
    sections: tuple[Section, ...]
    messages: tuple[ContextMessage, ...]
    attachments: tuple[Attachment, ...]
    diagnostics: tuple[Diagnostic, ...]
    # Message/attachment id -> its contributor's declared priority: the order of budget admission
    # (the send order stays the collection order).
    priorities: Mapping[str, int] = dataclasses.field(default_factory=dict)


async def collect_detailed(
    registry: ContextContributorRegistry,
    request: ContributionRequest,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    *,
    keep_raw: bool = True,
) -> Collection:
    """Run every contributor of ``registry`` concurrently and validate their output.

    ``keep_raw`` keeps a plain copy of each raw output for the trace; without traces it is wasted work.

    A failing (error, timeout, invalid) optional contributor becomes a diagnostic; a failing protected
    one raises :class:`ProtectedContributorFailed` (an ``AssemblyFailed``) naming it, after all runs finished.
    """
    # Each contributor sees its own options only. One that declares ``runs_inline`` (the built-ins: their
    # ``contribute`` never awaits) runs in this task, after the others were started: a task and a timer of
    # its own cost more than its work, and a timeout could not interrupt code that never awaits anyway.
    contributors = list(registry)
    # One request per distinct options object: the contributors without options of their own share one
    # (the request is read-only).
    by_options: dict[int, ContributionRequest] = {}
    requests = []
    for contributor in contributors:
        options = registry.options_of(contributor.id)
        shared = by_options.get(id(options))
        if shared is None:
            shared = by_options[id(options)] = request.with_options(options)
        requests.append(shared)
    inline = [bool(c.runs_inline) for c in contributors]  # bool(): a package's value, as typed as it made it
    concurrent = asyncio.gather(
        *(
            _run_one(c, registry.is_protected(c.id), r, timeout, keep_raw)
            for c, r, here in zip(contributors, requests, inline, strict=True)
            if not here
        )
    )
    try:
        ran_here = [
            await _run_one(c, registry.is_protected(c.id), r, None, keep_raw)
            for c, r, here in zip(contributors, requests, inline, strict=True)
            if here
        ]
    except BaseException:
        concurrent.cancel()  # cancelled while an inline run awaited: the started runs go too
        raise
    elsewhere, here_runs = iter(await concurrent), iter(ran_here)
    runs = [next(here_runs) if here else next(elsewhere) for here in inline]  # registration order
    _reject_duplicate_ids(runs)
    failed_protected = [r for r in runs if r.protected and r.status != "ok"]
    if failed_protected:
        names = "; ".join(f"{r.contributor_id} ({r.status}: {r.error})" for r in failed_protected)
        raise ProtectedContributorFailed(f"protected context contributor failed: {names}", tuple(runs))
    diagnostics: list[Diagnostic] = []
    for run in runs:
        if run.status != "ok":
            diagnostics.append(Diagnostic("warning", f"contributor_{run.status}", run.error, run.contributor_id))
        diagnostics.extend(run.output.diagnostics)
    ok = [r.output for r in runs if r.status == "ok"]
    priorities = {
        item_id: registry.priority_of(run.contributor_id)
        for run in runs
        if run.status == "ok"
        for item_id in [m.id for m in run.output.messages] + [a.id for a in run.output.attachments]
    }
    return Collection(
        scope=registry.scope,
        runs=tuple(runs),
        sections=tuple(s for out in ok for s in out.sections),
        messages=tuple(m for out in ok for m in out.messages),
        attachments=tuple(a for out in ok for a in out.attachments),
        diagnostics=tuple(diagnostics),
        priorities=priorities,
    )


async def _run_one(
    contributor: Contributor,
    protected: bool,
    request: ContributionRequest,
    timeout: float | None,
    keep_raw: bool,
) -> ContributorRun:
    """One contributor's run, under ``timeout`` (``None``: an inline run, no timer)."""
    cid = contributor.id
    started = time.perf_counter()
    status: Status = "ok"
    error = ""
    raw: Any = None
    output = ContributorOutput()
    try:
        # In this task (gather made one per contributor), not one more as wait_for would make.
        async with asyncio.timeout(timeout) if timeout is not None else contextlib.nullcontext():
            raw = await contributor.contribute(request)
        output = validate_output(cid, protected, raw)
    except TimeoutError:
        status, error = "timeout", f"no output within {timeout:g}s"
    except InvalidOutput as exc:
        status, error = "invalid", str(exc)
    except Exception as exc:  # plugin code may raise anything: recorded, never swallowed
        status, error = "error", f"{type(exc).__name__}: {exc}"
    duration_ms = round((time.perf_counter() - started) * 1000, 3)
    return ContributorRun(cid, protected, status, duration_ms, error, _plain(raw) if keep_raw else None, output)


def validate_output(contributor_id: str, protected: bool, raw: Any) -> ContributorOutput:
    """Check and normalize one contributor's output; raise :class:`InvalidOutput` on any breach.

    Accepts a :class:`ContributorOutput` or a mapping with the same keys whose items are the value types
    or plain dicts (what a package without our imports would return). Sources are set to the
    contributor's ID, except an attachment's explicit ``source``, which names the data's origin.
    """
    if isinstance(raw, ContributorOutput):
        if not (raw.sections or raw.messages or raw.attachments or raw.diagnostics):
            return _NOTHING  # most contributors on most calls: nothing to check
        raw = _fields_of(raw)
    if not isinstance(raw, Mapping):
        raise InvalidOutput(f"expected ContributorOutput, got {type(raw).__name__}")
    unknown = set(raw) - {"sections", "messages", "attachments", "diagnostics"}
    if unknown:
        raise InvalidOutput(f"unknown output keys: {sorted(unknown)}")
    sections = tuple(_section(contributor_id, protected, item) for item in _items(raw, "sections"))
    messages = tuple(_message(contributor_id, item) for item in _items(raw, "messages"))
    attachments = tuple(_attachment(contributor_id, item) for item in _items(raw, "attachments"))
    diagnostics = tuple(_diagnostic(contributor_id, item) for item in _items(raw, "diagnostics"))
    _unique("section", [s.id for s in sections])
    _unique("message/attachment", [m.id for m in messages] + [a.id for a in attachments])
    return ContributorOutput(sections, messages, attachments, diagnostics)


_NOTHING = ContributorOutput()


def _items(raw: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    value = raw.get(key) or ()
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise InvalidOutput(f"{key} must be a list")
    items = []
    for item in value:
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            item = _fields_of(item)
        if not isinstance(item, Mapping):
            raise InvalidOutput(f"{key} item must be an object, got {type(item).__name__}")
        items.append(dict(item))
    return items


def _fields_of(value: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, one level deep: what is validated is read one level deep (an item's
    strings and numbers), and ``dataclasses.asdict`` copies every level, ten contributors three passes a turn."""
    return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}


def _text(item: Mapping[str, Any], key: str, what: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise InvalidOutput(f"{what} {key} must be a string, got {type(value).__name__}")
    return value


def _ident(item: Mapping[str, Any], what: str) -> str:
    value = _text(item, "id", what)
    if not _ID.fullmatch(value):
        raise InvalidOutput(f"{what} id {value!r} must match {ID_PATTERN}")
    return value


def _section(cid: str, protected: bool, item: dict[str, Any]) -> Section:
    sid = _ident(item, "section")
    slot, order = item.get("slot", 100), item.get("order", 0)
    if not (isinstance(slot, int) and isinstance(order, int)) or isinstance(slot, bool) or isinstance(order, bool):
        raise InvalidOutput(f"section {sid!r}: slot and order must be integers")
    is_protected = bool(item.get("protected", False))
    if is_protected and not protected:
        # Protection is authority: only a contributor registered as protected may claim it.
        raise InvalidOutput(f"section {sid!r} claims protection but contributor {cid!r} is not protected")
    title = item.get("title", "")
    if not isinstance(title, str):
        raise InvalidOutput(f"section {sid!r}: title must be a string")
    return Section(sid, _text(item, "text", "section"), slot, order, is_protected, title, cid)


def _message(cid: str, item: dict[str, Any]) -> ContextMessage:
    role = item.get("role", "user")
    forged = [k for k in _FORGERY_KEYS if item.get(k) is not None]
    if role != "user" or forged:
        shape = f"role {role!r}" + (f" with {', '.join(forged)}" if forged else "")
        raise InvalidOutput(f"contributor messages must be plain user messages, got {shape}")
    return ContextMessage(_ident(item, "message"), _text(item, "content", "message"), cid)


def _attachment(cid: str, item: dict[str, Any]) -> Attachment:
    aid = _ident(item, "attachment")
    trust = item.get("trust", "untrusted_data")
    if trust not in TRUST_LEVELS:
        raise InvalidOutput(f"attachment {aid!r}: trust must be one of {', '.join(TRUST_LEVELS)}, got {trust!r}")
    source = item.get("source") or cid
    if not isinstance(source, str) or not _ID.fullmatch(source):
        raise InvalidOutput(f"attachment {aid!r}: source {source!r} must match {ID_PATTERN}")
    return Attachment(aid, _text(item, "content", "attachment"), trust, source)


def _diagnostic(cid: str, item: dict[str, Any]) -> Diagnostic:
    level = item.get("level", "info")
    if level not in ("info", "warning", "error"):
        raise InvalidOutput(f"diagnostic level {level!r} must be info, warning or error")
    return Diagnostic(level, _text(item, "code", "diagnostic"), _text(item, "message", "diagnostic"), cid)


def _unique(kind: str, ids: list[str]) -> None:
    seen: set[str] = set()
    for value in ids:
        if value in seen:
            raise InvalidOutput(f"duplicate {kind} id {value!r}")
        seen.add(value)


def _reject_duplicate_ids(runs: list[ContributorRun]) -> None:
    """IDs are unique across contributors: the later one (registration order) is rejected as invalid."""
    owners: dict[tuple[str, str], str] = {}
    for i, run in enumerate(runs):
        if run.status != "ok":
            continue
        keys = [("section", s.id) for s in run.output.sections]
        keys += [("message/attachment", m.id) for m in run.output.messages]
        keys += [("message/attachment", a.id) for a in run.output.attachments]
        clash = next((k for k in keys if k in owners), None)
        if clash is not None:
            error = f"duplicate {clash[0]} id {clash[1]!r}: from {owners[clash]} and {run.contributor_id}"
            runs[i] = dataclasses.replace(run, status="invalid", error=error, output=ContributorOutput())
            continue
        owners.update(dict.fromkeys(keys, run.contributor_id))


def _plain(value: Any) -> Any:
    """The raw output as JSON-ready data (a repr where it is not), so the trace can always hold it."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    try:
        stable_json(value)
    except (TypeError, ValueError):
        return repr(value)
    return value
