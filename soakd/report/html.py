"""One self-contained HTML report that opens offline: the verdict table, warnings and hints,
then time-aligned panels drawn as inline SVG (no script, no CDN, no web font).

Panels share one time axis (seconds since the run's start) with the warm-up shaded:
stage latencies, a rollout's named chunk stages (a panel each), frame age (or the
generator's output interval), drop rate, process RSS,
GPU memory and GPU utilisation. Memory panels draw the window floors the verdict judged,
their Theil–Sen trend line and the tolerance line (the steepest allowed growth); error and
OOM events are vertical markers.
"""

from __future__ import annotations

import math
from html import escape

import numpy as np

from soakd import __version__
from soakd.analysis import stats
from soakd.analysis.model import MIB, RunData, Verdict, age_window_s
from soakd.records import STAGE_COLUMNS
from soakd.report.html_numbers import numbers_html
from soakd.report.summary import summarize
from soakd.report.svg import HLine, Series, Span, VLine, line_chart

_CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}
h1{font-size:22px} h2{font-size:16px;margin-top:28px}
.PASS{color:#2ca02c}.FAIL{color:#d62728}.INVALID{color:#b8860b}
table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #ddd;padding:3px 6px}
td.pass{color:#2ca02c;font-weight:bold} td.fail{color:#d62728;font-weight:bold}
td.invalid{color:#b8860b;font-weight:bold} td.na{color:#999}
.panel{margin:6px 0} .note{color:#555;font-size:13px}
"""

_PLOT_WINDOWS = 600
_FRAMES_PER_WINDOW = 4  # plot windows hold at least this many frames (low-fps runs)
_CPU_WINDOW_S = 2.0  # cpu_pct is quantised at short sampling intervals: average it over this
_CPU_WINDOWS = 150  # ... or over longer windows, at most this many over the run


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


def _trend_lines(
    verdict: Verdict,
    name: str,
    t0: float,
    t1: float,
    scale: float,
    tolerance_per_s: float,
    y_cap: float | None = None,
) -> list[Series]:
    """The Theil–Sen fit and the tolerance (the steepest allowed growth) in the units drawn
    (``scale`` per unit). Both span the judged windows; the fit's intercept is at t = 0 s
    (window centres are seconds since start) and the tolerance line starts on the fit at the
    first judged window, so both lie on the data rather than extrapolated past it. A
    tolerance that climbs past ``y_cap`` (the data's top, drawn units) stops there, so a
    steep allowance does not squash the data into the bottom of the panel."""
    tr = verdict.trends.get(name)
    if tr is None or not math.isfinite(tr.intercept) or tr.n < 3:
        return []
    w = verdict.series.get(name)
    judged = w.t[w.nonempty()] if w is not None else np.empty(0)
    xs = np.array([judged[0], judged[-1]]) if judged.size > 1 else np.array([t0, t1])
    fit = (tr.intercept + tr.slope * xs) / scale
    tol = fit[0] + tolerance_per_s * (xs - xs[0]) / scale
    tol_x = xs
    if y_cap is not None and tolerance_per_s > 0 and tol[-1] > y_cap > tol[0]:
        x_end = xs[0] + (y_cap - tol[0]) * scale / tolerance_per_s
        tol_x, tol = np.array([xs[0], x_end]), np.array([tol[0], y_cap])
    return [
        Series(
            f"trend {tr.slope * 60 / scale:+.3g}/min",
            xs,
            fit,
            color="#000000",
            dash="5 3",
            width=1.2,
        ),
        Series("tolerance", tol_x, tol, color="#d62728", dash="2 3", width=1.2),
    ]


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
        self.vlines = [
            VLine(
                float(e["t"]),
                f"{e['kind']}: {e.get('message') or ''}"[:200],
                color="#d62728" if e["kind"] == "oom" else "#9467bd",
            )
            for e in data.events
            if e.get("kind") in ("oom", "error", "stall", "abort") and e.get("t") is not None
        ][:100]
        ok = np.isfinite(t)
        span = float(t[ok].max() - t[ok].min()) if ok.sum() > 1 else 0.0
        per_frame = span / (int(ok.sum()) - 1) if span > 0 else 0.0
        self.pw = max(
            self.x_range[1] / _PLOT_WINDOWS,
            age_window_s(hi, None) / 4,
            _FRAMES_PER_WINDOW * per_frame,
        )

    def chart(
        self,
        series: list[Series],
        panel: str,
        title: str,
        y_label: str,
        hlines: list[HLine] | None = None,
        y_zero: bool = True,
    ) -> str:
        return line_chart(
            series,
            x_label="time since start (s)",
            y_label=y_label,
            title=title,
            x_range=self.x_range,
            spans=self.spans,
            vlines=self.vlines,
            hlines=hlines or [],
            panel_id=panel,
            y_zero=y_zero,
        )

    def streamed(self, panel: str, title: str) -> str:
        """The note standing for a per-frame panel of a run judged on the bounded path."""
        return (
            f'<p class="note" data-panel="{panel}">{escape(title)}: not drawn for a run judged '
            "on the bounded path (its frames were streamed, not loaded)</p>"
        )

    def stages(self) -> str:
        if self.bounded:
            return self.streamed("stages", "Stage latencies")
        t = self.data.frames["t_capture"]
        ok = self.data.frames["skipped"] == 0
        series = []
        for col in STAGE_COLUMNS:
            y = self.data.frame(col)
            w = stats.window_reduce(t[ok], y[ok], self.pw, t0=0.0)
            has = w.nonempty()
            if has.any():
                series.append(Series(col.removesuffix("_ms"), w.t[has], w.median[has]))
        y = self.data.frame("infer_ms")
        w = stats.window_reduce(t[ok], y[ok], self.pw, t0=0.0, medians=False)
        has = w.nonempty()
        if has.any():
            series.append(Series("infer max", w.t[has], w.max[has], dash="3 2", width=1.0))
        return self.chart(series, "stages", "Stage latencies (window medians)", "ms")

    def chunk_stages(self) -> list[str]:
        """A rollout's named chunk stages, a panel each: window medians and maxima."""
        if self.bounded:
            return []
        t = self.data.frames["t_capture"]
        out = []
        for name, y in self.data.stages.items():
            w = stats.window_reduce(t, y, self.pw, t0=0.0)
            has = w.nonempty()
            if not has.any():
                continue
            series = [
                Series("window median", w.t[has], w.median[has]),
                Series("window max", w.t[has], w.max[has], dash="3 2", width=1.0),
            ]
            title = f"Chunk stage {name} (ms per chunk)"
            out.append(self.chart(series, f"stage-{name}", title, "ms"))
        return out

    def age(self) -> str:
        v, c = self.v, self.v.get("interval") or self.v.get("frame_age")
        name = c.criterion if c else "frame_age"
        title = "Output interval" if name == "interval" else "Frame age"
        w = v.series.get(name)
        series: list[Series] = []
        if w is not None:
            series += [
                Series("window median", w.t, w.median),
                Series("window max", w.t, w.max, dash="3 2", width=1.0),
            ]
        tol = (c.threshold or 0.0) / 60 if c else 0.0
        top = float(np.nanmax(w.max)) * 1.2 if w is not None and w.nonempty().any() else None
        series += _trend_lines(v, name, self.t0, self.t1, 1.0, tol, top)
        hl = []
        if c and c.evidence.get("max_age_p95_ms"):
            hl.append(HLine(float(c.evidence["max_age_p95_ms"]), "p95 limit"))
        return self.chart(series, name, f"{title} (ms), trend and tolerance", "ms", hl)

    def drops(self) -> str:
        w = self.v.series.get("drop_rate")
        c = self.v.get("drops")
        series = [Series("loss rate per window", w.t, w.median * 100, kind="step")] if w else []
        series += (
            _trend_lines(self.v, "drop_rate", self.t0, self.t1, 0.01, 0.0)[:1]
            if w is not None
            else []
        )
        hl = [HLine(c.threshold * 100, "max_drop_fraction")] if c and c.threshold else []
        t = self.data.frames["t_capture"]
        cum = np.nan_to_num(self.data.frame("drop_count")) + np.nan_to_num(
            self.data.frame("stale_count")
        )
        total = float(cum.max()) if cum.size else 0.0
        return self.chart(
            series,
            "drops",
            f"Dropped + stale frames, % per window ({total:.0f} in all, {t.size} rows)",
            "%",
            hl,
        )

    def memory(self, names: tuple[tuple[str, str], ...], panel: str, title: str) -> str:
        st = self.data.samples["t"]
        series: list[Series] = []
        for crit, col in names:
            y = self.data.sample(col)
            w = self.v.series.get(crit)
            if self.bounded and w is not None and w.nonempty().any():  # window peaks instead
                has = w.nonempty()
                label = f"{col.removesuffix('_bytes')} window max"
                series.append(Series(label, w.t[has], w.max[has] / MIB, width=1.0))
            elif not np.isfinite(y).any():
                continue
            else:
                series.append(Series(col.removesuffix("_bytes"), st, y / MIB, width=1.0))
            if w is not None:
                series.append(
                    Series(f"{col.removesuffix('_bytes')} floor", w.t, w.floor / MIB, kind="points")
                )
            c = self.v.get(crit)
            tol = (c.threshold or 0.0) * MIB / 60 if c else 0.0
            series += _trend_lines(self.v, crit, self.t0, self.t1, MIB, tol)
        if not series:
            return f'<p class="note" data-panel="{panel}">{escape(title)}: no data</p>'
        return self.chart(series, panel, title, "MB", y_zero=False)

    def util(self) -> str:
        """GPU and CPU utilisation as means over windows of at least ``_CPU_WINDOW_S``: one
        psutil reading over a 100-200 ms tick is quantised (0 or 10 % of a core), the mean
        over a window is the CPU time used in it."""
        st = self.data.samples["t"]
        width = max(_CPU_WINDOW_S, self.x_range[1] / _CPU_WINDOWS)
        series = []
        for col in ("gpu_util_pct", "cpu_pct"):
            y = self.data.sample(col)
            if np.isfinite(y).any():
                c, _n, mean = _binned(st, y, width, self.x_range[1])
                series.append(Series(f"{col.removesuffix('_pct')} ({width:.2g} s mean)", c, mean))
        if not series:
            return '<p class="note" data-panel="util">Utilisation: no data</p>'
        return self.chart(series, "util", "GPU / CPU utilisation (%, window means)", "%")

    def queue(self) -> str:
        """The frame queue's length when each frame was taken: window medians and maxima."""
        if self.bounded:
            return self.streamed("queue", "Queue length")
        t, q = self.data.frames["t_capture"], self.data.frame("queue_len")
        if not np.isfinite(q).any():
            return '<p class="note" data-panel="queue">Queue length: no data</p>'
        w = stats.window_reduce(t, q, self.pw, t0=0.0)
        has = w.nonempty()
        series = [
            Series("window median", w.t[has], w.median[has], kind="step"),
            Series("window max", w.t[has], w.max[has], kind="step", dash="3 2", width=1.0),
        ]
        return self.chart(series, "queue", "Frame queue length (frames waiting)", "frames")

    def fps(self) -> str:
        """Achieved frame rate: frames finished (``t_done``) per window, against the target."""
        if self.bounded:
            return self.streamed("fps", "Achieved frame rate")
        done = self.data.frame("t_done")
        if not np.isfinite(done).any():
            done = self.data.frames["t_capture"]
        width = max(self.pw, 1.0)
        c, n, _ = _binned(done, None, width, self.x_range[1])
        ends = (np.arange(c.size) + 1) * width
        full = ends <= float(np.nanmax(done)) + 1e-9  # a last partial window reads low
        series = [Series(f"frames done per {width:.3g} s", c[full], n[full] / width)]
        target = self.data.meta.fps
        hl = [HLine(float(target), f"target {target:g} fps", color="#7f7f7f")] if target else []
        return self.chart(series, "fps", "Achieved frame rate (fps)", "fps", hl)


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
            f"<td>{escape(c.unit)}</td><td>{escape(c.detail)}</td></tr>"
        )
    notes = "".join(f"<li>warning: {escape(w)}</li>" for w in verdict.warnings)
    notes += "".join(f"<li>hint: {escape(h)}</li>" for h in verdict.hints)
    panels = [
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
            if m.workload_kind == "openai"
            else []
        ),
        p.util(),
        p.queue(),
        p.fps(),
    ]
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
        + "".join(f'<div class="panel">{s}</div>' for s in panels)
        + f'<p class="note">generated by soakd {__version__}</p></body></html>\n'
    )
