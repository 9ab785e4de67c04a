"""The mutants of the verdict and the exit-code path (issues 20-31): each one bug a user
would feel, and the test files that must catch it. Run by bench/mutate.py."""

from __future__ import annotations

from bench.mutants.base import Mutant

RULES = "tests/test_verdict_rules.py"
VERDICT = "tests/test_verdict.py"
STATS = "tests/test_stats.py"
EXITS = "tests/test_exit_codes.py"
OUTCOMES = "tests/test_run_outcomes.py"
DIAG = "tests/test_diagnosis.py"
PINS = "tests/test_verdict_pins.py"
ALPHA = "tests/test_trend_alpha.py"
AUDIO = "tests/test_audio_playback.py"


V = "soakd/analysis/verdict.py"
CR = "soakd/analysis/criteria/"
C_BASE = CR + "base.py"
C_DROPS = CR + "drops.py"
C_ERRORS = CR + "errors.py"
C_FRAME_AGE = CR + "frame_age.py"
C_HEADROOM = CR + "headroom.py"
C_JITTER = CR + "jitter.py"
C_MEMORY = CR + "memory.py"
C_OOM = CR + "oom.py"
C_VALIDITY = CR + "validity.py"
S = "soakd/analysis/stats.py"
M = "soakd/analysis/model.py"
CTX = "soakd/run/drivers/context.py"
SINK = "soakd/run/sink.py"
SINK_TESTS = "tests/test_sink.py"
TH = "soakd/analysis/thresholds.py"
DG = "soakd/analysis/digest.py"
ST = "soakd/analysis/streams.py"
LO = "soakd/analysis/losses.py"
# issue 23: each verdict rule pinned at its boundary (tests/test_verdict_pins.py, on runs
# written through the store, both paths) and the trend test's size (tests/test_trend_alpha.py);
# every name ends "(#23)": `--only "(#23)"` runs just these
PINNED = (
    # thresholds
    Mutant("a value at a strict < limit passes (#23)", "soakd/config.py",
           '"<": lambda a, b: a < b,', '"<": lambda a, b: a <= b,', (PINS,)),
    Mutant("a value at a strict > limit passes (#23)", "soakd/config.py",
           '">": lambda a, b: a > b,', '">": lambda a, b: a >= b,', (PINS,)),
    Mutant("pNN read as the median (#23)", TH, "return float(np.percentile(v, th.q))",
           "return float(np.median(v))", (PINS,)),
    Mutant("pNN read as the median on the bounded path (#23)", TH,
           "value = q.percentile(th.q) if th.q is not None else by.get(th.stat)",
           "value = q.median() if th.q is not None else by.get(th.stat)", (PINS,)),
    Mutant("pNN a nearest rank, not interpolated, on the bounded path (#23)",
           "soakd/analysis/quantiles.py", "return a + (h - lo) * (b - a)", "return b", (PINS,)),
    Mutant("frame thresholds over stale-skipped frames too (#23)", TH,
           "values = data.frame(th.column)[data.measured(t0)]",
           "values = data.frame(th.column)[data.post_warmup(t0)]", (PINS,)),
    Mutant("frame thresholds over warm-up frames too (#23)", TH,
           "values = data.frame(th.column)[data.measured(t0)]",
           "values = data.frame(th.column)[data.frames['skipped'] == 0]", (PINS,)),
    Mutant("stale-skipped frames measured on the bounded path (#23)", DG,
           "measured, err = post & ((f & 2) == 0), (f & 4) != 0",
           "measured, err = post, (f & 4) != 0", (PINS,)),
    Mutant("warm-up errors in rate(errors) (#23)", TH,
           '"errors": float(((data.frame("has_error") > 0) & post).sum()),',
           '"errors": float((data.frame("has_error") > 0).sum()),', (PINS,)),
    # streams
    Mutant("the best stream decides (#23)", ST,
           'worst = max((r["status"] for r in results), key=lambda st: _RANK.get(st, 2))',
           'worst = min((r["status"] for r in results), key=lambda st: _RANK.get(st, 2))',
           (PINS,)),
    Mutant("FAIL outranks INVALID among streams (#23)", ST,
           "_RANK = {OVERALL_PASS: 0, OVERALL_FAIL: 1, OVERALL_INVALID: 2}",
           "_RANK = {OVERALL_PASS: 0, OVERALL_FAIL: 2, OVERALL_INVALID: 1}", (PINS,)),
    Mutant("the streams criterion never lowers the verdict (#23)", ST,
           "    if _RANK[status] <= _RANK.get(verdict.status, 2):\n        return\n",
           "    return\n", (PINS,)),
    # warm-up
    Mutant("warm-up drops counted against the drop fraction (#23)", LO,
           "base = float(a[pre].max()) if pre.any() else 0.0", "base = 0.0", (PINS,)),
    Mutant("warm-up drops counted on the bounded path (#23)", DG,
           "base = [m if math.isfinite(m) else 0.0 for m in c.pre_max]",
           "base = [0.0, 0.0, 0.0]", (PINS,)),
    Mutant("frames flagged warm-up after warmup_end measured (#23)", M,
           'return (self.frames["warmup"] == 0) & (t >= t0)', "return t >= t0", (PINS,)),
    Mutant("flagged warm-up frames measured on the bounded path (#23)", DG,
           "post = ((f & 1) == 0) & (t >= t0)", "post = t >= t0", (PINS,)),
    # frame age, jitter, errors, validity
    Mutant("max_age_p95_ms judged on the median (#23)", C_FRAME_AGE,
           "levels = (float(np.median(y)), float(np.percentile(y, 95)), float(y.max()))",
           "levels = (float(np.median(y)), float(np.median(y)), float(y.max()))", (PINS,)),
    Mutant("max_age_p95_ms judged on the median on the bounded path (#23)", C_FRAME_AGE,
           "levels = (q.median(), q.percentile(95.0), q.max)",
           "levels = (q.median(), q.median(), q.max)", (PINS,)),
    Mutant("any 4 spikes count as recurrent (#23)", C_JITTER,
           '(ex["exceed_count"] >= 4 and ex["exceed_periodic"])', '(ex["exceed_count"] >= 4)',
           (PINS,)),
    Mutant("recurrent spikes need 5 (#23)", C_JITTER,
           '(ex["exceed_count"] >= 4 and ex["exceed_periodic"])',
           '(ex["exceed_count"] >= 5 and ex["exceed_periodic"])', (PINS,)),
    Mutant("a frame at exactly k x median is a spike (#23)", C_JITTER,
           "failing = kth > max(k * med, floor) or", "failing = kth >= max(k * med, floor) or",
           (PINS,)),
    Mutant("the jitter rule's k-th largest off by one (#23)", C_JITTER,
           "kth = float(np.sort(y)[::-1][min(jitter_allowed(ctx.crit, y.size), y.size - 1)])",
           "kth = float(np.sort(y)[::-1][min(jitter_allowed(ctx.crit, y.size) + 1, y.size - 1)])",
           (PINS,)),
    Mutant("the jitter rule's k-th largest off by one on the bounded path (#23)", DG,
           "rank = q.n - 1 - min(jitter_allowed(crit, q.n), q.n - 1)",
           "rank = q.n - 2 - min(jitter_allowed(crit, q.n), q.n - 1)", (PINS,)),
    Mutant("errors at max_errors fail (#23)", C_ERRORS,
           "status = FAIL if n_post > c.max_errors else PASS",
           "status = FAIL if n_post >= c.max_errors else PASS", (PINS,)),
    Mutant("a run exactly min_duration_s long is invalid (#23)", C_VALIDITY,
           "if dur < c.min_duration_s:", "if dur <= c.min_duration_s:", (PINS,)),
    Mutant("exactly min_frames measured frames is invalid (#23)", C_VALIDITY,
           "if n_meas < c.min_frames:", "if n_meas <= c.min_frames:", (PINS,)),
    # generators
    Mutant("content_fps judged on the interval median (#23)", "soakd/analysis/chunks.py",
           "status = FAIL if p95 > thr else PASS",
           'status = FAIL if float(lv["p50"]) > thr else PASS', (PINS,)),
    # the trend test's size
    Mutant("no Bonferroni over the trend's two tests (#23)", S,
           "p = min(1.0, 2 * min(p_mk, sign_test_p(y)))", "p = min(1.0, min(p_mk, sign_test_p(y)))",
           (ALPHA,)),
    Mutant("no autocorrelation correction of the trend test (#23)", S, "    var_s *= infl\n",
           "", (ALPHA,)),
    Mutant("min_trend_points without the Bonferroni factor (#23)", S,
           "if min(1.0, 2 * min(p_mk, p_sign)) < alpha:", "if min(1.0, min(p_mk, p_sign)) < alpha:",
           (ALPHA,)),
    Mutant("a one-sided Mann-Kendall p-value (#23)", S,
           "p_mk = float(2 * scipy_stats().norm.sf(abs(z)))",
           "p_mk = float(scipy_stats().norm.sf(abs(z)))", (ALPHA,)),
)  # fmt: skip
# issue 22: stopping a run early (tests/test_early_stop.py); `--only "(#22)"` runs these
EARLY_TESTS = "tests/test_early_stop.py"
EARLY = (
    Mutant("errors never stop a run early (#22)", C_ERRORS,
           "if live.errors > crit.max_errors:", "if False:", (EARLY_TESTS,)),
    Mutant("drops never stop a run early (#22)", C_DROPS,
           "if most > 0 and live.lost > crit.max_drop_fraction * most:", "if False:",
           (EARLY_TESTS,)),
    Mutant("every early look tested at the full alpha (#22)", C_BASE,
           "return look_alpha(alpha, self.fraction, prev)", "return alpha",
           (EARLY_TESTS,)),
    Mutant("an OOM never stops a run early (#22)", C_OOM,
           'return EarlyFail("oom", f"{live.ooms} out-of-memory error(s)") if live.ooms else None',
           "return None", (EARLY_TESTS,)),
    Mutant("an early stop confirmed without its criterion failing (#22)", V,
           "if r.criterion == named[0] and r.status == FAIL), None)",
           "if r.criterion == named[0]), None)", (EARLY_TESTS,)),
    Mutant("OOM events not counted while the run goes (#22)", "soakd/run/early_stop.py",
           'elif event.kind == "oom":', 'elif event.kind == "never":', (EARLY_TESTS,)),
    Mutant("a creeping frame age never stops a run early (#22)", C_FRAME_AGE,
           'if call_trend(tr, t, y, alpha, tol / 60).how != "rising":', "if True:",
           (EARLY_TESTS,)),
    Mutant("frame age stops a run under its tolerance (#22)", C_FRAME_AGE,
           'if call_trend(tr, t, y, alpha, tol / 60).how != "rising":',
           'if call_trend(tr, t, y, alpha, 0.0).how != "rising":', (EARLY_TESTS,)),
    # issue 31: early decisions that cannot die and can always come
    Mutant("the looks spend alpha by O'Brien–Fleming again (#31)", C_BASE,
           "    return alpha * math.log1p((math.e - 1.0) * t)",
           "    return stats.obrien_fleming_spent(alpha, t)", ("tests/test_early_schedule.py",)),
    Mutant("an observer's failure is not recorded (#31)", "soakd/observers/base.py",
           "        if self._failed is not None:", "        if False:",
           ("tests/test_observer_failure.py",)),
    Mutant("a server's memory never stops a run early (#31)", C_MEMORY,
           "for name, col, title in (*MEMORY_METRICS, *server.SERVER_MEMORY_METRICS):",
           "for name, col, title in MEMORY_METRICS:", ("tests/test_early_criteria.py",)),
    Mutant("jitter stops a run within the allowance (#31)", C_JITTER,
           "    if over <= allowed:", "    if over < 0:", ("tests/test_early_criteria.py",)),
    Mutant("a look tests every window, however long the run (#31)", C_BASE,
           "    return max(window, span / LOOK_MAX_WINDOWS)", "    return window",
           ("tests/test_early_criteria.py",)),
    Mutant("rows waiting for a lock never spill to disk (#31)", "soakd/store/db.py",
           "                self._spill_if_waiting()\n", "", ("tests/test_store_spill.py",)),
)  # fmt: skip

MUTANTS = (
    # the exit-code path
    Mutant("run exits 0 whatever the verdict", "soakd/cli/run.py",
           "return int(result.exit_code if result.exit_code is not None else ExitCode.INTERNAL)",
           "return 0", (EXITS,)),
    Mutant("gate exits 0 whatever the verdict", "soakd/cli/report.py",
           "raise typer.Exit(int(verdict.exit_code))", "raise typer.Exit(0)", (EXITS,)),
    Mutant("soakd's own failure hidden by the verdict", "soakd/run/outcome.py",
           "    if outcome.internal:\n        return ExitCode.INTERNAL\n", "", (OUTCOMES,)),
    Mutant("an unjudged aborted run exits 0", "soakd/run/outcome.py",
           'ExitCode.PASS if outcome.status == "completed" else ExitCode.INVALID',
           "ExitCode.PASS", (OUTCOMES,)),
    Mutant("FAIL beats INVALID", V, "    if invalid:\n        reason = ",
           "    if invalid and not failed:\n        reason = ", (RULES,)),
    Mutant("a failed criterion passes the run", V,
           '    if failed and all(r.evidence.get("decided_by") == "undecided" for r in invalid):',
           "    if False:", (RULES,)),
    # run validity
    Mutant("an aborted run is valid", C_VALIDITY, 'if d.meta.status != "completed":', "if False:",
           (RULES,)),
    Mutant("min_duration_s ignored", C_VALIDITY, "if dur < c.min_duration_s:", "if False:",
           (RULES,)),
    Mutant("min_frames ignored", C_VALIDITY, "if n_meas < c.min_frames:", "if False:", (RULES,)),
    Mutant("a hang at the end ignored", C_VALIDITY, "    hang = _hang(d)\n", "    hang = None\n",
           (RULES,)),
    Mutant("fps = 0 accepted", "soakd/config.py", "fps: float = Field(2.0, gt=0, le=1000)",
           "fps: float = Field(2.0, ge=0, le=1000)", (EXITS,)),
    # drops
    Mutant(">= at the drop-fraction boundary", C_DROPS,
           "status = FAIL if frac > c.max_drop_fraction or over_end else PASS",
           "status = FAIL if frac >= c.max_drop_fraction or over_end else PASS", (RULES,)),
    Mutant("drops never fail on the fraction", C_DROPS,
           "status = FAIL if frac > c.max_drop_fraction or over_end else PASS",
           "status = FAIL if over_end else PASS", (RULES, VERDICT)),
    Mutant("losses counted without the pacer's ticks", "soakd/analysis/losses.py",
           "return self.lost / self.ticks if self.ticks else 0.0",
           "return 0.0", (RULES, VERDICT)),
    # memory
    Mutant("memory trend on window maxima", S,
           "floor[has] = np.minimum.reduceat(y, starts[has])",
           "floor[has] = np.maximum.reduceat(y, starts[has])", (RULES,)),
    Mutant("a trend fails on its slope without the significance test", S,
           "return self.slope > tolerance and self.slope > 0 and self.p < alpha",
           "return self.slope > tolerance and self.slope > 0", (RULES, STATS)),
    Mutant("an untested trend passes", C_BASE,
           'return TrendCall(INVALID, "untested", bound)',
           'return TrendCall(PASS, "untested", bound)', (RULES, VERDICT)),
    Mutant("a range bound over the tolerance passes", C_BASE,
           "if bound is not None and bound <= tol:", "if bound is not None:",
           (RULES, VERDICT)),
    Mutant("Theil-Sen replaced by the mean of pairwise slopes", S,
           "    res = scipy_stats().theilslopes(y, t)\n"
           "    slope, intercept = float(res.slope), float(res.intercept)\n",
           "    _i, _j = np.triu_indices(len(t), 1)\n"
           "    _ok = t[_j] != t[_i]\n"
           "    slope = float(np.mean((y[_j] - y[_i])[_ok] / (t[_j] - t[_i])[_ok]))\n"
           "    intercept = float(np.median(y - slope * t))\n", (RULES, STATS)),
    Mutant("Mann-Kendall score inverted", S, "s += int(np.sign(x[i + 1 :] - x[i]).sum())",
           "s -= int(np.sign(x[i + 1 :] - x[i]).sum())", (RULES, STATS)),
    # oom
    Mutant("torch's own OOM counter ignored", C_OOM, "n = max(n_events, int(rise))",
           "n = n_events", (RULES,)),
    Mutant("OOM events ignored", C_OOM, "n = max(n_events, int(rise))", "n = int(rise)",
           (RULES, VERDICT)),
    Mutant("oom never fails", C_OOM, "status = FAIL if n > 0 else PASS", "status = PASS",
           (RULES, VERDICT)),
    # jitter
    Mutant("jitter ratio on the mean", C_JITTER, '        "median_ms": float(np.median(y)),\n',
           '        "median_ms": float(np.mean(y)),\n', (RULES, VERDICT)),
    Mutant("jitter never fails", C_JITTER, "status = FAIL if failing else PASS",
           "status = PASS", (RULES, VERDICT)),
    Mutant("recurrent spikes ignored", C_JITTER,
           ' or (ex["exceed_count"] >= 4 and ex["exceed_periodic"])', "", (VERDICT,)),
    Mutant("a configured jitter_k ignored", C_JITTER, 'return float(crit.jitter_k), "configured"',
           'return 5.0, "configured"', (VERDICT, RULES)),
    # errors, frame age
    Mutant("errors never fail", C_ERRORS, "status = FAIL if n_post > c.max_errors else PASS",
           "status = PASS", (RULES, VERDICT)),
    Mutant("max_errors off by one", C_ERRORS, "status = FAIL if n_post > c.max_errors else PASS",
           "status = FAIL if n_post > c.max_errors + 1 else PASS", (RULES, VERDICT)),
    Mutant("age p95 limit ignored", C_FRAME_AGE,
           "if c.max_age_p95_ms is not None and p95 > c.max_age_p95_ms:", "if False:",
           (VERDICT, RULES)),
    # the records the verdict reads
    Mutant("lateness from the dispatch", "soakd/run/drivers/context.py",
           "lateness_ms=(frame.t_capture_ns - frame.grab_ns - frame.t_sched_ns) / 1e6,",
           "lateness_ms=(t_taken - frame.t_sched_ns) / 1e6,", (EXITS,)),
    Mutant("frames left in the queue not counted", "soakd/run/runner.py",
           '"queued_at_end": len(queue) if queue is not None else 0,',
           '"queued_at_end": 0,', (OUTCOMES,)),
    Mutant("the stall timeout not scaled to the run", "soakd/run/runner.py",
           "return min(cap, max(STALL_FLOOR_S, STALL_FACTOR * frame_s))", "return cap",
           (OUTCOMES,)),
    # more of the verdict and the exit-code path (tests/test_verdict_rules.py, test_exit_codes.py)
    Mutant("memory slope per second, not per minute", C_MEMORY, "per = 60.0 / MIB",
           "per = 1.0 / MIB", (RULES,)),
    Mutant("headroom never fails", C_HEADROOM,
           'if not v["bound_only"] and v["hours"] < thr}',
           'if not v["bound_only"] and v["hours"] < thr / 100}', (RULES,)),
    Mutant("accelerating drops ignored", C_DROPS,
           "over_end = accelerating and end_rate is not None and end_rate > c.max_drop_fraction",
           "over_end = False", (RULES,)),
    Mutant("warm-up errors judged", C_ERRORS, "else int((err & ctx.post).sum())",
           "else int(err.sum())", (RULES,)),
    Mutant("a CUDA run without GPU samples is n/a", C_MEMORY, "if d.meta.is_cuda and not gpu_any:",
           "if False:", (RULES,)),
    Mutant("warm-up samples judged", M, "        return float(t[~warm].min())",
           "        return 0.0", (RULES,)),
    Mutant("floor window never shortened", M, "if span > 0 and span / w < MIN_WINDOWS:",
           "if False:",
           (RULES, "tests/test_pins_memory.py::test_the_span_from_the_warm_ups_end_decides_too"
            "_short")),
    Mutant("a FAIL verdict exits 0", "soakd/run/outcome.py",
           "return ExitCode(int(verdict.exit_code))",
           "return ExitCode.PASS if verdict.status == 'FAIL' else ExitCode(int(verdict.exit_code))",
           (EXITS,)),
    Mutant("run's exit code dropped", "soakd/cli/run.py",
           "raise typer.Exit(execute_run(settings, live=use_live))",
           "execute_run(settings, live=use_live)", (EXITS,)),
    Mutant("frame age from the deadline", CTX,
           'fields["frame_age_ms"] = (t_taken - frame.t_capture_ns) / 1e6',
           'fields["frame_age_ms"] = (t_taken - frame.t_sched_ns) / 1e6', (EXITS,)),
    Mutant("staged frame age from the deadline", SINK, "ms[6], ms[7], c[10]",
           "ms[7], ms[7], c[10]", (SINK_TESTS,)),
    Mutant("one stream's reader woken only by its timeout", "soakd/run/queue.py",
           "shared = None if one_consumer_each and n > 1 else self._cond",
           "shared = None if one_consumer_each else self._cond", ("tests/test_queue.py",)),
    # issue 34: audio_playback (tests/test_audio_playback.py)
    Mutant("audio turns during the warm-up judged (#34)", CR + "audio.py",
           'post = (t["warmup"] == 0) & (t["t_capture"] >= ctx.t0)', 'post = t["warmup"] >= 0',
           (AUDIO + "::test_turns_during_the_warm_up_are_not_judged",)),
    Mutant("audio real-time factor judged at its median (#34)", CR + "audio.py",
           "np.percentile(finite, 5)) if finite.size", "np.percentile(finite, 50)) if finite.size",
           (AUDIO + "::test_a_p5_real_time_factor_under_the_minimum_fails",)),
    Mutant("underruns never fail (#34)", CR + "audio.py",
           "return low, total, low < c.min_audio_rtf or total > c.max_audio_underruns",
           "return low, total, low < c.min_audio_rtf",
           (AUDIO + "::test_underruns_past_the_allowance_fail_and_at_it_pass",)),
    Mutant("underruns at the allowance fail (#34)", CR + "audio.py",
           "total > c.max_audio_underruns", "total >= c.max_audio_underruns",
           (AUDIO + "::test_underruns_past_the_allowance_fail_and_at_it_pass",)),
    Mutant("turns stuttering on a contended host blamed on the model (#34)", CR + "audio.py",
           "host = _host(ctx, sel) if failing else None", "host = None",
           (AUDIO + "::test_turns_that_stutter_only_while_the_host_is_contended_are_invalid"
            "_not_fail",)),
    Mutant("a turn stuttering on a quiet host excused (#34)", CR + "audio.py",
           "if not bad.any() or (bad & quiet).any() or quiet.sum() < MIN_TURNS:",
           "if not bad.any() or quiet.sum() < MIN_TURNS:",
           (AUDIO + "::test_turns_that_stutter_only_while_the_host_is_contended_are_invalid"
            "_not_fail",)),
    Mutant("an early-stopped run judged through its shutdown (#31)", V,
           "t1 = max(t0, min(t1, float(stops[0])))", "t1 = max(t0, t1)",
           (RULES + "::test_a_run_stopped_early_is_judged_up_to_its_stop_not_its_shutdown",)),
    Mutant("two audio turns judged (#34)", CR + "audio.py", "if n < MIN_TURNS:", "if n < 2:",
           (AUDIO + "::test_fewer_than_three_audio_turns_after_the_warm_up_are_invalid"
            "_never_pass",)),
    *PINNED,
    *EARLY,
)  # fmt: skip
