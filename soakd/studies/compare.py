"""``soakd compare``: what changed between two runs, and whether each change is beyond the
runs' own noise.

A comparison has four parts:

* the configuration diff (flattened dotted keys; ``run.name``, ``run.db``, ``run.duration``,
  ``run.log_every`` and ``[service]`` are ignored), with a warning when more than one
  variable differs: a comparison that changes two things explains neither;
* side-by-side metrics, each with its change and a stated test (see ``TESTS``);
* the criterion outcomes of both verdicts;
* ``regression(metric, pct)``: the release-gate check behind ``--fail-on-regression``.

Runs too long to load (``soakd.analysis.data.BOUNDED_ROWS``; either run over it and both
are read this way) are compared in bounded memory: each timing column is streamed into a
``quantiles.StreamQuantiles`` twice (percentiles exact to float32 rounding, 1e-6 relative)
while every k-th frame is kept as the sample the tests see (at most ``SAMPLE_N`` per run:
all of them in a shorter run, so the tests then get the same values as the exact path);
memory floors are SQLite's per-window minima (``rundata.sample_windows``).

"Beyond noise" means the stated test rejects "no difference" at ``alpha`` (default 0.01)
*and* the change is at least ``min_effect_pct`` (default 5 %) of run A's value and at least
``MIN_EFFECT_MS`` (0.1 ms) for timings: per-frame
timings are autocorrelated and runs on a shared machine drift by a few percent, so a
statistically detectable 1 % shift is not treated as a change.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from html import escape
from typing import Any

import numpy as np

from soakd.analysis.data import BOUNDED_ROWS, load_run_data
from soakd.analysis.digest import window_bounds
from soakd.analysis.model import RunData, floor_window_s
from soakd.analysis.quantiles import StreamQuantiles
from soakd.analysis.stats import scipy_stats, window_count, window_reduce
from soakd.config import CriteriaSettings, flatten
from soakd.errors import UsageError
from soakd.records import STAGE_COLUMNS
from soakd.store import profiling_queries as q
from soakd.store import rundata, runs
from soakd.store.runs import RunRow

SCHEMA = "soakd.compare/1"
IGNORED_KEYS: tuple[str, ...] = ("run.name", "run.db", "run.duration", "run.log_every")
IGNORED_SECTIONS: tuple[str, ...] = ("service",)
MEMORY_COLUMNS: tuple[str, ...] = (
    "rss_bytes",
    "gpu_mem_used_bytes",
    "gpu_proc_mem_bytes",
    "torch_reserved_bytes",
)
MW = "Mann–Whitney U (two-sided)"
BOOT = "bootstrap CI of the difference"
FISHER = "Fisher exact (two-sided)"
THEIL = "Theil–Sen CIs disjoint"
NO_TEST = "no test"
TESTS: dict[str, str] = {
    "p50": f"{MW} on the per-frame values",
    "p95": f"{BOOT} in p95 (500 resamples, CI level 1 - alpha)",
    "p99": f"{BOOT} in p99 (500 resamples, CI level 1 - alpha)",
    "max": f"{NO_TEST}: a single value",
    "drop_fraction": f"{FISHER} on lost vs dispatched frame counts",
    "floor_slope": f"{THEIL}: the two runs' Theil–Sen slope CIs (level 1 - alpha) do not overlap",
}
MIN_EFFECT_MS = 0.1  # timing changes smaller than this are scheduler noise, whatever the p
_BOOT_RESAMPLES = 500
_BOOT_MAX_N = 5000
_MB = float(1 << 20)
#: on the bounded path, the most frames per run the tests see (every k-th one)
SAMPLE_N = 200_000
_PCTS = (50.0, 95.0, 99.0)


@dataclass(frozen=True)
class Values:
    """One run's per-frame values of a column: ``n`` (how many), ``sample`` (what the tests
    see: all of them, or on the bounded path every k-th), and its percentiles (of all the
    values: numpy's on the sample when it holds them all, else ``streamed``)."""

    n: int
    sample: np.ndarray
    streamed: Callable[[float], float] | None = None

    @classmethod
    def of(cls, v: np.ndarray) -> Values:
        return cls(int(v.size), v)

    def quantile(self, pct: float) -> float | None:
        if not self.n:
            return None
        if self.streamed is None:
            return float(np.percentile(self.sample, pct))
        return self.streamed(pct)


@dataclass(frozen=True, slots=True)
class ConfigChange:
    key: str
    a: Any
    b: Any


@dataclass(frozen=True, slots=True)
class MetricRow:
    """One metric of both runs. ``beyond_noise`` is None when there is no test (or no data);
    higher is worse for every metric soakd compares."""

    name: str
    unit: str
    a: float | None
    b: float | None
    change: float | None
    change_pct: float | None
    test: str
    p: float | None
    beyond_noise: bool | None


@dataclass(frozen=True, slots=True)
class CriterionRow:
    criterion: str
    a_status: str | None
    b_status: str | None
    a_value: float | None
    b_value: float | None
    unit: str | None
    changed: bool


@dataclass(frozen=True, slots=True)
class RunBrief:
    id: str
    name: str | None
    mode: str
    status: str
    verdict: str | None
    workload_kind: str | None
    started_at: str
    duration_s: float | None
    measured_frames: int


@dataclass(frozen=True, slots=True)
class Regression:
    metric: str
    threshold_pct: float
    failed: bool
    message: str


@dataclass
class Comparison:
    run_a: RunBrief
    run_b: RunBrief
    config_diff: list[ConfigChange]
    warnings: list[str]
    metrics: list[MetricRow]
    criteria: list[CriterionRow]
    alpha: float
    min_effect_pct: float
    tests: dict[str, str] = field(default_factory=lambda: dict(TESTS))

    def metric(self, name: str) -> MetricRow:
        for m in self.metrics:
            if m.name == name:
                return m
        known = ", ".join(m.name for m in self.metrics)
        raise UsageError(f"--metric {name}: not a metric of this comparison (known: {known})")

    def regression(self, metric: str, pct: float) -> Regression:
        """Did ``metric`` get worse (higher) in run B by more than ``pct`` percent, beyond
        noise? Metrics without a test (a max) fail on the threshold alone."""
        m = self.metric(metric)
        if m.a is None or m.b is None or m.change_pct is None:
            return Regression(metric, pct, False, f"{metric}: no data in one of the runs")
        worse = m.change_pct > pct
        significant = m.beyond_noise is not False
        failed = worse and significant
        pct_s = _fmt_pct(m.change_pct)
        if failed:
            why = f"p {_fmt_p(m.p, eq=True)}" if m.p is not None else m.test
            msg = f"REGRESSION {metric}: {_fmt(m.a)} -> {_fmt(m.b)} {m.unit} ({pct_s}, {why})"
        elif worse:
            msg = f"{metric}: {pct_s} but within noise ({m.test}, p {_fmt_p(m.p, eq=True)})"
        else:
            msg = f"{metric}: {pct_s}, within the {pct:g}% allowance"
        return Regression(metric, pct, failed, msg)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d = {"schema": SCHEMA, **d}
        return _finite(d)

    def to_markdown(self) -> str:
        return render_markdown(self)

    def to_html(self) -> str:
        return render_html(self)


# --- building a comparison


def config_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[ConfigChange]:
    """Keys whose value differs between two resolved configs (missing = None)."""
    fa, fb = flatten(a), flatten(b)
    out = []
    for key in sorted(set(fa) | set(fb)):
        if key in IGNORED_KEYS or key.split(".", 1)[0] in IGNORED_SECTIONS:
            continue
        va, vb = fa.get(key), fb.get(key)
        if va != vb:
            out.append(ConfigChange(key, va, vb))
    return out


def compare(
    conn: sqlite3.Connection,
    run_a: str,
    run_b: str,
    *,
    alpha: float = 0.01,
    min_effect_pct: float = 5.0,
    seed: int = 0,
    bounded: bool | None = None,
) -> Comparison:
    """Compare two stored runs (ids as stored; see ``soakd.store.runs.resolve``).
    ``bounded``: read both in bounded memory (module docstring); None: when either run has
    more than BOUNDED_ROWS frame + sample rows (never a generator run)."""
    ra, rb = runs.get_run(conn, run_a), runs.get_run(conn, run_b)
    rng = np.random.default_rng(seed)
    if bounded is None:
        cap = BOUNDED_ROWS + 1
        big = any(sum(rundata.count_rows(conn, r.id, cap)) > BOUNDED_ROWS for r in (ra, rb))
        bounded = big and "generator" not in (ra.workload_kind, rb.workload_kind)
    ca, cb = q.frame_counts(conn, ra.id), q.frame_counts(conn, rb.id)
    fa, fb = (
        _stream_frames(conn, r, c) if bounded else _load_frames(conn, r)
        for r, c in ((ra, ca), (rb, cb))
    )
    metrics = _stage_metrics(fa, fb, alpha, min_effect_pct, rng)
    metrics.append(
        _drop_metric(
            ca, cb, alpha, rundata.load_verdict_rows(conn, ra.id),
            rundata.load_verdict_rows(conn, rb.id),
        )
    )  # fmt: skip
    da, db = (load_run_data(conn, r.id, bounded=True if bounded else None) for r in (ra, rb))
    metrics.extend(_memory_metrics(conn, (ra, da), (rb, db), alpha, bounded))
    if "generator" in (ra.workload_kind, rb.workload_kind):
        metrics.extend(_stream_metrics(conn, ra, rb, alpha, min_effect_pct, rng))
    diff = config_diff(ra.config, rb.config)
    briefs = (_brief(ra, fa, da, ca), _brief(rb, fb, db, cb))
    notes = [_sample_note(fa, fb)] if bounded else []
    return Comparison(
        run_a=briefs[0],
        run_b=briefs[1],
        config_diff=diff,
        warnings=_warnings(diff, ra, rb, briefs) + notes,
        metrics=metrics,
        criteria=_criteria(q.verdict_rows(conn, ra.id), q.verdict_rows(conn, rb.id)),
        alpha=alpha,
        min_effect_pct=min_effect_pct,
    )


_FRAME_COLS = (*STAGE_COLUMNS, "frame_age_ms")


def _load_frames(conn: sqlite3.Connection, run: RunRow) -> dict[str, Values]:
    vals = q.frame_values(conn, run.id, _FRAME_COLS, profile=run.mode == "profile")
    return {k: Values.of(v[np.isfinite(v)]) for k, v in vals.items()}


def _stream_frames(
    conn: sqlite3.Connection, run: RunRow, counts: Mapping[str, int]
) -> dict[str, Values]:
    """``_load_frames`` in bounded memory: two streamed passes (the second reads only the
    frames in the bins that hold a wanted percentile) and every k-th frame kept (k from
    ``counts``, the run's ``frame_counts``: at least as many frames as are read)."""
    profile = run.mode == "profile"
    stride = max(1, math.ceil(counts["dispatched" if profile else "measured"] / SAMPLE_N))
    qs = {c: StreamQuantiles() for c in _FRAME_COLS}
    kept: dict[str, list[np.ndarray]] = {c: [] for c in _FRAME_COLS}
    seen = 0
    for ch in rundata.value_chunks(conn, run.id, _FRAME_COLS, profile=profile):
        n = len(ch[_FRAME_COLS[0]])
        pick = (seen + np.arange(n)) % stride == 0
        seen += n
        for c in _FRAME_COLS:
            qs[c].add(ch[c].astype(np.float32))
            v = ch[c][pick]
            kept[c].append(v[np.isfinite(v)])
    for sq in qs.values():
        sq.want_percentiles(_PCTS)
    ranges = [(c, lo, hi) for c, sq in qs.items() for lo, hi in sq.bounds()]
    for ch in rundata.value_chunks(conn, run.id, _FRAME_COLS, profile=profile, ranges=ranges):
        for c, sq in qs.items():
            sq.refine(ch[c].astype(np.float32))
    return {
        c: Values(qs[c].n, np.concatenate(kept[c]), _streamed_percentile(qs[c]))
        for c in _FRAME_COLS
    }


def _sample_note(fa: Mapping[str, Values], fb: Mapping[str, Values]) -> str:
    """What the tests of a bounded comparison saw."""
    a, b = fa["total_ms"], fb["total_ms"]
    return (
        "long runs compared in bounded memory: percentiles exact over every frame; the tests "
        f"on a sample of every k-th frame ({a.sample.size} of {a.n} in A, "
        f"{b.sample.size} of {b.n} in B)"
    )


def _streamed_percentile(sq: StreamQuantiles) -> Callable[[float], float]:
    return lambda pct: sq.max if pct >= 100 else sq.percentile(pct)


def _brief(
    run: RunRow, frames: Mapping[str, Values], data: RunData, counts: Mapping[str, int]
) -> RunBrief:
    """The run's row and its measured frames: for a soak run the verdict's own count (its
    ``run`` criterion's: post-warm-up, dispatched, captured from the measured window's
    start, errors included), so compare and the verdict say one number; for a profile run
    every frame with values but the first."""
    if run.mode == "profile":
        n = max((v.n for v in frames.values()), default=0)
    elif data.source is not None:  # bounded: the rows stay in the store
        n = counts["measured"]
    else:
        n = int(data.measured(data.warmup_end()).sum())
    return RunBrief(
        id=run.id,
        name=run.name,
        mode=run.mode,
        status=run.status,
        verdict=run.verdict,
        workload_kind=run.workload_kind,
        started_at=run.started_at,
        duration_s=run.duration_s,
        measured_frames=n,
    )


def _warnings(
    diff: Sequence[ConfigChange], ra: RunRow, rb: RunRow, briefs: Sequence[RunBrief]
) -> list[str]:
    out = []
    if len(diff) > 1:
        keys = ", ".join(c.key for c in diff[:6]) + (", ..." if len(diff) > 6 else "")
        out.append(
            f"{len(diff)} configuration variables differ ({keys}): a comparison that changes "
            "two things explains neither"
        )
    if ra.mode != rb.mode:
        out.append(f"comparing a {ra.mode} run with a {rb.mode} run: their frame windows differ")
    for label, r in (("A", ra), ("B", rb)):
        if r.status != "completed":
            why = f": {r.reason}" if r.reason else ""
            out.append(f"run {label} ({r.id}) did not complete ({r.status}{why})")
    for label, b in zip("AB", briefs, strict=True):
        if b.measured_frames < 20:
            out.append(
                f"run {label} has only {b.measured_frames} measured frames: "
                "changes are hard to tell from noise"
            )
    return out


def _pct(a: float | None, b: float | None) -> tuple[float | None, float | None]:
    if a is None or b is None:
        return None, None
    change = b - a
    if a == 0:
        return change, (0.0 if change == 0 else math.copysign(math.inf, change))
    return change, 100.0 * change / abs(a)


def _row(
    name: str,
    unit: str,
    a: float | None,
    b: float | None,
    test: str,
    p: float | None,
    significant: bool | None,
    min_effect_pct: float | None,
) -> MetricRow:
    change, pct = _pct(a, b)
    beyond: bool | None = significant
    if significant is not None and min_effect_pct is not None and pct is not None:
        big = abs(pct) >= min_effect_pct and abs(change or 0.0) >= MIN_EFFECT_MS
        beyond = significant and big
    return MetricRow(name, unit, a, b, change, pct, test, p, beyond)


def _mannwhitney(a: np.ndarray, b: np.ndarray) -> float | None:
    if a.size < 2 or b.size < 2:
        return None
    if np.ptp(np.concatenate([a, b])) == 0:
        return 1.0
    return float(scipy_stats().mannwhitneyu(a, b, alternative="two-sided").pvalue)


def _bootstrap_pct(
    a: np.ndarray, b: np.ndarray, pct: float, alpha: float, rng: np.random.Generator
) -> bool | None:
    """True when the bootstrap CI (level 1 - alpha) of the ``pct``-th percentile of b minus
    that of a excludes 0."""
    if a.size < 10 or b.size < 10:
        return None
    if a.size > _BOOT_MAX_N:
        a = rng.choice(a, _BOOT_MAX_N, replace=False)
    if b.size > _BOOT_MAX_N:
        b = rng.choice(b, _BOOT_MAX_N, replace=False)
    qa = np.percentile(rng.choice(a, (_BOOT_RESAMPLES, a.size)), pct, axis=1)
    qb = np.percentile(rng.choice(b, (_BOOT_RESAMPLES, b.size)), pct, axis=1)
    lo, hi = np.percentile(qb - qa, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return bool(lo > 0 or hi < 0)


def _distribution_rows(
    name: str,
    a: Values,
    b: Values,
    alpha: float,
    min_effect: float,
    rng: np.random.Generator,
    quantiles: Sequence[str] = ("p50", "p95", "p99", "max"),
) -> list[MetricRow]:
    """Each of ``quantiles`` of both runs' values, tested on their samples."""
    rows = []
    for qn in quantiles:
        pct = 100.0 if qn == "max" else float(qn[1:])
        qa, qb = a.quantile(pct), b.quantile(pct)
        if qn == "p50":
            p = _mannwhitney(a.sample, b.sample)
            sig = None if p is None else p < alpha
            rows.append(_row(f"{name}.p50", "ms", qa, qb, MW, p, sig, min_effect))
        elif qn in ("p95", "p99"):
            sig = _bootstrap_pct(a.sample, b.sample, pct, alpha, rng)
            rows.append(_row(f"{name}.{qn}", "ms", qa, qb, BOOT, None, sig, min_effect))
        else:
            rows.append(_row(f"{name}.max", "ms", qa, qb, NO_TEST, None, None, None))
    return rows


def _stage_metrics(
    fa: Mapping[str, Values],
    fb: Mapping[str, Values],
    alpha: float,
    min_effect: float,
    rng: np.random.Generator,
) -> list[MetricRow]:
    rows: list[MetricRow] = []
    for col in STAGE_COLUMNS:
        if fa[col].n or fb[col].n:
            rows.extend(_distribution_rows(col, fa[col], fb[col], alpha, min_effect, rng))
    rows.extend(
        _distribution_rows(
            "frame_age_ms",
            fa["frame_age_ms"],
            fb["frame_age_ms"],
            alpha,
            min_effect,
            rng,
            ("p50", "p95", "p99"),
        )
    )
    return rows


def _verdict_losses(rows: list[dict[str, Any]]) -> tuple[int, int] | None:
    """(lost, not lost) frames as the stored drops criterion counted them (its value is
    lost / ticks), or None for a run without that evidence."""
    ev = next((r["evidence"] for r in rows if r["criterion"] == "drops"), None) or {}
    lost, ticks = ev.get("lost"), ev.get("ticks")
    if not all(isinstance(v, int | float) and math.isfinite(v) for v in (lost, ticks)):
        return None
    n_lost, n_ticks = int(lost), int(ticks)  # type: ignore[arg-type]
    return (n_lost, n_ticks - n_lost) if n_ticks >= n_lost >= 0 else None


def _drop_metric(
    ca: Mapping[str, int],
    cb: Mapping[str, int],
    alpha: float,
    va: list[dict[str, Any]] | None = None,
    vb: list[dict[str, Any]] | None = None,
) -> MetricRow:
    """The lost fraction after the warm-up, one definition for both runs: the drops
    criterion's own (lost / ticks, from the stored verdicts: the number the Criteria table
    shows) when both runs have it, else lost vs dispatched frames (``frame_counts``)."""

    def lost_kept(c: Mapping[str, int]) -> tuple[int, int]:
        return c["post_drops"] + c["post_stale"], c["measured"]

    ja, jb = _verdict_losses(va or []), _verdict_losses(vb or [])
    if ja is not None and jb is not None:
        (la, ka), (lb, kb) = ja, jb
    else:
        (la, ka), (lb, kb) = lost_kept(ca), lost_kept(cb)
    fa = la / (la + ka) if la + ka else None
    fb = lb / (lb + kb) if lb + kb else None
    p = None
    if fa is not None and fb is not None:
        p = float(scipy_stats().fisher_exact([[la, ka], [lb, kb]], alternative="two-sided").pvalue)
    return _row(
        "drop_fraction", "fraction", fa, fb, FISHER, p, None if p is None else p < alpha, None
    )


def floor_slope(
    t: np.ndarray,
    v: np.ndarray,
    window_s: float,
    alpha: float,
    *,
    t0: float | None = None,
    t1: float | None = None,
) -> tuple[float, float, float] | None:
    """Theil–Sen slope of the window floors (windows from ``t0`` to ``t1``) in MB/min with
    its CI (level 1 - alpha), or None with fewer than three windows."""
    w = window_reduce(t, v, window_s, t0=t0, t1=t1, medians=False)
    ok = w.nonempty()
    return _theil(w.t[ok], w.floor[ok], alpha)


def _theil(wt: np.ndarray, wf: np.ndarray, alpha: float) -> tuple[float, float, float] | None:
    """``floor_slope`` of the non-empty windows' centres ``wt`` and floors ``wf``."""
    if wt.size < 3:
        return None
    slope, _icpt, lo, hi = scipy_stats().theilslopes(wf / _MB, wt / 60.0, alpha=1 - alpha)
    return float(slope), float(lo), float(hi)


def _floor_window(run: RunRow, data: RunData) -> tuple[float, float, float]:
    """(t0, t1, window_s) of a run's memory floors, as the verdict takes them: the measured
    window (from the start for a profile run) and ``floor_window_s`` shortened for a short
    run (``soakd.analysis.model.floor_window_s``). ``data``: the run's RunData (bounded:
    its rows left in the store)."""
    profile = run.mode == "profile"
    if data.source is not None:  # rows left in the store (a long run): bounds from there
        t0, t1 = window_bounds(data, data.source)
        t0 = 0.0 if profile else t0
    else:
        t0 = 0.0 if profile else data.warmup_end()
        t1 = data.window_end(t0)
    default = CriteriaSettings.model_fields["floor_window_s"].default
    configured = float(run.config.get("criteria", {}).get("floor_window_s", default))
    window, _note = floor_window_s(max(t1 - t0, 0.0), configured)
    return t0, t1, window


Fit = tuple[float, float, float] | None


def _floor_fits(
    conn: sqlite3.Connection, run: RunRow, data: RunData, alpha: float, bounded: bool
) -> dict[str, tuple[bool, Fit]]:
    """Per memory column: whether it was sampled from t0 on, and its ``floor_slope``; on
    the bounded path from SQLite's per-window counts and minima (the same windows)."""
    t0, t1, window = _floor_window(run, data)
    if not bounded:
        out = {}
        for col in MEMORY_COLUMNS:
            t, v = q.sample_series(conn, run.id, col, t_min=t0)
            out[col] = (bool(t.size), floor_slope(t, v, window, alpha, t0=t0, t1=t1))
        return out
    nwin = window_count(t0, t1, window)
    agg = rundata.sample_windows(conn, run.id, t0, t1, window, nwin, MEMORY_COLUMNS)
    w = agg["w"].astype(np.int64)
    centres = t0 + (w + 0.5) * window
    fits: dict[str, tuple[bool, Fit]] = {}
    for col in MEMORY_COLUMNS:
        ok = (w >= 0) & (agg[f"count:{col}"] > 0)
        fits[col] = (bool(ok.any()), _theil(centres[ok], agg[f"min:{col}"][ok], alpha))
    return fits


def _memory_metrics(
    conn: sqlite3.Connection,
    a: tuple[RunRow, RunData],
    b: tuple[RunRow, RunData],
    alpha: float,
    bounded: bool = False,
) -> list[MetricRow]:
    rows = []
    (ra, _), (rb, _) = a, b
    fits = {r.id: _floor_fits(conn, r, d, alpha, bounded) for r, d in (a, b)}
    for col in MEMORY_COLUMNS:
        if not (fits[ra.id][col][0] or fits[rb.id][col][0]):
            continue
        fa, fb = fits[ra.id][col][1], fits[rb.id][col][1]
        sig = None
        test = f"{NO_TEST}: fewer than 3 floor windows"
        if fa is not None and fb is not None:
            sig = fa[2] < fb[1] or fb[2] < fa[1]
            test = THEIL
        va, vb = (None if f is None else f[0] for f in (fa, fb))
        name = f"{col.removesuffix('_bytes')}.floor_slope"
        rows.append(_row(name, "MB/min", va, vb, test, None, sig, None))
    return rows


def _stream_metrics(
    conn: sqlite3.Connection,
    ra: RunRow,
    rb: RunRow,
    alpha: float,
    min_effect: float,
    rng: np.random.Generator,
) -> list[MetricRow]:
    def first_emit(r: RunRow) -> np.ndarray:
        v = q.frame_values(conn, r.id, ("first_emit_ms",), profile=r.mode == "profile")
        x = v["first_emit_ms"]
        return x[np.isfinite(x)]

    def intervals(r: RunRow) -> np.ndarray:
        return q.emission_intervals(conn, r.id, profile=r.mode == "profile")

    fa, fb = Values.of(first_emit(ra)), Values.of(first_emit(rb))
    rows = _distribution_rows("first_emit_ms", fa, fb, alpha, min_effect, rng, ("p50", "max"))
    ia, ib = Values.of(intervals(ra)), Values.of(intervals(rb))
    rows += _distribution_rows("interval_ms", ia, ib, alpha, min_effect, rng)
    return rows


def _criteria(
    va: Mapping[str, Mapping[str, Any]], vb: Mapping[str, Mapping[str, Any]]
) -> list[CriterionRow]:
    out = []
    for name in sorted(set(va) | set(vb)):
        a, b = va.get(name, {}), vb.get(name, {})
        out.append(
            CriterionRow(
                criterion=name,
                a_status=a.get("status"),
                b_status=b.get("status"),
                a_value=a.get("value"),
                b_value=b.get("value"),
                unit=a.get("unit") or b.get("unit"),
                changed=a.get("status") != b.get("status"),
            )
        )
    return out


# --- rendering


def _finite(v: Any) -> Any:
    """JSON has no inf/NaN: map them to None (a change from 0 is reported as null %)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    return v


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "∞" if v > 0 else "-∞"
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 100:
            return f"{v:.0f}"
        if a >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return str(v)


def _fmt_pct(p: float | None) -> str:
    if p is None:
        return "–"
    if not math.isfinite(p):
        return "new" if p > 0 else "gone"
    return f"{p:+.1f}%"


def _fmt_p(p: float | None, *, eq: bool = False) -> str:
    if p is None:
        return "–"
    if p < 1e-4:
        return "< 1e-4" if eq else "<1e-4"
    return f"= {p:.2g}" if eq else f"{p:.2g}"


def _md_cell(v: Any) -> str:
    return _fmt(v).replace("|", "\\|").replace("\n", " ")


@dataclass(frozen=True, slots=True)
class Table:
    """One section of a rendered comparison: a title, column headers, rows of cell values
    (formatted by the renderer), and notes (warnings, legends) under the title."""

    title: str
    headers: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    empty: str = ""
    notes: tuple[str, ...] = ()


_QUANTILES = ("p50", "p95", "p99", "max")
#: the columns whose percentiles the stage table shows (so the metrics table does not)
_STAGE_TABLE_COLUMNS = (*STAGE_COLUMNS, "frame_age_ms")


def direction(m: MetricRow) -> str | None:
    """A metric's change in words for the tables: "worse" or "better" when beyond noise
    (higher is worse for every metric), "no" when not, None without a test."""
    if m.beyond_noise is None:
        return None
    if not m.beyond_noise:
        return "no"
    return "worse" if (m.change or 0) > 0 else "better"


_STATUS_RANK = {"pass": 0, "n/a": 0, "invalid": 1, "fail": 2}


def criterion_change(r: CriterionRow) -> str:
    """A criterion's outcome from A to B: "worse" (PASS to FAIL or INVALID, INVALID to
    FAIL), "better" (the other way), "changed" (another change), "no"."""
    if not r.changed:
        return "no"
    ra, rb = (_STATUS_RANK.get(str(s).lower()) for s in (r.a_status, r.b_status))
    if ra is None or rb is None or ra == rb:
        return "changed"
    return "worse" if rb > ra else "better"


def _in_stage_table(m: MetricRow) -> bool:
    col, _, qn = m.name.rpartition(".")
    return col in _STAGE_TABLE_COLUMNS and qn in _QUANTILES


def stage_table(c: Comparison) -> Table:
    """Both runs' stage percentiles side by side: one row per stage and percentile (and the
    max), with the change, the test's p-value (p50) and whether it is beyond noise."""
    by = {m.name: m for m in c.metrics}
    rows: list[tuple[Any, ...]] = []
    for col in _STAGE_TABLE_COLUMNS:
        for qn in _QUANTILES:
            m = by.get(f"{col}.{qn}")
            if m is not None:
                change, p = _fmt_pct(m.change_pct), _fmt_p(m.p)
                rows.append((col.removesuffix("_ms"), qn, m.a, m.b, change, p, direction(m)))
    return Table(
        "Stage percentiles (ms)",
        ("stage", "percentile", "A", "B", "change", "p", "significant"),
        rows,
        "No stage timings in either run.",
        (
            f"significant: the test ({TESTS['p50']} for p50, {BOOT} for p95/p99; none for "
            f"the max, a single value) rejects no-difference at alpha = {c.alpha:g} and the "
            f"change is at least {c.min_effect_pct:g}% of A and {MIN_EFFECT_MS:g} ms; worse: "
            "B is higher (slower), better: B is lower.",
        ),
    )


def _tables(c: Comparison) -> list[Table]:
    """The comparison's sections, in order, for both renderers."""
    a, b = c.run_a, c.run_b
    runs_rows = [
        ("name", a.name, b.name),
        ("mode", a.mode, b.mode),
        ("status", a.status, b.status),
        ("verdict", a.verdict, b.verdict),
        ("workload", a.workload_kind, b.workload_kind),
        ("started", a.started_at, b.started_at),
        ("measured frames", a.measured_frames, b.measured_frames),
    ]
    legend = (
        f"Beyond noise: the test rejects no-difference at alpha = {c.alpha:g} and the "
        f"change is at least {c.min_effect_pct:g}% of A and {MIN_EFFECT_MS:g} ms (timings), "
        "or the test alone (drop fraction, memory slopes). Higher is worse for every metric: "
        "beyond noise reads worse (B higher) or better (B lower). drop_fraction is the drops "
        "criterion's own lost / ticks where both runs were judged."
    )
    return [
        Table(
            "Runs",
            ("", "A", "B"),
            list(runs_rows),
            notes=tuple(f"Warning: {w}" for w in c.warnings),
        ),
        stage_table(c),
        Table(
            "Configuration diff",
            ("key", "A", "B"),
            [(f"`{d.key}`", d.a, d.b) for d in c.config_diff],
            "No configuration difference (run name, db and duration ignored).",
        ),
        Table(
            "Metrics",
            ("metric", "unit", "A", "B", "change", "test", "p", "beyond noise"),
            [
                (
                    m.name,
                    m.unit,
                    m.a,
                    m.b,
                    _fmt_pct(m.change_pct),
                    m.test,
                    _fmt_p(m.p),
                    direction(m),
                )
                for m in c.metrics
                if not _in_stage_table(m)  # shown once, in the stage table
            ],
            notes=(legend,),
        ),
        Table(
            "Criteria",
            ("criterion", "A", "B", "A value", "B value", "unit", "changed"),
            [
                (
                    r.criterion,
                    r.a_status,
                    r.b_status,
                    r.a_value,
                    r.b_value,
                    r.unit,
                    criterion_change(r),
                )
                for r in c.criteria
            ],
            "Neither run has a stored verdict.",
        ),
    ]


def _md_table(t: Table) -> list[str]:
    if not t.rows:
        return [t.empty]
    lines = ["| " + " | ".join(t.headers) + " |", "|" + "---|" * len(t.headers)]
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in t.rows]
    return lines


def render_markdown(c: Comparison) -> str:
    """The comparison as GitHub-flavoured Markdown."""
    lines = [f"## soakd compare: `{c.run_a.id}` (A) vs `{c.run_b.id}` (B)"]
    for t in _tables(c):
        if t.title != "Runs":
            lines += ["", f"### {t.title}"]
        warn = [n for n in t.notes if n.startswith("Warning: ")]
        if warn:
            lines += [""] + [f"> **Warning:** {n.removeprefix('Warning: ')}" for n in warn]
        lines += ["", *_md_table(t)]
        lines += [x for n in t.notes if n not in warn for x in ("", n)]
    return "\n".join(lines) + "\n"


_HTML_CSS = (
    "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}"
    "h1{font-size:20px}h2{font-size:16px;margin-top:24px}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 6px}"
    ".warn{color:#b8860b}.note{color:#555;font-size:13px}"
    "td.worse{color:#d62728;font-weight:bold}td.better{color:#2ca02c;font-weight:bold}"
)


def _html_table(t: Table) -> str:
    if not t.rows:
        return f'<p class="note">{escape(t.empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in t.headers)
    body = []
    for row in t.rows:
        cells = []
        for v in row:
            text = _fmt(v).strip("`") if isinstance(v, str) else _fmt(v)
            cls = f' class="{v}"' if v in ("worse", "better") else ""
            cells.append(f"<td{cls}>{escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def render_html(c: Comparison) -> str:
    """The comparison as one self-contained HTML page (inline CSS, no script)."""
    title = f"soakd compare: {c.run_a.id} (A) vs {c.run_b.id} (B)"
    parts = [f"<h1>{escape(title)}</h1>"]
    for t in _tables(c):
        parts.append(f'<h2 id="{t.title.split()[0].lower()}">{escape(t.title)}</h2>')
        warn = [n for n in t.notes if n.startswith("Warning: ")]
        parts += [f'<p class="warn">{escape(n)}</p>' for n in warn]
        parts.append(_html_table(t))
        parts += [f'<p class="note">{escape(n)}</p>' for n in t.notes if n not in warn]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_HTML_CSS}</style></head><body>"
        + "".join(parts)
        + "</body></html>\n"
    )
