"""The report's HTML: an overview of sessions, and per session a chart, a turn table and lazily drawn turns.

One self-contained document: CSS and script inline, data embedded as JSON, nothing fetched (the page
forbids it in its own Content-Security-Policy), so it opens from a file on an air-gapped host. The
turn table is HTML; a turn's detail (whole provider inputs included) is drawn by the script from its
session's embedded JSON only when the turn is opened, so a page of thousands of turns stays small and
fast. Every value from a trace is escaped here or set as text by the script, never parsed as markup.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from html import escape
from importlib import resources
from typing import Any

from proxy.report.chart import legend, session_chart
from proxy.report.traces import SessionSummary, TraceFolder, group_sessions

__all__ = ["document", "overview", "session_section", "static_report"]

CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
    "connect-src 'none'; form-action 'self'; base-uri 'none'"
)


def _asset(name: str) -> str:
    return resources.files("proxy.report").joinpath(name).read_text(encoding="utf-8")


def _json_script(value: Any, **attributes: str) -> str:
    """``value`` as a JSON data block; ``<`` escaped so no text in it can close the element."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).replace("<", "\\u003c")
    extra = "".join(f' {k.rstrip("_").replace("_", "-")}="{escape(v)}"' for k, v in attributes.items())
    return f'<script type="application/json"{extra}>{text}</script>'


def document(title: str, body: str, data: Mapping[str, Any]) -> str:
    """A whole page: ``body`` with the summary ``data`` (``#report-data``), the style and the script."""
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_asset('report.css')}</style></head><body>"
        f"{body}{_json_script(dict(data), id='report-data')}<script>{_asset('report.js')}</script></body></html>\n"
    )


def _tokens(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}"


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _usd(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.4f}"


def _session_cost(session: SessionSummary) -> str:
    """The session's cost cell: dollars, or "unknown" (with what is known in its title) when a call's is."""
    if session.cost_usd is not None:
        return f'<td class="n" data-key="costUsd">{_usd(session.cost_usd)}</td>'
    title = (
        f"{session.unpriced_calls} of {len(session.turns)} calls without a known cost (no price for the model, "
        f"or no usage from the provider); the others cost {_usd(session.known_cost_usd)}"
    )
    return f'<td class="n unknown" data-key="costUsd" title="{escape(title)}">unknown</td>'


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if timestamp else "—"


def overview(sessions: Iterable[SessionSummary], link: Callable[[SessionSummary], str]) -> str:
    """The overview table: one row per session, linking to its section or page."""
    rows = []
    for s in sessions:
        cells = [
            f'<td class="id"><a href="{escape(link(s))}">{escape(s.context_id)}</a></td>',
            f"<td>{escape(', '.join(s.modes))}</td>",
            f"<td>{escape(', '.join(s.scopes))}</td>",
            f'<td class="n" data-key="modelCalls">{len(s.turns)}</td>',
            f'<td class="n" data-key="clientTokens">{_tokens(s.client_tokens)}</td>',
            f'<td class="n" data-key="proxyTokens">{_tokens(s.proxy_tokens)}</td>',
            f'<td class="n" data-key="savings">{_share(s.savings)}</td>',
            f'<td class="n" data-key="cacheShare">{_share(s.cache_share)}</td>',
            _session_cost(s),
            f'<td class="n" data-key="passthroughUsd">{_usd(s.passthrough_usd)}</td>',
            f'<td class="n" data-key="compactions">{s.compactions}</td>',
            f'<td class="n" data-key="summarizerCalls">{s.summarizer_calls}</td>',
            f'<td class="n{" bad" if s.size_refusals else ""}" data-key="sizeRefusals">{s.size_refusals}</td>',
            f'<td class="n{" bad" if s.assembly_failures else ""}" data-key="assemblyFailures">'
            f"{s.assembly_failures}</td>",
            f'<td class="n" data-key="assemblyP50Ms">{_ms(s.assembly_ms(0.5))}</td>',
            f'<td class="n" data-key="assemblyP95Ms">{_ms(s.assembly_ms(0.95))}</td>',
            f"<td>{_when(s.last_activity)}</td>",
        ]
        rows.append(f'<tr class="session" data-context-id="{escape(s.context_id)}">{"".join(cells)}</tr>')
    head = (
        "<tr><th>context id</th><th>mode</th><th>scope</th><th>model calls</th><th>client tokens</th>"
        '<th title="sent in dynamic; would have been sent in shadow">proxy tokens</th><th>savings</th>'
        '<th title="of the prompt tokens the provider billed, the share it read from its prompt cache">cache share</th>'
        '<th title="at litellm\'s prices, summarizer calls included">cost</th>'
        '<th title="the client\'s own requests at the same prices, as if each read the previous one from the cache">'
        "passthrough cost (est.)</th>"
        "<th>compactions</th><th>summarizer calls</th><th>refused for size</th><th>assembly failures</th>"
        "<th>assembly p50 ms</th><th>assembly p95 ms</th><th>last activity</th></tr>"
    )
    return f'<table class="overview"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def _turn_row(turn: Any, raw_link: str | None) -> str:
    events = []
    if turn.compaction:
        events.append(f'<span class="tag compaction">{escape(turn.compaction)} compaction</span>')
    if turn.new_checkpoint:
        events.append('<span class="tag">new checkpoint</span>')
    if turn.recovery:
        events.append(f'<span class="tag">recovery {turn.recovery}</span>')
    if turn.provider_error:
        events.append(f'<span class="tag bad">{escape(turn.provider_error)}</span>')
    if turn.assembly_error:
        events.append('<span class="tag bad">assembly failed</span>')
    raw = f' <a class="raw" href="{escape(raw_link)}">trace</a>' if raw_link else ""
    return (
        f'<tr class="turn" tabindex="0" data-file="{escape(turn.file)}">'
        f"<td>{turn.turn}{'.' + str(turn.recovery) if turn.recovery else ''}</td>"
        f"<td>{'' if turn.branch_turn is None else turn.branch_turn}</td><td>{escape(turn.mode)}</td>"
        f'<td class="n">{_tokens(turn.client_tokens)}</td><td class="n">{_tokens(turn.candidate_tokens)}</td>'
        f'<td class="n">{_tokens(turn.limit)}</td><td class="n">{turn.summarizer_calls}</td>'
        f'<td class="n">{_ms(turn.assembly_ms)}</td><td class="n">{_ms(turn.provider_ms)}</td>'
        f'<td class="n">{_share(turn.cache_share)}</td><td class="n">{_usd(turn.cost_usd)}</td>'
        f"<td>{''.join(events)}{raw}</td></tr>"
    )


def session_section(
    session: SessionSummary,
    folder: TraceFolder,
    anchor: str,
    raw_link: Callable[[str], str] | None = None,
) -> str:
    """A session's chart, turn table and (when the folder was read with details) its turns' data."""
    values = folder.values.get(session.context_id)
    details = {t.file: folder.details[t.file] for t in session.turns if t.file in folder.details}
    data = _json_script({"values": values.items if values else [], "turns": details}, class_="detail")
    rows = "".join(_turn_row(t, raw_link(t.file) if raw_link else None) for t in session.turns)
    head = (
        "<tr><th>turn</th><th>branch turn</th><th>mode</th><th>client tokens</th><th>candidate tokens</th>"
        "<th>limit</th><th>summarizer calls</th><th>assembly ms</th><th>provider ms</th><th>cache share</th>"
        "<th>cost</th><th>events</th></tr>"
    )
    note = "" if details else '<p class="note">Turn details are not in this page.</p>'
    return (
        f'<section class="session" id="{escape(anchor)}" data-context-id="{escape(session.context_id)}">'
        f"<h2>{escape(session.context_id)}</h2>"
        f'<p class="meta">{escape(", ".join(session.modes))} · {escape(", ".join(session.scopes))} · '
        f"{escape(', '.join(session.models))} · {len(session.turns)} model calls · "
        f"savings {_share(session.savings)} · cache share {_share(session.cache_share)} · "
        f"cost {_usd(session.cost_usd)} · passthrough (est.) {_usd(session.passthrough_usd)}</p>"
        f"{session_chart(session.turns)}{note}"
        f'<table class="turns"><thead>{head}</thead><tbody>{rows}</tbody></table>{data}</section>'
    )


def summary_data(folder: TraceFolder, sessions: list[SessionSummary]) -> dict[str, Any]:
    """The numbers the page shows, for the page's own script and for anyone parsing the page."""
    return {
        "traceFiles": len(folder.turns) + len(folder.unreadable),
        "unreadable": folder.unreadable,
        "sessions": [{**s.as_json(), "turns": [t.as_json() for t in s.turns]} for s in sessions],
    }


def _header(title: str, folder: TraceFolder, sessions: list[SessionSummary], extra: str = "") -> str:
    unreadable = (
        f'<p class="note">skipped {len(folder.unreadable)} files named turn-*.json that are not readable traces: '
        f"{escape(', '.join(folder.unreadable[:10]))}{' …' if len(folder.unreadable) > 10 else ''}</p>"
        if folder.unreadable
        else ""
    )
    return (
        f'<header><h1>{escape(title)}</h1><p class="meta">{len(sessions)} sessions · {len(folder.turns)} model calls'
        f" · generated {_when(datetime.now(UTC).timestamp())}{extra}</p>{unreadable}</header>"
    )


def static_report(folder: TraceFolder, title: str) -> str:
    """The whole report of ``folder`` as one self-contained page."""
    sessions = group_sessions(folder.turns)
    anchors = {s.context_id: f"s{i}" for i, s in enumerate(sessions)}
    body = (
        _header(title, folder, sessions, f" · from {escape(str(folder.root))}")
        + "<main><h2>Sessions</h2>"
        + overview(sessions, lambda s: "#" + anchors[s.context_id])
        + legend()
        + '<p class="note">Open a turn (click its row) to see its sections, items, window, checkpoint, and the '
        "candidate beside what was sent. Long texts are cut in this page; the trace files hold them whole.</p>"
        + "".join(session_section(s, folder, anchors[s.context_id]) for s in sessions)
        + "</main>"
    )
    return document(title, body, summary_data(folder, sessions))
