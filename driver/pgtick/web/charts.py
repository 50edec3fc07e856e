"""Charts drawn on the server as inline SVG (no JavaScript, no chart library).

Only numbers and fixed labels go into the markup, and those are escaped too.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from markupsafe import Markup, escape

WIDTH = 600
HEIGHT = 160
PAD_LEFT = 44
PAD_BOTTOM = 20
PAD_TOP = 10


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    step = 1.0
    while step * 10 < value:
        step *= 10
    for m in (1, 2, 5, 10):
        if m * step >= value:
            return m * step
    return 10 * step


def _frame(title: str, top: float, unit: str, start: datetime, minutes: int) -> list[str]:
    plot_h = HEIGHT - PAD_BOTTOM - PAD_TOP
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}"'
        ' xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
    ]
    for i in range(3):
        y = PAD_TOP + plot_h * i / 2
        value = top * (2 - i) / 2
        parts.append(
            f'<line x1="{PAD_LEFT}" x2="{WIDTH}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{PAD_LEFT - 4}" y="{y + 4:.1f}" text-anchor="end" class="axis">'
            f"{escape(_fmt(value))}{escape(unit)}</text>"
        )
    plot_w = WIDTH - PAD_LEFT
    for i in range(0, minutes + 1, 15):
        x = PAD_LEFT + plot_w * i / minutes
        label = (start + timedelta(minutes=i)).strftime("%H:%M")
        anchor = "end" if i == minutes else "start" if i == 0 else "middle"
        parts.append(
            f'<text x="{x:.1f}" y="{HEIGHT - 4}" text-anchor="{anchor}" class="axis">{escape(label)}</text>'
        )
    return parts


def _fmt(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.1f}"


def throughput(start: datetime, completed: Sequence[int], failed: Sequence[int]) -> Markup:
    """Stacked bars per minute: completed (bottom) and failed (top)."""
    minutes = len(completed)
    top = _nice_max(max((c + f for c, f in zip(completed, failed, strict=True)), default=0))
    parts = _frame("Runs finished per minute, last hour (UTC)", top, "", start, minutes)
    plot_h = HEIGHT - PAD_BOTTOM - PAD_TOP
    bar_w = (WIDTH - PAD_LEFT) / max(minutes, 1)
    for i, (ok, bad) in enumerate(zip(completed, failed, strict=True)):
        x = PAD_LEFT + i * bar_w + 1
        ok_h = plot_h * ok / top
        bad_h = plot_h * bad / top
        base = HEIGHT - PAD_BOTTOM
        label = (start + timedelta(minutes=i)).strftime("%H:%M")
        if ok:
            parts.append(
                f'<rect x="{x:.1f}" y="{base - ok_h:.1f}" width="{bar_w - 2:.1f}" height="{ok_h:.1f}"'
                f' class="ok"><title>{escape(label)}: {ok} completed</title></rect>'
            )
        if bad:
            parts.append(
                f'<rect x="{x:.1f}" y="{base - ok_h - bad_h:.1f}" width="{bar_w - 2:.1f}"'
                f' height="{bad_h:.1f}"'
                f' class="bad"><title>{escape(label)}: {bad} failed</title></rect>'
            )
    parts.append("</svg>")
    return Markup("".join(parts))


def lateness(start: datetime, p50: Sequence[float | None], worst: Sequence[float | None]) -> Markup:
    """Start lateness (started_at - scheduled_for) per minute: median line and worst dots."""
    minutes = len(p50)
    top = _nice_max(max((v for v in worst if v is not None), default=0))
    parts = _frame("Start lateness per minute, last hour (seconds)", top, "s", start, minutes)
    plot_h = HEIGHT - PAD_BOTTOM - PAD_TOP
    step = (WIDTH - PAD_LEFT) / max(minutes, 1)
    points = []
    for i, value in enumerate(p50):
        if value is None:
            continue
        x = PAD_LEFT + (i + 0.5) * step
        points.append(f"{x:.1f},{HEIGHT - PAD_BOTTOM - plot_h * value / top:.1f}")
    if points:
        parts.append(f'<polyline points="{" ".join(points)}" class="p50"/>')
    for i, value in enumerate(worst):
        if value is None:
            continue
        x = PAD_LEFT + (i + 0.5) * step
        y = HEIGHT - PAD_BOTTOM - plot_h * value / top
        label = (start + timedelta(minutes=i)).strftime("%H:%M")
        median = p50[i] or 0.0
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" class="worst"><title>{escape(label)}: median '
            f"{median:.2f}s, worst {value:.2f}s</title></circle>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))
