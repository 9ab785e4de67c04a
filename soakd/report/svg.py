"""Small, dependency-free SVG plotting primitives for the offline HTML reports.

Everything returns an ``<svg>`` string that needs no script, font download or stylesheet to
render (colours are inline), so a report stays one self-contained file.

``line_chart`` is the workhorse: several series on one x axis, with horizontal threshold
lines, vertical markers and shaded spans. Long series are reduced to at most
``max_points`` per series with min/max bucketing, so spikes survive and a 24-hour run draws
as fast as a one-minute one. Points whose x or y is NaN break the line (no interpolation
across gaps).

Example::

    from soakd.report.svg import Series, HLine, line_chart
    svg = line_chart(
        [Series("rss", t, rss_mb), Series("floor", wt, floors, dash="4 3")],
        x_label="time (s)", y_label="MB", hlines=[HLine(1024, "limit")],
    )
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

PALETTE: tuple[str, ...] = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
"""Default series colours, in order (colour-blind friendly 'tab10')."""


@dataclass(frozen=True, slots=True)
class Series:
    """One series: ``x`` and ``y`` of equal length (NaN breaks the line).

    ``kind`` is ``"line"`` (a polyline), ``"step"`` (held until the next point) or
    ``"points"`` (a small mark per point, e.g. error frames).
    """

    name: str
    x: ArrayLike
    y: ArrayLike
    color: str | None = None
    dash: str | None = None  # SVG stroke-dasharray, e.g. "4 3"
    width: float = 1.5
    kind: Literal["line", "step", "points"] = "line"
    #: False for a reference line (a tolerance): the y axis grows by at most
    #: ``line_chart(reach=...)`` x the data's span to take it in, and it is cut where it
    #: leaves the plot area
    scale: bool = True
    #: a line with a mark on each point too (few points, each one measured: a sweep)
    markers: bool = False


@dataclass(frozen=True, slots=True)
class HLine:
    """A horizontal reference line (a threshold) at ``y``."""

    y: float
    label: str = ""
    color: str = "#d62728"
    dash: str | None = "6 4"
    #: where the label sits: at the plot's right end ("end") or its left ("start")
    anchor: Literal["start", "end"] = "end"


@dataclass(frozen=True, slots=True)
class VLine:
    """A vertical marker (warm-up end, an OOM, an error) at ``x``; ``tick``: only a short
    mark at the top of the plot area (one of many events: full-height lines would hide the
    data), its label a tooltip."""

    x: float
    label: str = ""
    color: str = "#7f7f7f"
    dash: str | None = "3 3"
    tick: bool = False


@dataclass(frozen=True, slots=True)
class Span:
    """A shaded x range (e.g. the warm-up window)."""

    x0: float
    x1: float
    label: str = ""
    color: str = "#000000"
    opacity: float = 0.06


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values (1, 2, 2.5, 5 x 10^k steps) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        return [lo]
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = mag * 10
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            step = m * mag
            break
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    i = first
    while i * step <= hi + step * 1e-9:  # multiples of the step: no drift from adding
        v = round(i * step, 12)
        ticks.append(0.0 if abs(v) < step * 1e-9 else float(v))
        i += 1
    return ticks


def fmt_num(v: float) -> str:
    """A short label for a tick value: ``1.5k``, ``20``, ``0.25``, ``3M``."""
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:g}G"
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    if a >= 100 or a == 0:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.3g}"
    return f"{v:.2g}"


def tick_labels(ticks: Sequence[float]) -> list[str]:
    """Labels for evenly spaced ticks, as short as ``fmt_num``'s but with as many decimals
    as the step needs, so no two ticks read the same (``112.2 / 112.4``, never ``112 /
    112``); one unit suffix (k, M, G) for the whole axis, chosen by its largest value."""
    if len(ticks) < 2:
        return [fmt_num(t) for t in ticks]
    step = min(abs(b - a) for a, b in itertools.pairwise(ticks)) or 1.0
    top = max(abs(t) for t in ticks)
    div, suffix = next(
        ((d, u) for d, u in ((1e9, "G"), (1e6, "M"), (1e4, "k")) if top >= d), (1.0, "")
    )
    div = 1e3 if suffix == "k" else div
    for decimals in range(0, 13):
        labels = [f"{t / div:.{decimals}f}" for t in ticks]
        if len(set(labels)) == len(labels) and all(
            abs(float(lb) * div - t) <= step * 1e-3 for lb, t in zip(labels, ticks, strict=True)
        ):
            break
    return [("0" if float(lb) == 0 else lb) + ("" if float(lb) == 0 else suffix) for lb in labels]


#: advance widths of ASCII 32..126 in 1/1000 em (Helvetica's, the metric of Arial)
_ADVANCE = (
    278, 278, 355, 556, 556, 889, 667, 191, 333, 333, 389, 584, 278, 333, 278, 278, 556, 556,
    556, 556, 556, 556, 556, 556, 556, 556, 278, 278, 584, 584, 584, 556, 1015, 667, 667, 722,
    722, 667, 611, 778, 722, 278, 500, 667, 556, 833, 722, 778, 667, 778, 722, 667, 611, 722,
    667, 944, 667, 667, 611, 278, 278, 278, 469, 556, 333, 556, 556, 500, 556, 556, 278, 556,
    556, 222, 222, 500, 222, 833, 556, 556, 556, 556, 333, 500, 278, 556, 500, 722, 500, 500,
    500, 334, 260, 334, 584,
)  # fmt: skip
#: sans-serif fonts a browser may pick (DejaVu Sans on most Linux) run wider than Arial
_WIDE = 1.18


def text_width(text: str, size: float = 11.0) -> float:
    """An upper estimate of ``text``'s width in px at ``size`` px in a sans-serif font
    (Arial metrics, widened for the wider fonts a browser may substitute; other
    characters count as an em): what the legend is spaced by."""
    units = sum(_ADVANCE[ord(c) - 32] if 32 <= ord(c) < 127 else 1000 for c in text)
    return units * size * _WIDE / 1000.0


def decimate(x: ArrayLike, y: ArrayLike, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Reduce a series to at most about ``max_points`` points, keeping each bucket's min and
    max (in time order) so spikes and floors stay visible. NaN points are kept as breaks."""
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    n = min(len(xa), len(ya))
    xa, ya = xa[:n], ya[:n]
    if n <= max_points or max_points < 4:
        return xa, ya
    buckets = max_points // 2
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    out_x: list[np.ndarray] = []
    out_y: list[np.ndarray] = []
    finite = np.isfinite(ya)
    for a, b in itertools.pairwise(edges.tolist()):
        if b <= a:
            continue
        seg = ya[a:b]
        ok = finite[a:b]
        if not ok.any():
            out_x.append(xa[a : a + 1])
            out_y.append(np.array([np.nan]))
            continue
        idx = np.flatnonzero(ok)
        i_min = idx[np.argmin(seg[idx])]
        i_max = idx[np.argmax(seg[idx])]
        pick = np.unique(np.array([i_min, i_max])) + a
        out_x.append(xa[pick])
        out_y.append(ya[pick])
    return np.concatenate(out_x), np.concatenate(out_y)


class _Scale:
    def __init__(self, lo: float, hi: float, p0: float, p1: float) -> None:
        if hi == lo:
            pad = abs(lo) * 0.05 or 1.0
            lo, hi = lo - pad, hi + pad
        self.lo, self.hi, self.p0, self.p1 = lo, hi, p0, p1
        self.k = (p1 - p0) / (hi - lo)

    def __call__(self, v: np.ndarray) -> np.ndarray:
        return self.p0 + (v - self.lo) * self.k

    def one(self, v: float) -> float:
        return self.p0 + (v - self.lo) * self.k


def _path_d(px: np.ndarray, py: np.ndarray, step: bool) -> str:
    parts: list[str] = []
    pen_down = False
    for xv, yv in zip(px.tolist(), py.tolist(), strict=True):
        if not (math.isfinite(xv) and math.isfinite(yv)):
            pen_down = False
            continue
        if not pen_down:
            parts.append(f"M{xv:.1f},{yv:.1f}")
            pen_down = True
        elif step:
            parts.append(f"H{xv:.1f}V{yv:.1f}")
        else:
            parts.append(f"L{xv:.1f},{yv:.1f}")
    return "".join(parts)


def _data_range(arrays: Sequence[np.ndarray], extra: Sequence[float]) -> tuple[float, float]:
    lo, hi = math.inf, -math.inf
    for a in arrays:
        f = a[np.isfinite(a)]
        if f.size:
            lo, hi = min(lo, float(f.min())), max(hi, float(f.max()))
    for v in extra:
        if math.isfinite(v):
            lo, hi = min(lo, v), max(hi, v)
    if not math.isfinite(lo):
        return 0.0, 1.0
    return lo, hi


def line_chart(
    series: Sequence[Series],
    *,
    x_label: str = "",
    y_label: str = "",
    title: str | None = None,
    width: int = 900,
    height: int = 220,
    hlines: Sequence[HLine] = (),
    vlines: Sequence[VLine] = (),
    spans: Sequence[Span] = (),
    x_range: tuple[float, float] | None = None,
    y_range: tuple[float, float] | None = None,
    y_zero: bool = False,
    max_points: int = 2000,
    panel_id: str | None = None,
    legend: bool = True,
    reach: float = 1.0,
    x_ticks: Sequence[float] | None = None,
) -> str:
    """Render series as an inline ``<svg>`` line chart and return its markup.

    ``x_range`` pins the x axis (pass the same range to several charts to time-align them);
    ``y_range`` pins the y axis, ``y_zero`` includes 0 in it; a series with ``scale=False``
    (a tolerance line) widens it by at most ``reach`` x the data's span and is cut at the
    plot area's edge. ``x_ticks`` sets the x axis's ticks (a sweep's values) instead of
    round steps. ``panel_id`` becomes the ``data-panel`` attribute (tests and scripts
    find panels by it). Each drawn series is a ``<path class="series" data-series="NAME">``;
    a series with no finite point is listed in the legend as "(no data)" and not drawn. The
    legend sits between the title and the plot area, its entries spaced by their text's
    width and wrapped onto more rows (the chart grows by them, the plot area keeps its
    height).
    """
    left, right, bottom = 64, 16, 36
    prepared = [(s, *decimate(s.x, s.y, max_points)) for s in series]
    colors = [s.color or PALETTE[i % len(PALETTE)] for i, s in enumerate(series)]
    items = _legend_items(prepared, colors, width - left - right - 8) if legend else []
    rows = max((it.row for it in items), default=-1) + 1
    heads = wrap_text(title, width - left - right, _TITLE_SIZE) if title else []
    head = 12 + _TITLE_ROW * len(heads) if heads else 12
    top = head + _LEGEND_ROW * rows
    box = _Box(left, top, width - left - right, height - (26 if title else 12) - bottom)
    height = int(top + box.h + bottom)
    sx, sy = _scales(prepared, box, hlines, vlines, x_range, y_range, y_zero, reach)
    clip = f"clip-{panel_id or id(series)}"
    out = _frame(box, width, height, title, heads, y_label, panel_id, clip)
    out += [_span(sp, sx, box) for sp in spans]
    out.extend(_axes(sx, sy, left, top, int(box.w), int(box.h), x_label, y_label, x_ticks))
    out.append(f'<g clip-path="url(#{escape(clip)})">')
    for (s, xs, ys), color in zip(prepared, colors, strict=True):
        if not s.scale:
            xs, ys = clip_y(xs, ys, sy.lo, sy.hi)
        out.append(_draw_series(s, sx(xs), sy(ys), color))
    out += [_hline(h, sy, box) for h in hlines]
    out += [_vline(v, sx, box) for v in vlines]
    out.append("</g>")
    if items:
        out.append(_legend(items, left + 8, head))
    out.append("</svg>")
    return "".join(out)


def clip_y(x: np.ndarray, y: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """The polyline (x, y) cut to lo <= y <= hi: each segment is clipped at the bounds (a
    NaN breaks the line where it leaves and comes back), so a reference line steeper than
    the data stops at the plot area's edge instead of running out of it."""
    out_x: list[float] = []
    out_y: list[float] = []
    pts = [(a, b) for a, b in zip(x.tolist(), y.tolist(), strict=True)]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if not all(math.isfinite(v) for v in (x0, y0, x1, y1)):
            continue
        dy = y1 - y0
        if dy == 0:
            t_in, t_out = (0.0, 1.0) if lo <= y0 <= hi else (1.0, 0.0)
        else:
            ta, tb = (lo - y0) / dy, (hi - y0) / dy
            t_in, t_out = max(0.0, min(ta, tb)), min(1.0, max(ta, tb))
        if t_in > t_out:
            continue
        a = (x0 + t_in * (x1 - x0), y0 + t_in * dy)
        b = (x0 + t_out * (x1 - x0), y0 + t_out * dy)
        if out_x and (out_x[-1], out_y[-1]) != a:
            out_x.append(math.nan)
            out_y.append(math.nan)
        if not out_x or (out_x[-1], out_y[-1]) != a:
            out_x.append(a[0])
            out_y.append(a[1])
        out_x.append(b[0])
        out_y.append(b[1])
    return np.array(out_x, dtype=np.float64), np.array(out_y, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class _Box:
    """The plot area inside a chart: its top-left corner, width and height in px."""

    left: float
    top: float
    w: float
    h: float


def _scales(
    prepared: Sequence[tuple[Series, np.ndarray, np.ndarray]],
    box: _Box,
    hlines: Sequence[HLine],
    vlines: Sequence[VLine],
    x_range: tuple[float, float] | None,
    y_range: tuple[float, float] | None,
    y_zero: bool,
    reach: float = 1.0,
) -> tuple[_Scale, _Scale]:
    """Data -> pixel scales: pinned ranges as given, else the data's (and the lines'),
    widened towards the reference series (``scale=False``) by at most ``reach`` x its
    span."""
    if x_range is None:
        x_lo, x_hi = _data_range([p[1] for p in prepared], [v.x for v in vlines])
    else:
        x_lo, x_hi = x_range
    if y_range is None:
        extra = [h.y for h in hlines] + ([0.0] if y_zero else [])
        y_lo, y_hi = _data_range([p[2] for p in prepared if p[0].scale], extra)
        refs = [p[2] for p in prepared if not p[0].scale]
        if refs:
            r_lo, r_hi = _data_range(refs, [y_lo, y_hi])
            span = (y_hi - y_lo) or abs(y_hi) * 0.05 or 1.0
            y_lo, y_hi = max(r_lo, y_lo - reach * span), min(r_hi, y_hi + reach * span)
        pad = (y_hi - y_lo) * 0.05
        y_lo, y_hi = (y_lo if y_zero and y_lo == 0 else y_lo - pad), y_hi + pad
    else:
        y_lo, y_hi = y_range
    sx = _Scale(x_lo, x_hi, box.left, box.left + box.w)
    sy = _Scale(y_lo, y_hi, box.top + box.h, box.top)
    return sx, sy


_TITLE_SIZE = 13.0  # px, bold
_TITLE_ROW = 16  # px per title line


def wrap_text(text: str, avail: float, size: float = 11.0) -> list[str]:
    """``text`` in lines no wider than ``avail`` px at ``size`` px (``text_width``'s
    estimate, bold counted 8 % wider), broken at spaces; a word wider than a line is a line
    of its own."""
    lines: list[str] = []
    for word in text.split(" "):
        trial = f"{lines[-1]} {word}" if lines else word
        if lines and text_width(trial, size) * 1.08 <= avail:
            lines[-1] = trial
        else:
            lines.append(word)
    return lines


def _frame(
    box: _Box, width: int, height: int, title: str | None, heads: Sequence[str],
    y_label: str, panel_id: str | None, clip: str,
) -> list[str]:  # fmt: skip
    """The ``<svg>`` opening, its title, the plot area and the clip path of the data."""
    attrs = f' data-panel="{escape(panel_id)}"' if panel_id else ""
    label = escape(title or y_label or "chart")
    left, top, pw, ph = box.left, box.top, box.w, box.h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{label}"{attrs} font-family="sans-serif" font-size="11">',
        f"<title>{label}</title>",
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#ffffff" stroke="#cccccc"/>',
    ]
    for i, line in enumerate(heads):
        out.append(
            f'<text class="title" x="{left}" y="{16 + _TITLE_ROW * i}" font-size="13" '
            f'font-weight="bold">{escape(line)}</text>'
        )
    out.append(
        f'<clipPath id="{escape(clip)}"><rect x="{left}" y="{top}" width="{pw}" '
        f'height="{ph}"/></clipPath>'
    )
    return out


def _span(sp: Span, sx: _Scale, box: _Box) -> str:
    x0, x1 = sorted((sx.one(sp.x0), sx.one(sp.x1)))
    x0, x1 = max(x0, box.left), min(x1, box.left + box.w)
    if x1 <= x0:
        return ""
    return (
        f'<rect class="span" x="{x0:.1f}" y="{box.top}" width="{x1 - x0:.1f}" '
        f'height="{box.h}" fill="{sp.color}" fill-opacity="{sp.opacity}">'
        f"<title>{escape(sp.label)}</title></rect>"
    )


def _hline(h: HLine, sy: _Scale, box: _Box) -> str:
    yy = sy.one(h.y)
    dash = f' stroke-dasharray="{h.dash}"' if h.dash else ""
    line = (
        f'<line class="hline" x1="{box.left}" x2="{box.left + box.w}" y1="{yy:.1f}" '
        f'y2="{yy:.1f}" stroke="{h.color}"{dash}/>'
    )
    if not h.label:
        return line
    # above the line, or below it when that would leave the plot area
    ty = yy - 3 if yy - 3 >= box.top + 11 else yy + 12
    tx = box.left + box.w - 4 if h.anchor == "end" else box.left + 4
    return line + (
        f'<text class="hlabel" x="{tx}" y="{ty:.1f}" text-anchor="{h.anchor}" '
        f'fill="{h.color}" stroke="#ffffff" stroke-width="3" paint-order="stroke">'
        f"{escape(h.label)}</text>"
    )


def _vline(v: VLine, sx: _Scale, box: _Box) -> str:
    xx = sx.one(v.x)
    if v.tick:
        return (
            f'<line class="vtick" x1="{xx:.1f}" x2="{xx:.1f}" y1="{box.top}" '
            f'y2="{box.top + 8}" stroke="{v.color}"><title>{escape(v.label)}</title></line>'
        )
    dash = f' stroke-dasharray="{v.dash}"' if v.dash else ""
    line = (
        f'<line class="vline" x1="{xx:.1f}" x2="{xx:.1f}" y1="{box.top}" '
        f'y2="{box.top + box.h}" stroke="{v.color}"{dash}><title>{escape(v.label)}'
        "</title></line>"
    )
    if not v.label:
        return line
    short = v.label  # as much as the plot's height holds (the whole text is the tooltip)
    if text_width(short, 10.0) > box.h - 8:
        n = len(short)
        while n > 8 and text_width(short[:n] + "…", 10.0) > box.h - 8:
            n -= 1
        short = short[:n].rstrip() + "…"
    # the label runs down the inside of the line, from the top of the plot area
    return line + (
        f'<text class="vlabel" x="{xx + 3:.1f}" y="{box.top + 4}" fill="{v.color}" '
        f'font-size="10" transform="rotate(90 {xx + 3:.1f} {box.top + 4})">'
        f"{escape(short)}</text>"
    )


def _draw_series(s: Series, px: np.ndarray, py: np.ndarray, color: str) -> str:
    name = escape(s.name)
    if s.kind == "points":
        ok = np.isfinite(px) & np.isfinite(py)
        marks = "".join(
            f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2.5"/>'
            for a, b in zip(px[ok].tolist(), py[ok].tolist(), strict=True)
        )
        return f'<g class="series" data-series="{name}" fill="{color}">{marks}</g>'
    d = _path_d(px, py, s.kind == "step")
    if not d:
        return ""
    dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
    path = (
        f'<path class="series" data-series="{name}" d="{d}" fill="none" '
        f'stroke="{color}" stroke-width="{s.width}"{dash} stroke-linejoin="round"/>'
    )
    if not s.markers:
        return path
    ok = np.isfinite(px) & np.isfinite(py)
    marks = "".join(
        f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3"/>'
        for a, b in zip(px[ok].tolist(), py[ok].tolist(), strict=True)
    )
    return path + f'<g class="markers" data-series="{name}" fill="{color}">{marks}</g>'


def _axes(
    sx: _Scale, sy: _Scale, left: int, top: int, pw: int, ph: int, x_label: str, y_label: str,
    x_ticks: Sequence[float] | None = None,
) -> list[str]:  # fmt: skip
    out = ['<g class="axes" fill="#444444" stroke="none">']
    xt = list(x_ticks) if x_ticks is not None else nice_ticks(sx.lo, sx.hi, max(2, pw // 90))
    labels = [fmt_num(t) for t in xt] if x_ticks is not None else tick_labels(xt)
    for t, label in zip(xt, labels, strict=True):
        xx = sx.one(t)
        out.append(
            f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top}" y2="{top + ph}" stroke="#eeeeee"/>'
        )
        out.append(f'<text x="{xx:.1f}" y="{top + ph + 14}" text-anchor="middle">{label}</text>')
    yt = nice_ticks(sy.lo, sy.hi, max(2, ph // 40))
    for t, label in zip(yt, tick_labels(yt), strict=True):
        yy = sy.one(t)
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eeeeee"/>'
        )
        out.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{label}</text>')
    if x_label:
        out.append(
            f'<text x="{left + pw / 2:.0f}" y="{top + ph + 30}" text-anchor="middle">'
            f"{escape(x_label)}</text>"
        )
    if y_label:
        cy = top + ph / 2
        out.append(
            f'<text x="14" y="{cy:.0f}" text-anchor="middle" '
            f'transform="rotate(-90 14 {cy:.0f})">{escape(y_label)}</text>'
        )
    out.append("</g>")
    return out


_LEGEND_ROW = 15  # px per legend row
_LEGEND_GAP = 14  # px between one entry's text and the next entry's swatch
_SWATCH = 14  # px of an entry's swatch and the space after it


@dataclass(frozen=True, slots=True)
class LegendItem:
    """One legend entry: its text, colour, row and x offset (px from the legend's left)
    and the width its swatch and text take."""

    text: str
    color: str
    dash: str | None
    row: int
    x: float
    w: float


def _legend_items(
    prepared: Sequence[tuple[Series, np.ndarray, np.ndarray]], colors: Sequence[str],
    avail: float,
) -> list[LegendItem]:  # fmt: skip
    """Entries laid out left to right, each after the previous one's measured text, on a
    new row when the next would pass ``avail`` px."""
    out: list[LegendItem] = []
    x, row = 0.0, 0
    for (s, _xs, ys), color in zip(prepared, colors, strict=True):
        empty = not np.isfinite(ys).any()
        text = f"{s.name} (no data)" if empty else s.name
        w = _SWATCH + text_width(text)
        if x > 0 and x + w > avail:
            x, row = 0.0, row + 1
        out.append(LegendItem(text, color, s.dash, row, x, w))
        x += w + _LEGEND_GAP
    return out


def _legend(items: Sequence[LegendItem], left: float, top: float) -> str:
    out = ['<g class="legend">']
    for it in items:
        x, y = left + it.x, top + _LEGEND_ROW * it.row
        dash = f' stroke-dasharray="{it.dash}"' if it.dash else ""
        out.append(
            f'<g class="legend-item" data-x="{x:.1f}" data-row="{it.row}" data-w="{it.w:.1f}">'
            f'<line x1="{x:.1f}" x2="{x + 10:.1f}" y1="{y + 8:.1f}" y2="{y + 8:.1f}" '
            f'stroke="{it.color}" stroke-width="3"{dash}/>'
            f'<text x="{x + _SWATCH:.1f}" y="{y + 12:.1f}">{escape(it.text)}</text></g>'
        )
    out.append("</g>")
    return "".join(out)
