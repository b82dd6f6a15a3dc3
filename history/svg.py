"""Server-side inline SVG charts (no JavaScript, no CDN): grouped bars and sparklines."""

from __future__ import annotations

from collections.abc import Sequence

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

BAR_COLOURS = ("#4c8bf5", "#f5a623", "#d0021b")


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "%":
        return f"{value * 100:.1f}%"
    return f"{value:.1f}{unit}"


def bar_chart(
    rows: Sequence[tuple[str, Sequence[float | None]]],
    *,
    series: Sequence[str],
    unit: str = "s",
    width: int = 560,
    title: str = "",
) -> SafeString:
    """Horizontal grouped bars: one group per row label, one bar per series, values labelled."""
    label_w, bar_h, gap = 130, 12, 10
    group_h = bar_h * len(series) + gap
    legend_h = 18
    height = legend_h + max(1, len(rows)) * group_h + 4
    peak = max((v for _, values in rows for v in values if v is not None), default=0.0) or 1.0
    plot_w = width - label_w - 70
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
        f'role="img" aria-label="{escape(title)}">'
    ]
    for i, name in enumerate(series):
        x = label_w + i * 80
        parts.append(f'<rect x="{x}" y="3" width="10" height="10" fill="{BAR_COLOURS[i % 3]}"/>')
        parts.append(f'<text x="{x + 14}" y="12" font-size="11">{escape(name)}</text>')
    for r, (label, values) in enumerate(rows):
        y0 = legend_h + r * group_h
        parts.append(
            f'<text x="{label_w - 6}" y="{y0 + group_h / 2}" font-size="12" text-anchor="end" '
            f'dominant-baseline="middle">{escape(label)}</text>'
        )
        for i, value in enumerate(values):
            y = y0 + i * bar_h
            if value is None:
                parts.append(f'<text x="{label_w + 2}" y="{y + bar_h - 2}" font-size="10">n/a</text>')
                continue
            w = max(1.0, plot_w * value / peak)
            parts.append(
                f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h - 2}" '
                f'fill="{BAR_COLOURS[i % 3]}"><title>{escape(label)} {escape(series[i])}: '
                f"{escape(_fmt(value, unit))}</title></rect>"
            )
            text = escape(_fmt(value, unit))
            parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + bar_h - 3}" font-size="10">{text}</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every interpolated text is escaped above


def sparkline(values: Sequence[int | float], *, width: int = 160, height: int = 28) -> SafeString:
    """A polyline of the values, scaled to the box; the last point is marked."""
    if not values:
        return mark_safe("")
    peak = max(values) or 1
    step = width / max(1, len(values) - 1)
    points = " ".join(
        f"{i * step:.1f},{height - 2 - (height - 4) * v / peak:.1f}" for i, v in enumerate(values)
    )
    last_x, last_y = points.split(" ")[-1].split(",")
    return mark_safe(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="spark" width="{width}" height="{height}" role="img" '
        f'aria-label="requests over the window"><polyline fill="none" stroke="#4c8bf5" stroke-width="1.5" '
        f'points="{points}"/><circle cx="{last_x}" cy="{last_y}" r="2" fill="#4c8bf5"/></svg>'
    )


LINE_COLOURS = ("#4c8bf5", "#f5a623")


def line_chart(
    series: Sequence[tuple[str, Sequence[int | float]]],
    *,
    title: str,
    span_label: str,
    width: int = 420,
    height: int = 90,
) -> SafeString:
    """Lines over one shared x axis (the values' index) and y axis from 0: current against proposed."""
    legend_h, axis_w, bottom = 16, 34, 14
    plot_w, plot_h = width - axis_w - 4, height - legend_h - bottom
    peak = max((v for _, values in series for v in values), default=0) or 1
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
        f'role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    for i, (name, values) in enumerate(series):
        colour = LINE_COLOURS[i % len(LINE_COLOURS)]
        x = axis_w + i * 90
        parts.append(f'<rect x="{x}" y="3" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{x + 14}" y="12" font-size="11">{escape(name)}</text>')
        if not values:
            continue
        step = plot_w / max(1, len(values) - 1)
        top = legend_h + plot_h
        points = " ".join(
            f"{axis_w + k * step:.1f},{top - plot_h * v / peak:.1f}" for k, v in enumerate(values)
        )
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}"/>')
    parts.append(
        f'<text x="{axis_w - 4}" y="{legend_h + 8}" font-size="10" text-anchor="end">{peak:g}</text>'
        f'<text x="{axis_w - 4}" y="{legend_h + plot_h}" font-size="10" text-anchor="end">0</text>'
        f'<line x1="{axis_w}" y1="{legend_h + plot_h}" x2="{axis_w + plot_w}" y2="{legend_h + plot_h}" '
        f'stroke="#999"/><text x="{axis_w}" y="{height - 2}" font-size="10">{escape(span_label)}</text>'
        f'<text x="{axis_w + plot_w}" y="{height - 2}" font-size="10" text-anchor="end">end</text></svg>'
    )
    return mark_safe("".join(parts))  # every interpolated text is escaped above
