"""Issue 35's mutants of memory: the memory floors (their window, the warm-up kept out, the
span from the warm-up's end, the units, the shape of growth), memory headroom and
stage_trend; each one bug a user would feel, killed by tests/test_pins_memory.py (runs
written through the store and judged, both paths). `--only "(#35 memory)"` runs these."""

from __future__ import annotations

from bench.mutants.base import Mutant

PINS = "tests/test_pins_memory.py"

CR = "soakd/analysis/criteria/"
MEM = CR + "memory.py"
HEAD = CR + "headroom.py"
STAGE = CR + "stage_trend.py"
BASE = CR + "base.py"
MODEL = "soakd/analysis/model.py"
STATS = "soakd/analysis/stats.py"
DIGEST = "soakd/analysis/digest.py"
ROWS = "soakd/store/rundata.py"

RULES = "tests/test_verdict_rules.py"
SHAPE = "tests/test_memory_shape.py"

MUTANTS: tuple[Mutant, ...] = (
    # a slope over the tolerance the test could not confirm is undecided, never PASS (#31)
    Mutant("an unconfirmed slope over the tolerance passes (#31 undecided)", BASE,
           'TrendCall(INVALID, "undecided") if tr.slope > tol else TrendCall(PASS, "trend")',
           'TrendCall(PASS, "trend")', (RULES,)),
    Mutant("an unconfirmed slope at the tolerance is undecided (#31 undecided)", BASE,
           'TrendCall(INVALID, "undecided") if tr.slope > tol else TrendCall(PASS, "trend")',
           'TrendCall(INVALID, "undecided") if tr.slope >= tol else TrendCall(PASS, "trend")',
           (RULES,)),
    Mutant("an undecided memory floor passes (#31 undecided)", MEM,
           '    if call.how == "undecided":  # growth over the tolerance the test could not',
           '    if False:  # growth over the tolerance the test could not', (RULES, PINS)),
    Mutant("an unconfirmed late rise of the floors passes (#31 undecided)", MEM,
           "if half is not None and half[1].slope * per > thr:",
           "if half is not None and half[1].slope * per > thr * 1e9:", (RULES,)),
    Mutant("an undecided frame age passes (#31 undecided)", CR + "frame_age.py",
           'if call.how == "undecided" else (PASS, detail)',
           'if call.how == "undecided!" else (PASS, detail)', (RULES,)),
    Mutant("a shortened floor window's undecided slope is not too short (#31 undecided)", MEM,
           '    decided = status in (PASS, FAIL) or call.how == "undecided"',
           "    decided = status in (PASS, FAIL)", (SHAPE,)),
    Mutant("an undecided trend hides a FAIL (#31 undecided)", "soakd/analysis/verdict.py",
           '    if failed and all(r.evidence.get("decided_by") == "undecided" for r in invalid):',
           "    if failed and not invalid:", (RULES,)),
    Mutant("an untested trend no longer beats a FAIL (#31 undecided)", "soakd/analysis/verdict.py",
           '    if failed and all(r.evidence.get("decided_by") == "undecided" for r in invalid):',
           "    if failed:", (RULES,)),
    Mutant("headroom judges an undecided slope (#31 undecided)", HEAD,
           'how in ("untested", "undecided", "settling")', 'how in ("untested", "settling")',
           (RULES,)),
    # the measured window: the warm-up kept out, the span from the warm-up's end
    Mutant("the memory criteria read the warm-up's samples (#35 memory)", MEM,
           "    post = st >= ctx.t0\n    thr = c.max_memory_growth_mb_per_min\n",
           "    post = st >= 0.0\n    thr = c.max_memory_growth_mb_per_min\n", (PINS,)),
    Mutant("the floor windows laid from the first sample, not the warm-up's end (#35 memory)",
           MEM, "win = stats.window_reduce(t, y, w, t0=ctx.t0, t1=ctx.t1, medians=False)",
           "win = stats.window_reduce(t, y, w, t1=ctx.t1, medians=False)", (PINS,)),
    Mutant("the warm-up's samples in the first floor window on the bounded path (#35 memory)",
           ROWS, "params = [t0, *wparams, run_id, t1]", "params = [0.0, *wparams, run_id, t1]",
           (PINS,)),
    Mutant("the run's span measured from time zero (#35 memory)", BASE,
           "        return max(self.t1 - self.t0, 0.0)", "        return max(self.t1, 0.0)",
           (PINS,)),
    Mutant("the bounded path's floor windows over the span from time zero (#35 memory)",
           DIGEST, "w, _note = floor_window_s(max(t1 - t0, 0.0), crit.floor_window_s)",
           "w, _note = floor_window_s(max(t1, 0.0), crit.floor_window_s)", (PINS,)),
    Mutant("the window ends at the last frame, not the last sample (#35 memory)", MODEL,
           "return max(end, float(st.max())) if st.size else end", "return end", (PINS,)),
    Mutant("the window ends at the last frame on the bounded path (#35 memory)", DIGEST,
           "return float(t0), max(end, float(last_sample)) if last_sample is not None else end",
           "return float(t0), end", (PINS,)),
    Mutant("the warmup_end event ignored (#35 memory)", MODEL,
           'if e.get("kind") == "warmup_end" and e.get("t") is not None:',
           'if e.get("kind") == "warmup" and e.get("t") is not None:', (PINS,)),
    Mutant("the warmup_end event ignored on the bounded path (#35 memory)", DIGEST,
           'if e.get("kind") == "warmup_end" and e.get("t") is not None]',
           'if e.get("kind") == "warmup" and e.get("t") is not None]', (PINS,)),
    Mutant("a settled floor's tail measured from time zero (#35 memory)", MEM,
           "    tail_s = float(ctx.t1 - s.t)", "    tail_s = float(ctx.t1)", (PINS,)),
    Mutant("the run length that would decide a trend scaled from time zero (#35 memory)", BASE,
           "    return ctx.span * (mds / tol) ** (2 / 3)",
           "    return ctx.t1 * (mds / tol) ** (2 / 3)", (PINS,)),
    Mutant("the too-short run's run.duration asked without the warm-up (#35 memory)", MEM,
           "(run.duration >= {math.ceil(ctx.t0 + need)} s)",
           "(run.duration >= {math.ceil(need)} s)", (PINS,)),
    # the floor windows
    Mutant("a floor window shortened by under 5 % is too short (#35 memory)", MEM,
           "if decided and w < c.floor_window_s * (1 - FLOOR_SLACK):",
           "if decided and w < c.floor_window_s:", (PINS,)),
    Mutant("floor windows never lengthened for a long run (#35 memory)", MODEL,
           "    w = max(configured, span / MAX_WINDOWS)", "    w = configured", (PINS,)),
    Mutant("a stub window under half a width kept as a window (#35 memory)", STATS,
           "    if span - nwin * width_s >= width_s / 2:", "    if span - nwin * width_s > 0:",
           (PINS,)),
    Mutant("the memory sawtooth's steps over half the range (#35 memory)", MEM,
           "    sharp = dy < -0.25 * rng\n    n = int(sharp.sum())",
           "    sharp = dy < -0.5 * rng\n    n = int(sharp.sum())", (PINS,)),
    Mutant("the memory sawtooth's steps over half the range on the bounded path (#35 memory)",
           DIGEST, "        sharp = dy < -0.25 * rng", "        sharp = dy < -0.5 * rng", (PINS,)),
    # units
    Mutant("MB read as 10^6 bytes (#35 memory)", MODEL, "MIB = float(1 << 20)", "MIB = 1e6",
           (PINS,)),
    Mutant("the shape of growth judged in MB per second (#35 memory)", MEM,
           "    c, per = ctx.crit, 60.0 / MIB", "    c, per = ctx.crit, 1.0 / MIB", (PINS,)),
    # the trend, its detectable slope and the warnings
    Mutant("the detectable slope over the span from time zero (#35 memory)", STATS,
           "    span = float(t[-1] - t[0])\n    mds =", "    span = float(t[-1])\n    mds =",
           (PINS,)),
    Mutant("the detectable slope at a one-sided z (#35 memory)", STATS,
           "    z = scipy_stats().norm.ppf(1 - alpha / 2) + Z_POWER_80",
           "    z = scipy_stats().norm.ppf(1 - alpha) + Z_POWER_80", (PINS,)),
    Mutant("'cannot see leaks under' warned the wrong way round (#35 memory)", BASE,
           "if math.isfinite(mds) and threshold < mds:",
           "if math.isfinite(mds) and threshold > mds:", (PINS,)),
    Mutant("a floor 'grows for certain' without significance (#35 memory)", MEM,
           "    if not (tr.p < ctx.crit.alpha and slope > 0):", "    if not slope > 0:", (PINS,)),
    # the shape of growth
    Mutant("bounded growth's rise over the ramp's median, not its first floor (#35 memory)",
           STATS, "rise = float(np.median(y[k:]) - y[0])",
           "rise = float(np.median(y[k:]) - np.median(y[:k]))", (PINS,)),
    Mutant("a still-settling floor passes (#35 memory)", MEM,
           "    if s.shown:\n        return PASS, (", "    if s.level:\n        return PASS, (",
           (PINS,)),
    Mutant("the settled tail's upper bound two-sided (#35 memory)", STATS,
           "    return tr.slope + float(norm.ppf(1 - alpha)) * se",
           "    return tr.slope + float(norm.ppf(1 - alpha / 2)) * se", (PINS,)),
    Mutant("a level tail shown without its upper bound under the tolerance (#35 memory)", STATS,
           "shown = level and tail.testable(alpha) and upper <= tol and tail.mds <= tol",
           "shown = level and tail.testable(alpha) and tail.mds <= tol", (PINS,)),
    # headroom
    Mutant("headroom against the larger of host memory and the cgroup's (#35 memory)", HEAD,
           "lim, src = min(limits)", "lim, src = max(limits)", (PINS,)),
    Mutant("headroom's peak over the warm-up too (#35 memory)", HEAD,
           '    post = d.samples["t"] >= ctx.t0\n    col =',
           '    post = d.samples["t"] >= 0.0\n    col =', (PINS,)),
    Mutant("headroom's hours left in minutes (#35 memory)", HEAD,
           "return max(headroom, 0.0) / per_s / 3600", "return max(headroom, 0.0) / per_s / 60",
           (PINS,)),
    Mutant("a non-significant floor slope uses up the headroom (#35 memory)", HEAD,
           "elif tr.p < ctx.crit.alpha and tr.slope > 0:", "elif tr.slope > 0:", (PINS,)),
    Mutant("a settled floor's headroom at the whole window's slope (#35 memory)", HEAD,
           'elif how == "settled":', 'elif how == "never":', (PINS,)),
    Mutant("criteria.horizon read in minutes (#35 memory)", HEAD,
           "    return crit.horizon / 3600", "    return crit.horizon / 60", (PINS,)),
    Mutant("min_headroom_hours ignored (#35 memory)", HEAD,
           "    if crit.min_headroom_hours is not None:", "    if False:", (PINS,)),
    Mutant("a worst-case bound alone FAILs headroom (#35 memory)", HEAD,
           'if not v["bound_only"] and v["hours"] < thr}', 'if v["hours"] < thr}', (PINS,)),
    # stage_trend
    Mutant("stage_trend's alpha split over the stages only (#35 memory)", STAGE,
           "alpha = c.alpha / (len(STATS) * len(series))", "alpha = c.alpha / len(series)",
           (PINS,)),
    Mutant("stage_trend's budget left from the median of every frame (#35 memory)", STAGE,
           "    last = total[-max(1, total.size // 10) :]", "    last = total", (PINS,)),
    Mutant("stage_trend's hours to the budget in minutes (#35 memory)", STAGE,
           "hours = max(left, 0.0) / slope / 60 if slope > 0 else math.inf",
           "hours = max(left, 0.0) / slope if slope > 0 else math.inf", (PINS,)),
    Mutant("a slowing stage FAILs however far its budget lies past the horizon (#35 memory)",
           STAGE, "if call.status == FAIL and hours * 3600 <= c.horizon:",
           "if call.status == FAIL:", (PINS,)),
    Mutant("stage slopes in ms per second (#35 memory)", STAGE, "slope = tr.slope * 60",
           "slope = tr.slope", (PINS,)),
    Mutant("stage windows never lengthened for a long run (#35 memory)", STAGE,
           "return max(WINDOW_FRAMES / fps, span / MAX_WINDOWS)", "return WINDOW_FRAMES / fps",
           (PINS,)),
    Mutant("a trend's range bound over the time from zero (#35 memory)", BASE,
           "span = float(t[ok].max() - t[ok].min())", "span = float(t[ok].max())", (PINS,)),
    Mutant("an untested stage's run.duration asked without the warm-up (#35 memory)", STAGE,
           "(run.duration >= {ctx.t0 + need:.0f} s)", "(run.duration >= {need:.0f} s)", (PINS,)),
)  # fmt: skip
