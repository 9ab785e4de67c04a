"""One self-contained HTML report that opens offline: the verdict table, warnings and hints,
then time-aligned panels drawn as inline SVG (no script, no CDN, no web font).

Panels share one time axis (seconds since the run's start) with the warm-up shaded, and
one clock (``CLOCK_NOTE``, said on the page): a frame's stage times, queue length and age
are plotted when the model took it (dispatch = capture + frame age, the clock frame age is
judged on), drops and captures when they happened, completed frames when they finished,
telemetry when it was sampled. So on a backlog run the stage panel spans the time the model
worked, beside the utilisation and memory it used then. The panels are:
stage latencies, a rollout's named chunk stages (a panel each), frame age (or the
generator's output interval), drop rate, process RSS,
GPU memory, utilisation (soakd's and, where sampled, the host's), queue length and achieved
fps. Memory panels draw the window floors the verdict judged, their Theil–Sen trend line
and the tolerance line (the steepest allowed growth); error and OOM events are vertical
markers (ticks, when there are many).

Each failing criterion's evidence is drawn on its panel (jitter: k x median and the frames
over it; frame age: its p95 ceiling; drops: the limit; content_fps: its period), and a run
of several streams draws a line per stream on the latency, frame-age and drop panels with
the worst named. Every series has a fixed colour by name (``SERIES_COLORS``).
"""

from __future__ import annotations

import math
import zlib
from html import escape
from typing import Any

import numpy as np

from soakd import __version__
from soakd.analysis import stats
from soakd.analysis.chunks import judged_intervals
from soakd.analysis.criteria.drops import loss_rates
from soakd.analysis.losses import running_total
from soakd.analysis.model import (
    FAIL,
    MIB,
    PASS,
    CriterionResult,
    RunData,
    RunMeta,
    Verdict,
    age_window_s,
)
from soakd.analysis.server import is_served
from soakd.analysis.streams import streams_of
from soakd.records import DECIDED, LOOK_EVENT, STAGE_COLUMNS, standings
from soakd.report.html_numbers import numbers_html
from soakd.report.summary import summarize
from soakd.report.svg import PALETTE, HLine, Series, Span, VLine, line_chart
from soakd.report.text import row_detail

_CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}
h1{font-size:22px} h2{font-size:16px;margin-top:28px}
.PASS{color:#2ca02c}.FAIL{color:#d62728}.INVALID{color:#b8860b}
table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #ddd;padding:3px 6px}
td.pass{color:#2ca02c;font-weight:bold} td.fail{color:#d62728;font-weight:bold}
td.invalid{color:#b8860b;font-weight:bold} td.na{color:#999}
.panel{margin:6px 0} .note{color:#555;font-size:13px}
"""

#: the sentence above the panels that names their clock
CLOCK_NOTE = (
    "Every panel shares one clock, seconds since the run's start: a frame's stage times, "
    "queue length and age are drawn when the model took it (dispatch = capture + frame "
    "age), drops and captured frames when they happened, completed frames when they "
    "finished, telemetry when it was sampled."
)
#: the x axis of a per-frame panel
_DISPATCH_AXIS = "time since start (s); frames at dispatch"

_PLOT_WINDOWS = 600
#: the events marked on every panel
_EVENT_KINDS = (
    *("oom", "error", "stall", "abort", "early_stop", "decided"),
    *("server_replaced", "server_lost"),  # a served model's server changed
)
_LABELLED_EVENTS = 10  # a kind with more events: its first a labelled line, the rest ticks
_EVENT_TICKS = 2000  # the most events of one kind marked
_FRAMES_PER_WINDOW = 4  # plot windows hold at least this many frames (low-fps runs)
_CPU_WINDOW_S = 2.0  # cpu_pct is quantised at short sampling intervals: average it over this
_CPU_WINDOWS = 150  # ... or over longer windows, at most this many over the run
#: the utilisation panel's sample columns and their series names (host_*: the whole host,
#: absent in runs from before they were sampled)
_UTIL_SERIES: tuple[tuple[str, str], ...] = (
    ("gpu_util_pct", "gpu"),
    ("cpu_pct", "cpu"),
    ("host_cpu_pct", "host cpu"),
    ("host_steal_pct", "host steal"),
)
#: a fixed colour per series name (tab10), so a line has the same colour in every report
#: whatever else the run drew; names not listed get one from a hash of the name
SERIES_COLORS: dict[str, str] = {
    "grab": "#1f77b4", "pre": "#ff7f0e", "infer": "#2ca02c", "decode": "#8c564b",
    "total": "#9467bd", "output_latency": "#17becf",
    "window median": "#1f77b4", "window max": "#ff7f0e", "loss rate per window": "#1f77b4",
    "rss": "#1f77b4", "rss floor": "#ff7f0e", "gpu_mem_used": "#2ca02c",
    "gpu_mem_used floor": "#8c564b", "gpu_proc_mem": "#17becf", "gpu_proc_mem floor": "#1f77b4",
    "torch_reserved": "#bcbd22", "torch_reserved floor": "#7f7f7f", "server_rss": "#9467bd",
    "server_rss floor": "#e377c2", "server_gpu_mem": "#8c564b", "server_gpu_mem floor": "#2ca02c",
    "gpu": "#2ca02c", "cpu": "#1f77b4", "host cpu": "#7f7f7f", "host steal": "#e377c2",
    "fps": "#1f77b4", "tolerance": "#d62728",
}  # fmt: skip
#: the streams' lines, in stream order (after these, colours repeat)
STREAM_COLORS: tuple[str, ...] = ("#17becf", "#e377c2", "#bcbd22", "#7f7f7f", "#000080",
                                  "#808000")  # fmt: skip


def _binned(t: np.ndarray, y: np.ndarray | None, width: float, hi: float) -> tuple[np.ndarray, ...]:
    """Consecutive windows of ``width`` s from 0 to ``hi``: their centres (the last one's
    clipped at ``hi``), how many finite values of ``y`` (or times, when ``y`` is None) each
    holds, and the mean of ``y`` in each (NaN where empty)."""
    n = max(1, math.ceil(hi / width - 1e-9))
    edges = np.arange(n + 1) * width
    ok = np.isfinite(t) & (np.isfinite(y) if y is not None else True)
    count, _ = np.histogram(t[ok], bins=edges)
    total = np.histogram(t[ok], bins=edges, weights=y[ok])[0] if y is not None else count
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return (edges[:-1] + np.minimum(edges[1:], hi)) / 2, count, mean


def _color(key: str) -> str:
    """The fixed colour of a series (by its name, without a window width or count): the same
    line has the same colour in every report, whichever other series a run has."""
    if key in SERIES_COLORS:
        return SERIES_COLORS[key]
    return PALETTE[zlib.crc32(key.encode()) % len(PALETTE)]


def _stream_color(s: int) -> str:
    """Stream ``s``'s colour: none of the stage or window series' colours it is drawn
    beside."""
    return STREAM_COLORS[s % len(STREAM_COLORS)]


def _trend_lines(
    verdict: Verdict, name: str, t0: float, t1: float, scale: float, tolerance_per_s: float
) -> list[Series]:
    """The Theil–Sen fit and the tolerance (the steepest allowed growth) in the units drawn
    (``scale`` per unit). Both span the judged windows; the fit's intercept is at t = 0 s
    (window centres are seconds since start) and the tolerance line starts on the fit at the
    first judged window, so both lie on the data rather than extrapolated past it. The
    tolerance is a reference line (``scale=False``): the panel's y axis grows by up to the
    data's span to show it, and it is cut at the plot's edge beyond that, so a steep
    allowance neither squashes the data into the bottom of the panel nor leaves it."""
    tr = verdict.trends.get(name)
    if tr is None or not math.isfinite(tr.intercept) or tr.n < 3:
        return []
    w = verdict.series.get(name)
    judged = w.t[w.nonempty()] if w is not None else np.empty(0)
    xs = np.array([judged[0], judged[-1]]) if judged.size > 1 else np.array([t0, t1])
    fit = (tr.intercept + tr.slope * xs) / scale
    tol = fit[0] + tolerance_per_s * (xs - xs[0]) / scale
    per_min = tolerance_per_s * 60 / scale
    return [
        Series(
            f"trend {tr.slope * 60 / scale:+.3g}/min",
            xs,
            fit,
            color="#000000",
            dash="5 3",
            width=1.2,
        ),
        Series(
            f"tolerance +{per_min:.3g}/min (a slope from the trend's start, not a level)",
            xs,
            tol,
            color=SERIES_COLORS["tolerance"],
            dash="2 3",
            width=1.2,
            scale=False,
        ),
    ]


def _event_lines(events: list[dict[str, Any]]) -> list[VLine]:
    """Error, OOM, stall and abort events as labelled vertical lines; of a kind with more
    than ``_LABELLED_EVENTS`` events only the first is a line, labelled with the count, the
    others short ticks at the top (at most ``_EVENT_TICKS`` of them)."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("kind") in _EVENT_KINDS and e.get("t") is not None:
            by_kind.setdefault(str(e["kind"]), []).append(e)
    out = []
    for kind, evs in by_kind.items():
        color = "#d62728" if kind == "oom" else "#9467bd"
        many = len(evs) > _LABELLED_EVENTS
        for i, e in enumerate(evs[:_EVENT_TICKS]):
            words = f"{kind} x{len(evs)}" if many and i == 0 else kind
            label = f"{words}: {e.get('message') or ''}"[:200]
            out.append(VLine(float(e["t"]), label, color=color, tick=many and i > 0))
    return out


def _failed(verdict: Verdict, name: str) -> CriterionResult | None:
    c = verdict.get(name)
    return c if c is not None and c.status == FAIL else None


_RANK = {"INVALID": 0, "FAIL": 1, "PASS": 2}


def _worst_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A run of several streams: the worst one (INVALID, then FAIL, then the most frames
    lost); None for one stream."""
    if len(rows) < 2:
        return None
    return min(rows, key=lambda r: (_RANK.get(r["status"], 0), -(r.get("loss_fraction") or 0)))


def worst_stream(rows: list[dict[str, Any]]) -> int | None:
    """The stream every panel and the note name as the worst (``_worst_row``)."""
    w = _worst_row(rows)
    return None if w is None else int(w["stream"])


#: a realtime session's per-turn series (label, RunData.turns column), in ms
_TURN_SERIES: tuple[tuple[str, str], ...] = (
    ("time to first delta", "ttfd_ms"),
    ("done", "done_ms"),
    ("delta interval p95", "delta_p95_ms"),
)


class _Panels:
    def __init__(self, data: RunData, verdict: Verdict) -> None:
        self.data, self.v = data, verdict
        #: judged on the bounded path: no frame rows here, only the verdict's windows
        self.bounded = verdict.frame_summary is not None
        t = data.frames["t_capture"]
        st = data.samples["t"]
        hi = max(
            [
                float(t.max()) if t.size else 0.0,
                float(st.max()) if st.size else 0.0,
                float(data.meta.duration_s or 0.0),
            ]
        )
        self.x_range = (0.0, max(hi, 1e-3))
        self.t0 = float(verdict.window.get("t0", 0.0))
        self.t1 = float(verdict.window.get("t1", hi))
        self.spans = [Span(0.0, self.t0, "warm-up")] if self.t0 > 0 else []
        self.vlines = _event_lines(data.events)
        ok = np.isfinite(t)
        span = float(t[ok].max() - t[ok].min()) if ok.sum() > 1 else 0.0
        per_frame = span / (int(ok.sum()) - 1) if span > 0 else 0.0
        self.pw = max(
            self.x_range[1] / _PLOT_WINDOWS,
            age_window_s(hi, None) / 4,
            _FRAMES_PER_WINDOW * per_frame,
        )
        #: each stream's result (``run.streams`` > 1), from the ``streams`` criterion
        self.streams = [] if self.bounded else streams_of(verdict)
        #: the one stream every panel and the note name as the worst (``worst_stream``)
        self.worst = worst_stream(self.streams)
        n = len(self.streams)
        # the all-streams view keeps each row's frame id, k x N + s: its stream is id mod N
        self.stream_ids = (
            np.nan_to_num(data.frames["frame_id"]).astype(np.int64) % n if n > 1 else None
        )
        self.measured = data.measured(self.t0) if not self.bounded else np.zeros(0, bool)
        #: when the model took each frame (capture + frame age; a frame never taken, or
        #: whose age was not recorded, at its capture): the clock of per-frame panels
        age = data.frame("frame_age_ms")
        self.t_dispatch = t + np.where(np.isfinite(age), age, 0.0) / 1000.0

    def chart(
        self,
        series: list[Series],
        panel: str,
        title: str,
        y_label: str,
        hlines: list[HLine] | None = None,
        y_zero: bool = True,
        y_range: tuple[float, float] | None = None,
        x_label: str = "time since start (s)",
    ) -> str:
        return line_chart(
            series,
            x_label=x_label,
            y_label=y_label,
            title=title,
            x_range=self.x_range,
            spans=self.spans,
            vlines=self.vlines,
            hlines=hlines or [],
            panel_id=panel,
            y_zero=y_zero,
            y_range=y_range,
        )

    def convergence(self) -> str:
        """A ``run.duration = "auto"`` run: at each look, each trend's smallest detectable
        slope over its tolerance (a trend seen at one look only is a mark). The run could
        stop once every line was under 1 and the rest decided; a note below names the
        trends at 0 at every look (not drawn: their windows did not vary, so any growth
        would have been seen) and, at the last look, the criteria the run still waited
        on and why. "" for a run of fixed length."""
        looks = [
            (float(e["t"]), standings(e.get("data")))
            for e in self.data.events
            if e.get("kind") == LOOK_EVENT and e.get("t") is not None
        ]
        seen: dict[str, tuple[list[float], list[float]]] = {}
        for t, stands in looks:
            for st in stands:
                if st.tolerance:
                    ts, ratio = seen.setdefault(st.criterion, ([], []))
                    ts.append(t)
                    ratio.append(
                        math.nan if st.detectable is None else st.detectable / st.tolerance
                    )
        flat = [n for n, (_, r) in seen.items() if np.isfinite(r).any() and np.nanmax(r) == 0]
        series = [  # the trends (a criterion with no detectable slope is not one)
            Series(name, np.asarray(t), np.asarray(r), color=_color(name), markers=True,
                   kind="points" if np.isfinite(r).sum() == 1 else "line")
            for name, (t, r) in seen.items()
            if np.isfinite(r).any() and name not in flat
        ]  # fmt: skip
        if not series and not flat:
            return ""
        finite = [v for _, r in seen.values() for v in r if math.isfinite(v)]
        top = min(max([2.0, *finite]), 5.0)  # a first look's 40 x would flatten the rest
        title = "Convergence (duration = auto): smallest detectable slope / tolerance, by look"
        line = HLine(1.0, "decided below 1", color="#2ca02c", anchor="start")
        vlines = [
            VLine(v.x, "decided", color=v.color, dash=v.dash) if v.label.startswith("decided")
            else v for v in self.vlines
        ]  # fmt: skip
        svg = line_chart(
            series, x_label="time since start (s)", y_label="x tolerance", title=title,
            x_range=self.x_range, spans=self.spans, vlines=vlines, hlines=[line],
            panel_id="convergence", y_zero=True, y_range=(0.0, top),
        )  # fmt: skip
        return svg + self.convergence_note(looks, flat)

    @staticmethod
    def convergence_note(looks: list[tuple[float, list[Any]]], flat: list[str]) -> str:
        """Below the convergence panel: the trends at 0 at every look, and what the last
        look still waited on (why the run went on, or why it ended undecided)."""
        parts = []
        if flat:
            parts.append(
                f"{', '.join(flat)}: 0 x tolerance at every look (its windows did not vary, "
                "so any growth would have been seen); not drawn"
            )
        if looks:
            t, stands = looks[-1]
            waiting = [st for st in stands if st.state != DECIDED]
            if waiting:
                why = "; ".join(
                    f"{st.criterion} {st.state}"
                    + (f" ({st.why})" if st.why and st.why != st.state else "")
                    for st in waiting
                )
                parts.append(f"at the last look ({t:.0f} s) the run still waited on: {why}")
            else:
                parts.append(f"every criterion decided at the last look ({t:.0f} s)")
        text = "; ".join(parts)
        return f'<p class="note" id="convergence-note">{escape(text)}.</p>' if text else ""

    def streamed(self, panel: str, title: str) -> str:
        """The note standing for a per-frame panel of a run judged on the bounded path."""
        return (
            f'<p class="note" data-panel="{panel}">{escape(title)}: not drawn for a run judged '
            "on the bounded path (its frames were streamed, not loaded)</p>"
        )

    def per_stream(self, t: np.ndarray, y: np.ndarray, width: float, what: str) -> list[Series]:
        """Window medians of ``y`` (ms) for each stream (rows the caller masked out are NaN),
        each labelled with its p95; the run's worst stream (``worst_stream``, the one the
        note names) drawn thicker and named so."""
        assert self.stream_ids is not None
        found = []
        for s in range(len(self.streams)):
            own = (self.stream_ids == s) & np.isfinite(y)
            if own.any():
                p95 = float(np.percentile(y[own], 95))
                found.append((s, p95, stats.window_reduce(t[own], y[own], width, t0=0.0)))
        worst = self.worst if len(found) > 1 else None
        out = []
        for s, p95, w in found:
            has = w.nonempty()
            name = f"{what} stream {s} (p95 {p95:.3g} ms" + (", worst)" if s == worst else ")")
            thick = 2.4 if s == worst else 1.2
            out.append(Series(name, w.t[has], w.median[has], color=_stream_color(s), width=thick))
        return out

    def stages(self) -> str:
        if self.bounded:
            return self.streamed("stages", "Stage latencies")
        t = self.t_dispatch
        ok = self.data.frames["skipped"] == 0
        series = []
        for col in STAGE_COLUMNS:
            if col == "total_ms" and self.stream_ids is not None:
                y = np.where(self.measured, self.data.frame(col), np.nan)
                series += self.per_stream(t, y, self.pw, "total")
                continue
            y = self.data.frame(col)
            w = stats.window_reduce(t[ok], y[ok], self.pw, t0=0.0)
            has = w.nonempty()
            if has.any():
                name = col.removesuffix("_ms")
                series.append(Series(name, w.t[has], w.median[has], color=_color(name)))
        jit = self.v.get("jitter")
        src = str(jit.evidence.get("source", "infer_ms")) if jit else "infer_ms"
        src = src if src in self.data.frames else "infer_ms"
        name = src.removesuffix("_ms")
        marks, hl = self.jitter_evidence(src)
        w = stats.window_reduce(t[ok], self.data.frame(src)[ok], self.pw, t0=0.0, medians=False)
        has = w.nonempty()
        if has.any() and not marks:  # the marked frames show where the maxima go
            series.append(
                Series(
                    f"{name} max", w.t[has], w.max[has], color=_color(name), dash="3 2", width=1.0
                )
            )
        title = "Stage latencies (window medians)"
        if self.stream_ids is not None:
            title += ", total per stream"
        return self.chart(series + marks, "stages", title, "ms", hl, x_label=_DISPATCH_AXIS)

    def jitter_evidence(self, src: str) -> tuple[list[Series], list[HLine]]:
        """A failing jitter criterion's evidence: the line k x median of the column it
        judged and each judged frame over it marked."""
        c = _failed(self.v, "jitter")
        if c is None or c.evidence.get("source") != src:
            return [], []
        k, med = c.evidence.get("k"), c.evidence.get("median_ms")
        if not isinstance(k, int | float) or not isinstance(med, int | float):
            return [], []
        cut = float(k) * float(med)
        ok = self.measured & (self.data.frame("has_error") == 0)
        y = self.data.frame(src)
        over = ok & (y > cut)
        name = src.removesuffix("_ms")
        line = HLine(
            cut,
            f"jitter: k x median = {k:g} x {med:.3g} = {cut:.3g} ms",
            color=SERIES_COLORS["tolerance"],
        )
        n = c.evidence.get("exceed_count")  # the verdict's own count of them
        label = f"{name} over k x median ({int(n if n is not None else over.sum())} frames)"
        t = self.t_dispatch
        return [Series(label, t[over], y[over], color="#d62728", kind="points")], [line]

    def chunk_stages(self) -> list[str]:
        """A rollout's named chunk stages, a panel each: window medians and maxima."""
        if self.bounded:
            return []
        t = self.t_dispatch
        out = []
        for name, y in self.data.stages.items():
            w = stats.window_reduce(t, y, self.pw, t0=0.0)
            has = w.nonempty()
            if not has.any():
                continue
            series = [
                Series("window median", w.t[has], w.median[has], color=_color("window median")),
                Series(
                    "window max",
                    w.t[has],
                    w.max[has],
                    dash="3 2",
                    width=1.0,
                    color=_color("window max"),
                ),
            ]
            title = f"Chunk stage {name} (ms per chunk)"
            out.append(self.chart(series, f"stage-{name}", title, "ms", x_label=_DISPATCH_AXIS))
        return out

    def age(self) -> str:
        v, c = self.v, self.v.get("interval") or self.v.get("frame_age")
        name = c.criterion if c else "frame_age"
        title = "Output interval" if name == "interval" else "Frame age"
        w = v.series.get(name)
        series: list[Series] = []
        if w is not None:
            series += [
                Series("window median", w.t, w.median, color=_color("window median")),
                Series("window max", w.t, w.max, dash="3 2", width=1.0, color=_color("window max")),
            ]
        if self.stream_ids is not None and name == "frame_age":
            y = np.where(self.measured, self.data.frame("frame_age_ms"), np.nan)
            t = self.t_dispatch
            width = w.width_s if w is not None else self.pw
            series += self.per_stream(t, y, width, "median")
            title += ", window medians per stream"
        tol = (c.threshold or 0.0) / 60 if c else 0.0
        series += _trend_lines(v, name, self.t0, self.t1, 1.0, tol)
        series += self.judged_waits()
        return self.chart(
            series,
            name,
            f"{title} (ms), trend and tolerance",
            "ms",
            self.age_lines(c),
            x_label=_DISPATCH_AXIS,
        )

    def judged_waits(self) -> list[Series]:
        """A generator's judged content_fps intervals (each wait between visible updates, or
        each frame's interval: ``criteria.generator_interval``), one mark each, as the
        verdict judged them (after the warm-up); the p95 and the period are ``age_lines``."""
        cf = self.v.get("content_fps")
        if cf is None or cf.status not in (FAIL, PASS) or self.bounded:
            return []
        if not len(self.data.emissions.get("t_emit", ())):
            return []
        basis = str(cf.evidence.get("basis", "presentation"))
        iv = judged_intervals(self.data, self.t0, basis)
        if not iv.n:
            return []
        what = "waits between visible updates" if basis == "presentation" else "intervals"
        return [
            Series(f"judged by content_fps: {iv.n} {what}", iv.t, iv.ms, kind="points",
                   color="#d62728" if cf.status == FAIL else "#2ca02c"),
        ]  # fmt: skip

    def age_lines(self, c: CriterionResult | None) -> list[HLine]:
        """The frame-age p95 ceiling (with the run's p95) and, for a generator with
        ``content_fps``, its period: the interval the judged p95 may not pass."""
        hl = []
        ev = c.evidence if c else {}
        if ev.get("max_age_p95_ms"):
            p95 = ev.get("p95_ms")
            seen = f" (p95 {p95:.3g} ms)" if isinstance(p95, int | float) else ""
            hl.append(
                HLine(
                    float(ev["max_age_p95_ms"]),
                    f"p95 ceiling {float(ev['max_age_p95_ms']):.4g} ms{seen}",
                )
            )
        cf = self.v.get("content_fps")
        if cf is not None and cf.threshold and cf.status in (FAIL, PASS):
            fps = cf.evidence.get("content_fps")
            hl.append(
                HLine(float(cf.threshold), f"content_fps {fps:g}: period {cf.threshold:.4g} ms")
            )
            if cf.value is not None:  # the number the verdict judged, where it lies
                color = "#d62728" if cf.status == FAIL else "#2ca02c"
                hl.append(
                    HLine(float(cf.value), f"judged p95 {cf.value:.4g} ms ({cf.status.upper()})",
                          color=color, dash="2 2")
                )  # fmt: skip
        return hl

    def drops(self) -> str:
        w = self.v.series.get("drop_rate")
        c = self.v.get("drops")
        series = (
            [
                Series(
                    "loss rate per window",
                    w.t,
                    w.median * 100,
                    kind="step",
                    color=_color("loss rate per window"),
                )
            ]
            if w
            else []
        )
        series += (
            _trend_lines(self.v, "drop_rate", self.t0, self.t1, 0.01, 0.0)[:1]
            if w is not None
            else []
        )
        title = "Dropped + stale frames, % per window"
        if self.stream_ids is not None and w is not None and c is not None:
            series += self.stream_losses(float(c.evidence.get("window_s") or w.width_s))
            title += ", per stream" + (
                f" (worst: stream {self.worst})" if self.worst is not None else ""
            )
        hl = (
            [HLine(c.threshold * 100, f"max_drop_fraction {c.threshold:.3g}")]
            if (c and c.threshold)
            else []
        )
        if c is not None and c.detail:  # the verdict's own count, in its words
            title += f": {c.detail}"
        return self.chart(series, "drops", title, "%", hl)

    def stream_losses(self, width: float) -> list[Series]:
        """Each stream's loss rate per window: its own drops and stale frames (the rows'
        all-streams running totals step at a row by that row's stream's own count) over
        its rows and drops, as the verdict reckons the rate."""
        assert self.stream_ids is not None
        d = self.data
        drop = np.nan_to_num(d.frame("drop_count"))
        lost = drop + np.nan_to_num(d.frame("stale_count"))
        post = d.post_warmup(self.t0)
        t = d.frames["t_capture"]
        out = []
        for s in range(len(self.streams)):
            own = self.stream_ids == s
            lc = np.cumsum(np.where(own, np.diff(lost, prepend=0.0), 0.0))
            dc = np.cumsum(np.where(own, np.diff(drop, prepend=0.0), 0.0))
            before = own & ~post
            prev = (float(lc[before].max()), float(dc[before].max())) if before.any() else (0, 0)
            rows = own & post
            lw = stats.window_reduce(
                t[rows], lc[rows], width, t0=self.t0, t1=self.t1, medians=False
            )
            dw = stats.window_reduce(
                t[rows], dc[rows], width, t0=self.t0, t1=self.t1, medians=False
            )
            r = loss_rates(lw.t, lw.count, lw.max, dw.max, width, *prev)
            frac = next((x.get("loss_fraction") for x in self.streams if x["stream"] == s), None)
            label = f"stream {s}" + (f" ({frac:.2%} lost)" if frac is not None else "")
            out.append(
                Series(label, r.t, r.median * 100, kind="step", color=_stream_color(s), width=1.2)
            )
        return out

    def memory(self, names: tuple[tuple[str, str], ...], panel: str, title: str) -> str:
        st = self.data.samples["t"]
        series: list[Series] = []
        for crit, col in names:
            y = self.data.sample(col)
            w = self.v.series.get(crit)
            base = col.removesuffix("_bytes")
            if self.bounded and w is not None and w.nonempty().any():  # window peaks instead
                has = w.nonempty()
                series.append(
                    Series(
                        f"{base} window max",
                        w.t[has],
                        w.max[has] / MIB,
                        width=1.0,
                        color=_color(base),
                    )
                )
            elif not np.isfinite(y).any():
                continue
            else:
                series.append(Series(base, st, y / MIB, width=1.0, color=_color(base)))
            if w is not None:
                series.append(
                    Series(
                        f"{base} floor",
                        w.t,
                        w.floor / MIB,
                        kind="points",
                        color=_color(f"{base} floor"),
                    )
                )
            c = self.v.get(crit)
            tol = (c.threshold or 0.0) * MIB / 60 if c else 0.0
            series += _trend_lines(self.v, crit, self.t0, self.t1, MIB, tol)
        if not series:
            return f'<p class="note" data-panel="{panel}">{escape(title)}: no data</p>'
        return self.chart(series, panel, title, "MB", y_zero=False)

    def turns(self) -> list[str]:
        """A realtime session's answered turns over time: time to first delta, to done and
        the deltas' p95 interval per turn; with audio out, each turn's real-time factor
        against ``criteria.min_audio_rtf``. None for other kinds."""
        tr = self.data.turns
        if not tr or not len(tr["t_capture"]):
            return []
        t = tr["t_capture"]
        series = [
            Series(label, t, tr[col], kind="points", color=_color(label))
            for label, col in _TURN_SERIES
            if np.isfinite(tr[col]).any()
        ]
        out = [self.chart(series, "turns", "Answers per turn (ms, from the question)", "ms")]
        rtf = tr["audio_rtf"]
        if np.isfinite(rtf).any():
            c = self.v.get("audio_playback")
            floor = c.threshold if c is not None and c.threshold is not None else 1.0
            pts = [Series("audio real-time factor", t, rtf, kind="points",
                          color=_color("audio real-time factor"))]  # fmt: skip
            lines = [HLine(floor, f"min_audio_rtf {floor:g}")]
            title = "Spoken answers: audio seconds per wall second (under the line: a stutter)"
            out.append(self.chart(pts, "audio", title, "x real time", lines))
        return out

    def util(self) -> str:
        """GPU and CPU utilisation as means over windows of at least ``_CPU_WINDOW_S``: one
        psutil reading over a 100-200 ms tick is quantised (0 or 10 % of a core), the mean
        over a window is the CPU time used in it. The host's own load (``host_cpu_pct``,
        ``host_steal_pct``, ``host_load1``), where the run sampled it, beside soakd's."""
        st = self.data.samples["t"]
        width = max(_CPU_WINDOW_S, self.x_range[1] / _CPU_WINDOWS)
        series = []
        for col, name in _UTIL_SERIES:
            y = self.data.sample(col)
            if np.isfinite(y).any():
                c, _n, mean = _binned(st, y, width, self.x_range[1])
                series.append(Series(f"{name} ({width:.2g} s mean)", c, mean, color=_color(name)))
        if not series:
            return '<p class="note" data-panel="util">Utilisation: no data</p>'
        title = "GPU / CPU utilisation (%, window means)"
        load = self.data.sample("host_load1")
        load = load[np.isfinite(load)]
        if load.size:
            med, top = float(np.median(load)), float(load.max())
            title += f"; host load average (1 min) median {med:.3g}, max {top:.3g}"
        return self.chart(series, "util", title, "%")

    def queue(self) -> str:
        """The frame queue's length when each frame was taken: window medians and maxima."""
        if self.bounded:
            return self.streamed("queue", "Queue length")
        t, q = self.t_dispatch, self.data.frame("queue_len")
        if not np.isfinite(q).any():
            return '<p class="note" data-panel="queue">Queue length: no data</p>'
        w = stats.window_reduce(t, q, self.pw, t0=0.0)
        has = w.nonempty()
        series = [
            Series(
                "window median", w.t[has], w.median[has], kind="step", color=_color("window median")
            ),
            Series(
                "window max",
                w.t[has],
                w.max[has],
                kind="step",
                dash="3 2",
                width=1.0,
                color=_color("window max"),
            ),
        ]
        title = "Frame queue length when the model took a frame (frames waiting)"
        return self.chart(series, "queue", title, "frames", x_label=_DISPATCH_AXIS)

    def fps(self) -> str:
        """Frame rate per window: the frames captured (rows and the drops between them, at
        capture) beside the frames completed (finished without error, at dispatch + total),
        against the target; for a generator, the frames it emitted (``emissions``), not its
        requests or chunks, against ``criteria.content_fps`` where set."""
        if self.bounded:
            return self.streamed("fps", "Achieved frame rate")
        gen = self.data.meta.generates and len(self.data.emissions.get("t_emit", ())) > 0
        if gen:
            return self.gen_fps()
        d = self.data
        t = d.frames["t_capture"]
        if not np.isfinite(t).any():  # killed before a frame was finished
            return '<p class="note" data-panel="fps">Achieved frame rate: no frames</p>'
        total = d.frame("total_ms")
        ok = np.isfinite(total) & (d.frames["skipped"] == 0) & (d.frames["has_error"] == 0)
        done = (self.t_dispatch + np.nan_to_num(total) / 1000.0)[ok]
        ran = running_total(d.frame("stream"), d.frame("drop_count"))  # all streams
        dropped = np.diff(ran, prepend=0.0).clip(min=0)
        width = max(self.pw, 1.0)
        hi = self.x_range[1]
        c, n_cap, _ = _binned(t, None, width, hi)
        n_drop = np.histogram(t, bins=np.arange(c.size + 1) * width, weights=dropped)[0]
        _, n_done, _ = _binned(done, None, width, hi)
        ends = (np.arange(c.size) + 1) * width
        full = ends <= hi + 1e-9  # a last partial window reads low
        # frames captured after the last row (queued or in flight at the end) have no
        # capture time: the captured line stops at the last row's
        cap = full & (ends <= float(np.nanmax(t)) + 1e-9)
        series = [
            Series(
                f"captured per {width:.3g} s",
                c[cap],
                (n_cap + n_drop)[cap] / width,
                color="#7f7f7f",
                dash="4 3",
                width=1.2,
            ),
            Series(f"completed per {width:.3g} s", c[full], n_done[full] / width,
                   color=_color("fps")),
        ]  # fmt: skip
        target = d.meta.fps
        hl = (
            [HLine(float(target), f"target {target:g} fps", color="#7f7f7f")]
            if isinstance(target, int | float) and target
            else []
        )
        dc = self.v.get("drops")
        unrowed = sum(
            float(dc.evidence.get(k) or 0) for k in ("queued_at_end", "in_flight_at_end")
        ) if dc is not None else 0.0  # fmt: skip
        n = t.size + float(dropped.sum()) + unrowed
        title = f"Frame rate (fps): {int(ok.sum())} frames completed of {n:.0f} captured"
        if unrowed:
            title += f" ({unrowed:.0f} queued or in flight at the end: no capture time drawn)"
        return self.chart(series, "fps", title, "fps", hl)

    def gen_fps(self) -> str:
        """A generator's output rate: the frames it emitted per window, against
        ``criteria.content_fps`` where set."""
        done = self.data.emissions["t_emit"]
        width = max(self.pw, 1.0)
        c, n, _ = _binned(done, None, width, self.x_range[1])
        ends = (np.arange(c.size) + 1) * width
        full = ends <= float(np.nanmax(done)) + 1e-9  # a last partial window reads low
        series = [
            Series(f"frames out per {width:.3g} s", c[full], n[full] / width, color=_color("fps"))
        ]
        target = self.data.meta.setting("criteria", "content_fps")
        hl = (
            [HLine(float(target), f"content_fps {target:g} fps", color="#7f7f7f")]
            if isinstance(target, int | float) and target
            else []
        )
        title = "Achieved frame rate (output frames per second)"
        return self.chart(series, "fps", title, "fps", hl)


def _streams_note(rows: list[dict[str, Any]]) -> str:
    """A run of several streams: the worst one (``_worst_row``) and why, above the panels
    that draw a line per stream."""
    worst = _worst_row(rows)
    if worst is None:
        return ""
    why = ", ".join(worst.get("failed", []) + worst.get("invalid", [])) or "passed"
    return (
        f'<p class="note" id="streams-note"><b>{len(rows)} streams</b>; the latency, frame '
        f"age and drop panels draw a line per stream. Worst: <b>stream {worst['stream']}</b>"
        f" ({escape(str(worst['status']))}: {escape(why)})</p>"
    )


def _panels(p: _Panels, m: RunMeta) -> list[str]:
    """Every panel of the report, in order (a served model's server memory, a realtime
    session's turns only where they apply)."""
    return [
        p.stages(),
        *p.chunk_stages(),
        p.age(),
        p.drops(),
        p.memory((("memory_rss", "rss_bytes"),), "rss", "Process RSS (MB): floors, trend"),
        p.memory(
            (
                ("memory_gpu", "gpu_mem_used_bytes"),
                ("memory_gpu_proc", "gpu_proc_mem_bytes"),
                ("memory_torch_reserved", "torch_reserved_bytes"),
            ),
            "gpu_mem",
            "GPU memory (MB): floors, trend",
        ),
        *(
            [
                p.memory(
                    (
                        ("memory_server_rss", "server_rss_bytes"),
                        ("memory_server_gpu", "server_gpu_mem_bytes"),
                    ),
                    "server_mem",
                    "Model server memory (MB): floors, trend",
                )
            ]
            if is_served(m)
            else []
        ),
        *p.turns(),
        p.util(),
        p.queue(),
        p.fps(),
        p.convergence(),
    ]


def render_html(data: RunData, verdict: Verdict) -> str:
    """The whole report as one HTML document."""
    m = data.meta
    p = _Panels(data, verdict)
    rows = []
    for c in verdict.criteria:
        cls = "na" if c.status == "n/a" else c.status
        val = (
            "–"
            if c.value is None
            else (f"{c.value:.2%}" if c.unit == "fraction" else f"{c.value:.4g}")
        )
        thr = (
            "–"
            if c.threshold is None
            else (f"{c.threshold:.2%}" if c.unit == "fraction" else f"{c.threshold:.4g}")
        )
        rows.append(
            f'<tr><td>{escape(c.criterion)}</td><td class="{cls}">'
            f"{escape(c.status.upper())}</td><td>{val}</td><td>{thr}</td>"
            f"<td>{escape(c.unit)}</td><td>{escape(row_detail(c))}</td></tr>"
        )
    notes = "".join(f"<li>warning: {escape(w)}</li>" for w in verdict.warnings)
    notes += "".join(f"<li>hint: {escape(h)}</li>" for h in verdict.hints)
    panels = _panels(p, m)
    title = f"soakd {verdict.status}: run {m.run_id}"
    head = (
        f"{escape(m.workload_kind or '?')} on {escape(m.device or 'cpu')}, "
        f"{m.duration_s or 0:.0f} s{f' at {m.fps:g} fps' if m.fps else ''}, "
        f"{verdict.window.get('measured_frames', 0)} measured frames, started "
        f"{escape(m.started_at or '?')} on {escape(m.host or '?')}"
    )
    reason = "" if verdict.status == "PASS" else f"<p><b>Reason:</b> {escape(verdict.reason)}</p>"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
        f'<h1>soakd verdict: <span class="{verdict.status}" id="verdict">'
        f'{verdict.status}</span></h1><p class="note">{head}; exit code '
        f"{int(verdict.exit_code)}</p>{reason}"
        "<table><tr><th>criterion</th><th>status</th><th>value</th><th>threshold</th>"
        f"<th>unit</th><th>detail</th></tr>{''.join(rows)}</table>"
        f"<ul>{notes}</ul>{numbers_html(summarize(data, verdict))}<h2>Timeline</h2>"
        + f'<p class="note" id="clock">{escape(CLOCK_NOTE)}</p>'
        + _streams_note(p.streams)
        + "".join(f'<div class="panel">{s}</div>' for s in panels if s)
        + f'<p class="note">generated by soakd {__version__}</p></body></html>\n'
    )
