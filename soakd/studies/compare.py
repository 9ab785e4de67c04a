"""``soakd compare``: what changed between two runs, and whether each change is beyond the
runs' own noise.

A comparison has four parts:

* the configuration diff (flattened dotted keys; ``run.name``, ``run.db``, ``run.duration``,
  ``run.log_every`` and ``[service]`` are ignored), with a warning when more than one
  variable differs: a comparison that changes two things explains neither;
* side-by-side metrics, each with its change and a stated test (see ``TESTS``);
* the criterion outcomes of both verdicts;
* ``regression(metric, pct)``: the release-gate check behind ``--fail-on-regression``.

"Beyond noise" means the stated test rejects "no difference" at ``alpha`` (default 0.01)
*and* the change is at least ``min_effect_pct`` (default 5 %) of run A's value and at least
``MIN_EFFECT_MS`` (0.1 ms) for timings: per-frame
timings are autocorrelated and runs on a shared machine drift by a few percent, so a
statistically detectable 1 % shift is not treated as a change.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from soakd.analysis.stats import scipy_stats, window_reduce
from soakd.config import flatten
from soakd.errors import UsageError
from soakd.records import STAGE_COLUMNS
from soakd.store import profiling_queries as q
from soakd.store import runs
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
    "max": f"{NO_TEST}: a single value",
    "drop_fraction": f"{FISHER} on lost vs dispatched frame counts",
    "floor_slope": f"{THEIL}: the two runs' Theil–Sen slope CIs (level 1 - alpha) do not overlap",
}
MIN_EFFECT_MS = 0.1  # timing changes smaller than this are scheduler noise, whatever the p
_BOOT_RESAMPLES = 500
_BOOT_MAX_N = 5000
_MB = float(1 << 20)


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
) -> Comparison:
    """Compare two stored runs (ids as stored; see ``soakd.store.runs.resolve``)."""
    ra, rb = runs.get_run(conn, run_a), runs.get_run(conn, run_b)
    rng = np.random.default_rng(seed)
    fa, fb = _load_frames(conn, ra), _load_frames(conn, rb)
    metrics = _stage_metrics(fa, fb, alpha, min_effect_pct, rng)
    metrics.append(_drop_metric(conn, ra, rb, alpha))
    metrics.extend(_memory_metrics(conn, ra, rb, alpha))
    if "generator" in (ra.workload_kind, rb.workload_kind):
        metrics.extend(_stream_metrics(conn, ra, rb, alpha, min_effect_pct, rng))
    diff = config_diff(ra.config, rb.config)
    briefs = (_brief(ra, fa), _brief(rb, fb))
    return Comparison(
        run_a=briefs[0],
        run_b=briefs[1],
        config_diff=diff,
        warnings=_warnings(diff, ra, rb, briefs),
        metrics=metrics,
        criteria=_criteria(q.verdict_rows(conn, ra.id), q.verdict_rows(conn, rb.id)),
        alpha=alpha,
        min_effect_pct=min_effect_pct,
    )


_FRAME_COLS = (*STAGE_COLUMNS, "frame_age_ms")


def _load_frames(conn: sqlite3.Connection, run: RunRow) -> dict[str, np.ndarray]:
    vals = q.frame_values(conn, run.id, _FRAME_COLS, profile=run.mode == "profile")
    return {k: v[np.isfinite(v)] for k, v in vals.items()}


def _brief(run: RunRow, frames: Mapping[str, np.ndarray]) -> RunBrief:
    n = max((len(v) for v in frames.values()), default=0)
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


def _quantile(v: np.ndarray, pct: float) -> float | None:
    return float(np.percentile(v, pct)) if v.size else None


def _mannwhitney(a: np.ndarray, b: np.ndarray) -> float | None:
    if a.size < 2 or b.size < 2:
        return None
    if np.ptp(np.concatenate([a, b])) == 0:
        return 1.0
    return float(scipy_stats().mannwhitneyu(a, b, alternative="two-sided").pvalue)


def _bootstrap_p95(
    a: np.ndarray, b: np.ndarray, alpha: float, rng: np.random.Generator
) -> bool | None:
    """True when the bootstrap CI (level 1 - alpha) of p95(b) - p95(a) excludes 0."""
    if a.size < 10 or b.size < 10:
        return None
    if a.size > _BOOT_MAX_N:
        a = rng.choice(a, _BOOT_MAX_N, replace=False)
    if b.size > _BOOT_MAX_N:
        b = rng.choice(b, _BOOT_MAX_N, replace=False)
    qa = np.percentile(rng.choice(a, (_BOOT_RESAMPLES, a.size)), 95, axis=1)
    qb = np.percentile(rng.choice(b, (_BOOT_RESAMPLES, b.size)), 95, axis=1)
    lo, hi = np.percentile(qb - qa, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return bool(lo > 0 or hi < 0)


def _distribution_rows(
    name: str,
    a: np.ndarray,
    b: np.ndarray,
    alpha: float,
    min_effect: float,
    rng: np.random.Generator,
    quantiles: Sequence[str] = ("p50", "p95", "max"),
) -> list[MetricRow]:
    rows = []
    for qn in quantiles:
        if qn == "p50":
            p = _mannwhitney(a, b)
            sig = None if p is None else p < alpha
            rows.append(
                _row(
                    f"{name}.p50", "ms", _quantile(a, 50), _quantile(b, 50), MW, p, sig, min_effect
                )
            )
        elif qn == "p95":
            sig = _bootstrap_p95(a, b, alpha, rng)
            rows.append(
                _row(
                    f"{name}.p95",
                    "ms",
                    _quantile(a, 95),
                    _quantile(b, 95),
                    BOOT,
                    None,
                    sig,
                    min_effect,
                )
            )
        else:
            rows.append(
                _row(
                    f"{name}.max",
                    "ms",
                    _quantile(a, 100),
                    _quantile(b, 100),
                    NO_TEST,
                    None,
                    None,
                    None,
                )
            )
    return rows


def _stage_metrics(
    fa: Mapping[str, np.ndarray],
    fb: Mapping[str, np.ndarray],
    alpha: float,
    min_effect: float,
    rng: np.random.Generator,
) -> list[MetricRow]:
    rows: list[MetricRow] = []
    for col in STAGE_COLUMNS:
        if fa[col].size or fb[col].size:
            rows.extend(_distribution_rows(col, fa[col], fb[col], alpha, min_effect, rng))
    rows.extend(
        _distribution_rows(
            "frame_age_ms",
            fa["frame_age_ms"],
            fb["frame_age_ms"],
            alpha,
            min_effect,
            rng,
            ("p50", "p95"),
        )
    )
    return rows


def _drop_metric(conn: sqlite3.Connection, ra: RunRow, rb: RunRow, alpha: float) -> MetricRow:
    ca, cb = q.frame_counts(conn, ra.id), q.frame_counts(conn, rb.id)

    def lost_kept(c: Mapping[str, int]) -> tuple[int, int]:
        return c["post_drops"] + c["post_stale"], c["measured"]

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
    t: np.ndarray, v: np.ndarray, window_s: float, alpha: float
) -> tuple[float, float, float] | None:
    """Theil–Sen slope of the window floors in MB/min with its CI (level 1 - alpha), or None
    with fewer than three windows."""
    w = window_reduce(t, v, window_s, medians=False)
    ok = w.nonempty()
    wt, wf = w.t[ok], w.floor[ok]
    if wt.size < 3:
        return None
    slope, _icpt, lo, hi = scipy_stats().theilslopes(wf / _MB, wt / 60.0, alpha=1 - alpha)
    return float(slope), float(lo), float(hi)


def _memory_metrics(
    conn: sqlite3.Connection, ra: RunRow, rb: RunRow, alpha: float
) -> list[MetricRow]:
    rows = []
    fits = {}
    sampled: set[str] = set()
    for r in (ra, rb):
        crit = r.config.get("criteria", {})
        window = float(crit.get("floor_window_s", 10.0))
        t_min = 0.0 if r.mode == "profile" else float(r.config.get("run", {}).get("warmup_s", 0))
        for col in MEMORY_COLUMNS:
            t, v = q.sample_series(conn, r.id, col, t_min=t_min)
            if t.size:
                sampled.add(col)
            fits[(r.id, col)] = floor_slope(t, v, window, alpha)
    for col in MEMORY_COLUMNS:
        if col not in sampled:
            continue
        fa, fb = fits[(ra.id, col)], fits[(rb.id, col)]
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

    rows = _distribution_rows(
        "first_emit_ms", first_emit(ra), first_emit(rb), alpha, min_effect, rng, ("p50", "max")
    )
    rows += _distribution_rows("interval_ms", intervals(ra), intervals(rb), alpha, min_effect, rng)
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


def render_markdown(c: Comparison) -> str:
    """The comparison as GitHub-flavoured Markdown."""
    a, b = c.run_a, c.run_b
    lines = [f"## soakd compare: `{a.id}` (A) vs `{b.id}` (B)", ""]
    lines += ["| | A | B |", "|---|---|---|"]
    for label, fa, fb in (
        ("name", a.name, b.name),
        ("mode", a.mode, b.mode),
        ("status", a.status, b.status),
        ("verdict", a.verdict, b.verdict),
        ("workload", a.workload_kind, b.workload_kind),
        ("started", a.started_at, b.started_at),
        ("measured frames", a.measured_frames, b.measured_frames),
    ):
        lines.append(f"| {label} | {_md_cell(fa)} | {_md_cell(fb)} |")
    lines.append("")
    for w in c.warnings:
        lines.append(f"> **Warning:** {w}")
    if c.warnings:
        lines.append("")
    lines += ["### Configuration diff", ""]
    if c.config_diff:
        lines += ["| key | A | B |", "|---|---|---|"]
        lines += [f"| `{d.key}` | {_md_cell(d.a)} | {_md_cell(d.b)} |" for d in c.config_diff]
    else:
        lines.append("No configuration difference (run name, db and duration ignored).")
    lines += [
        "",
        "### Metrics",
        "",
        "| metric | unit | A | B | change | test | p | beyond noise |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in c.metrics:
        lines.append(
            f"| {m.name} | {m.unit} | {_md_cell(m.a)} | {_md_cell(m.b)} | "
            f"{_fmt_pct(m.change_pct)} | {m.test} | {_fmt_p(m.p)} | {_md_cell(m.beyond_noise)} |"
        )
    lines += [
        "",
        f"Beyond noise: the test rejects no-difference at alpha = {c.alpha:g} and the "
        f"change is at least {c.min_effect_pct:g}% of A and {MIN_EFFECT_MS:g} ms (timings), "
        "or the test alone "
        "(drop fraction, memory slopes). Higher is worse for every metric.",
    ]
    lines += ["", "### Criteria", ""]
    if c.criteria:
        lines += [
            "| criterion | A | B | A value | B value | unit | changed |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in c.criteria:
            lines.append(
                f"| {r.criterion} | {_md_cell(r.a_status)} | {_md_cell(r.b_status)} | "
                f"{_md_cell(r.a_value)} | {_md_cell(r.b_value)} | {_md_cell(r.unit)} | "
                f"{_md_cell(r.changed)} |"
            )
    else:
        lines.append("Neither run has a stored verdict.")
    return "\n".join(lines) + "\n"
