"""The replay verdict as one self-contained HTML page: a summary, then per session and per turn the
changed calls with their diffs and token estimates.

Kept in this one module (styles included) so it can take the operator report's look later.
"""

from __future__ import annotations

from html import escape

from proxy.replay.verdict import CallVerdict, TurnVerdict, Verdict

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:72rem;color:#1d232a;padding:0 1rem}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem;border-bottom:1px solid #d0d7de}
.summary{font-size:1.05rem;padding:.6rem .9rem;border-radius:6px;background:#f3f5f7}
table{border-collapse:collapse;width:100%;margin:.5rem 0}
td,th{text-align:left;padding:.3rem .5rem;border-bottom:1px solid #eaeef2;vertical-align:top}
.identical{color:#1a7f37}.changed{color:#9a6700}.failed{color:#cf222e}
.badge{font-weight:600;text-transform:uppercase;font-size:.8rem}
pre{background:#f6f8fa;padding:.6rem;overflow-x:auto;font-size:12px;line-height:1.35}
.add{color:#1a7f37}.del{color:#cf222e}.hunk{color:#8250df}
details{margin:.3rem 0}summary{cursor:pointer}
"""


def render(verdict: Verdict, title: str = "context-proxy replay") -> str:
    """The whole page."""
    sessions = "".join(_session(name, turns) for name, turns in verdict.sessions().items())
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>"
        f"<p class='summary'>{escape(verdict.summary())}</p>{sessions}</body></html>\n"
    )


def _session(name: str, turns: list[TurnVerdict]) -> str:
    rows = "".join(_turn_row(turn) for turn in turns)
    details = "".join(_turn_details(turn) for turn in turns if turn.status != "identical")
    return (
        f"<h2>Session {escape(name)}</h2><table><tr><th>Turn</th><th>Path</th><th>Verdict</th>"
        f"<th>Tokens before</th><th>Tokens after</th><th>Why</th></tr>{rows}</table>{details}"
    )


def _turn_row(turn: TurnVerdict) -> str:
    delta = turn.tokens_after - turn.tokens_before
    return (
        f"<tr><td>{turn.number}</td><td>{escape(turn.path)}</td>"
        f"<td class='badge {turn.status}'>{turn.status}</td><td>{turn.tokens_before:,}</td>"
        f"<td>{turn.tokens_after:,} ({delta:+,})</td><td>{escape('; '.join(turn.reasons))}</td></tr>"
    )


def _turn_details(turn: TurnVerdict) -> str:
    error = f"<p class='failed'>{escape(turn.error)}</p>" if turn.error else ""
    calls = "".join(_call(call) for call in turn.calls if call.status != "identical")
    return f"<details open><summary>Turn {turn.number}: {turn.status}</summary>{error}{calls}</details>"


def _call(call: CallVerdict) -> str:
    tokens = f"{call.tokens_before if call.tokens_before is not None else '-'} -> {call.tokens_after or '-'}"
    note = f" ({escape(call.note)})" if call.note else ""
    diff = f"<pre>{_colored(call.diff)}</pre>" if call.diff else ""
    return f"<p><b>{escape(call.key)} #{call.index}</b>: {call.status}{note}, tokens {tokens}</p>{diff}"


def _colored(diff: str) -> str:
    lines = []
    for line in diff.splitlines():
        kind = "add" if line.startswith("+") else "del" if line.startswith("-") else "hunk" if line[:2] == "@@" else ""
        lines.append(f"<span class='{kind}'>{escape(line)}</span>" if kind else escape(line))
    return "\n".join(lines)
