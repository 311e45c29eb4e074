"""An inline SVG chart of one session: tokens per model call, the window's limit, compactions and overflows.

Drawn on the server as plain SVG (no script, no fonts fetched), so the chart shows in a page opened
from a file, in a browser with scripts off, and in a screenshot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

from proxy.report.traces import TurnSummary

__all__ = ["legend", "session_chart"]

WIDTH, HEIGHT = 760, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 14, 30
CLIENT, CANDIDATE, LIMIT, COMPACTION, OVERFLOW = "#8a8f98", "#1f6feb", "#d29922", "#8250df", "#cf222e"


def session_chart(turns: Sequence[TurnSummary]) -> str:
    """The SVG element for ``turns`` (in call order); an empty string when there is nothing to draw."""
    if not turns:
        return ""
    highest = max(
        [t.client_tokens or 0 for t in turns] + [t.candidate_tokens or 0 for t in turns] + [t.limit or 0 for t in turns]
    )
    top = _nice(max(highest, 1))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(len(turns) - 1, 1)

    def x(i: int) -> float:
        return LEFT + (i * step if len(turns) > 1 else plot_w / 2)

    def y(v: int) -> float:
        return TOP + plot_h - v / top * plot_h

    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" '
        f'aria-label="tokens per model call" xmlns="http://www.w3.org/2000/svg">'
    ]
    for k in range(5):
        value = round(top * k / 4)
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}" class="grid"/>'
            f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end" class="axis">{_short(value)}</text>'
        )
    for i, t in enumerate(turns):
        if t.size_refusal:
            parts.append(
                f'<rect x="{x(i) - 3:.1f}" y="{TOP}" width="6" height="{plot_h}" class="overflow">'
                f"<title>{escape(_label(t))}: the provider refused the input for size</title></rect>"
            )
        elif t.compaction:
            parts.append(
                f'<line x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{TOP}" y2="{TOP + plot_h}" class="compaction">'
                f"<title>{escape(_label(t))}: {escape(t.compaction)} compaction</title></line>"
            )
    parts.append(_line(turns, [t.limit for t in turns], x, y, "limit", step_line=True))
    parts.append(_line(turns, [t.client_tokens for t in turns], x, y, "client"))
    parts.append(_line(turns, [t.candidate_tokens for t in turns], x, y, "candidate"))
    ticks = sorted({0, len(turns) - 1, *range(0, len(turns), max(1, len(turns) // 8))})
    for i in ticks:
        parts.append(
            f'<text x="{x(i):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle" class="axis">{turns[i].turn}</text>'
        )
    parts.append(
        f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 4}" text-anchor="end" class="axis">model call (turn number)</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def legend() -> str:
    """The chart's key, once per page."""
    items = [
        ("client", CLIENT, "client request"),
        ("candidate", CANDIDATE, "candidate (sent, or would be in shadow)"),
        ("limit", LIMIT, "effective input limit"),
        ("compaction", COMPACTION, "compaction"),
        ("overflow", OVERFLOW, "refused for size"),
    ]
    return (
        '<p class="legend">'
        + "".join(f'<span><i style="background:{color}"></i>{escape(text)}</span>' for _, color, text in items)
        + "</p>"
    )


def _line(
    turns: Sequence[TurnSummary],
    values: Sequence[int | None],
    x: Callable[[int], float],
    y: Callable[[int], float],
    kind: str,
    step_line: bool = False,
) -> str:
    points: list[str] = []
    dots: list[str] = []
    previous: float | None = None
    for i, (turn, value) in enumerate(zip(turns, values, strict=True)):
        if value is None:
            continue
        px, py = x(i), y(value)
        if step_line and previous is not None and points:
            points.append(f"{px:.1f},{previous:.1f}")
        points.append(f"{px:.1f},{py:.1f}")
        previous = py
        if not step_line and len(turns) <= 200:
            dots.append(
                f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5" class="{kind}">'
                f"<title>{escape(_label(turn))}: {value} {kind} tokens</title></circle>"
            )
    if not points:
        return ""
    return f'<polyline class="{kind}" points="{" ".join(points)}"/>' + "".join(dots)


def _label(turn: TurnSummary) -> str:
    return f"turn {turn.turn}" + (f" (recovery {turn.recovery})" if turn.recovery else "")


def _nice(value: int) -> int:
    """A round axis maximum at or above ``value``."""
    magnitude = 10 ** (len(str(value)) - 1)
    for factor in (1, 2, 2.5, 5, 10):
        if value <= factor * magnitude:
            return int(factor * magnitude)
    return value


def _short(value: int) -> str:
    return f"{value / 1000:g}k" if value >= 1000 else str(value)
