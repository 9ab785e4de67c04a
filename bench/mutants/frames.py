"""Issue 35's mutants of the per-frame criteria: frame age, jitter, drops (and the losses
they count), errors, OOM, run validity, thresholds, a generator's intervals and
content_fps, the per-GPU floors. Each one small edit a person might make; every name ends
"(#35 frames)": ``--only "(#35 frames)"`` runs just these. The host-contention branches
and the early looks (``early_fail``) are other areas'. Most are killed by
tests/test_pins_frames.py; a few by the one older test named (its node id: fast)."""

from __future__ import annotations

from bench.mutants.base import Mutant

FRAMES = ("tests/test_pins_frames.py",)
# older tests that already kill a mutant here, each named alone
CONTENT_P95 = ("tests/test_verdict_pins.py::test_content_fps_is_judged_on_the_interval_p95",)
WARM_LOSSES = (
    "tests/test_verdict_pins.py::"
    "test_losses_during_the_warmup_do_not_count_against_the_drop_fraction",
)
MIN_FRAMES = (
    "tests/test_verdict_pins.py::"
    "test_a_run_exactly_min_duration_long_with_exactly_min_frames_is_valid",
)
AGE_SLOPE = (
    "tests/test_verdict_rules.py::"
    "test_frame_age_rising_above_the_tolerance_fails_and_below_it_passes",
)
UNTESTED = (
    "tests/test_verdict_rules.py::"
    "test_a_trend_too_short_to_test_whose_range_exceeds_the_tolerance_is_invalid",
)
FLAT_OOMS = ("tests/test_verdict_rules.py::test_a_flat_torch_oom_counter_passes_oom",)

CR = "soakd/analysis/criteria/"
AGE = CR + "frame_age.py"
JIT = CR + "jitter.py"
DROPS = CR + "drops.py"
ERR = CR + "errors.py"
OOM = CR + "oom.py"
VAL = CR + "validity.py"
GPUS = CR + "gpu_devices.py"
BASE = CR + "base.py"
CH = "soakd/analysis/chunks.py"
LO = "soakd/analysis/losses.py"
TH = "soakd/analysis/thresholds.py"
DG = "soakd/analysis/digest.py"

_GEN = (
    # a generator's intervals and content_fps (soakd/analysis/chunks.py)
    Mutant("a generator's presentation intervals over chunks emitted before the warm-up ended "
           "(#35 frames)", CH,
           'keep = np.isfinite(e["interval_ms"]) & (e["t_emit"] >= t0)',
           'keep = np.isfinite(e["interval_ms"])', FRAMES),
    Mutant("the presentation waits taken over the warm-up's chunks too (#35 frames)", CH,
           "return _intervals(d, _kept(d, t0) & first, d.emissions",
           'return _intervals(d, np.isfinite(d.emissions["interval_ms"]) & first, d.emissions',
           FRAMES),
    Mutant("a request's first emit judged as an interval (#35 frames)", CH,
           '        keep &= e["idx"] > 0\n', "", FRAMES),
    Mutant("an emit told apart by its row only, not its emit number (#35 frames)", CH,
           '(e["frame_id"][1:] != e["frame_id"][:-1]) | (e["chunk"][1:] != e["chunk"][:-1])',
           '(e["frame_id"][1:] != e["frame_id"][:-1])', FRAMES),
    Mutant("presentation waits read as the per-frame average (#35 frames)", CH,
           'return _intervals(d, _kept(d, t0) & first, d.emissions["interval_ms"] * size)',
           'return _intervals(d, _kept(d, t0) & first, d.emissions["interval_ms"])', FRAMES),
    Mutant("content_fps judged on the interval p90 (#35 frames)", CH,
           "np.percentile(v, [50, 95, 99])", "np.percentile(v, [50, 90, 99])", CONTENT_P95),
    Mutant("content_fps judged on the interval p99 (#35 frames)", CH,
           "np.percentile(v, [50, 95, 99])", "np.percentile(v, [50, 99, 95])", CONTENT_P95),
    Mutant("a p95 exactly 1000 / content_fps fails (#35 frames)", CH,
           "status = FAIL if p95 > thr else PASS", "status = FAIL if p95 >= thr else PASS",
           FRAMES),
    Mutant("a generator that emitted once passes content_fps unjudged (#35 frames)", CH,
           'return CriterionResult.invalid("content_fps", title, threshold=thr',
           'return CriterionResult.na("content_fps", title, threshold=thr', FRAMES),
    Mutant("the emitted fps over the run from time zero (#35 frames)", CH,
           "span = max(t1 - t0, 0.0)", "span = max(t1, 0.0)", FRAMES),
    Mutant("a first output exactly max_first_output_ms fails (#35 frames)", CH,
           "status = FAIL if first > thr else PASS", "status = FAIL if first >= thr else PASS",
           FRAMES),
    Mutant("the interval criterion over the warm-up's chunks (#35 frames)", BASE,
           'keep = new_chunk & later & (e["t_emit"] >= t0) & np.isfinite(e["interval_ms"])',
           'keep = new_chunk & later & np.isfinite(e["interval_ms"])', FRAMES),
)  # fmt: skip

_AGE = (
    Mutant("frame age over stale-skipped frames too (#35 frames)", AGE,
           'y = d.frame("frame_age_ms")[ctx.measured]', 'y = d.frame("frame_age_ms")[ctx.post]',
           FRAMES),
    Mutant("a frame-age p95 exactly max_age_p95_ms fails (#35 frames)", AGE,
           "if c.max_age_p95_ms is not None and p95 > c.max_age_p95_ms:",
           "if c.max_age_p95_ms is not None and p95 >= c.max_age_p95_ms:", FRAMES),
    Mutant("the frame-age tolerance read per second (#35 frames)", AGE,
           "call = call_trend(tr, win.t[has], win.median[has], c.alpha, thr / 60)",
           "call = call_trend(tr, win.t[has], win.median[has], c.alpha, thr)", AGE_SLOPE),
    Mutant("the frame-age slope reported per second (#35 frames)", AGE,
           '        value=tr.slope * 60,\n        threshold=thr,\n        unit="ms/min",',
           '        value=tr.slope,\n        threshold=thr,\n        unit="ms/min",', AGE_SLOPE),
    Mutant("a backlog's tolerance in frames per minute, not per second (#35 frames)", AGE,
           "ctx.crit.max_age_slope_ms_per_min / 60 / ms_per_frame)",
           "ctx.crit.max_age_slope_ms_per_min / ms_per_frame)", FRAMES),
    Mutant("an untested frame-age trend passes (#35 frames)", AGE,
           "        return INVALID, untested(ctx, tr, what, need)",
           "        return PASS, untested(ctx, tr, what, need)", UNTESTED),
)  # fmt: skip

_JIT = (
    Mutant("jitter judges the stage times of frames that raised (#35 frames)", JIT,
           'ok = ctx.measured & (d.frame("has_error") == 0)', "ok = ctx.measured", FRAMES),
    Mutant("infer jitter judged on the whole frame's time (#35 frames)", JIT,
           'else ("infer_ms", "output_latency_ms")', 'else ("total_ms", "output_latency_ms")',
           FRAMES),
    Mutant("jitter_min_ms ignored by the k-th largest frame (#35 frames)", JIT,
           "failing = kth > max(k * med, floor) or", "failing = kth > k * med or", FRAMES),
    Mutant("jitter_min_ms ignored when counting spikes (#35 frames)", JIT,
           'over = y > max(k * levels["median_ms"], floor)', 'over = y > k * levels["median_ms"]',
           FRAMES),
    Mutant("the count rule's value is the max ratio (#35 frames)", JIT,
           'value = ratio if c.jitter_rule == "max" else robust', "value = ratio", FRAMES),
    Mutant("a rollout's presentation jitter over the warm-up's chunks (#35 frames)", JIT,
           'iv = judged_intervals(ctx.data, ctx.t0, "presentation")',
           'iv = judged_intervals(ctx.data, 0.0, "presentation")', FRAMES),
    Mutant("k from history needs one run more than jitter_history_min_runs (#35 frames)", JIT,
           "if len(hist) < crit.jitter_history_min_runs:",
           "if len(hist) <= crit.jitter_history_min_runs:", FRAMES),
)  # fmt: skip

_LOSSES = (
    Mutant("the drop capacity computed without the frames dropped before the queue "
           "(#35 frames)", LO,
           "captured = rows + dropped + (queued or 0.0) + (in_flight or 0.0)",
           "captured = rows + (queued or 0.0) + (in_flight or 0.0)", FRAMES),
    Mutant("the ticks without the missed ones (#35 frames)", LO,
           "ticks = captured + (unaccounted or 0.0) + (missed or 0.0)",
           "ticks = captured + (unaccounted or 0.0)", FRAMES),
    Mutant("the ticks without the frames queued at the end (#35 frames)", LO,
           "captured = rows + dropped + (queued or 0.0) + (in_flight or 0.0)",
           "captured = rows + dropped + (in_flight or 0.0)", FRAMES),
    Mutant("drops after the last row not counted (#35 frames)", LO,
           '    dropped += max((m.counter("drops") or 0.0) - top_drop, 0.0)\n', "", FRAMES),
    Mutant("stale skips after the last row not counted (#35 frames)", LO,
           '    stale += max((m.counter("stale") or 0.0) - top_stale, 0.0)\n', "", FRAMES),
    Mutant("the warm-up's captures read as unaccounted (#35 frames)", LO,
           "unaccounted = max(total - first_post - captured, 0.0)",
           "unaccounted = max(total - captured, 0.0)", FRAMES),
    Mutant("one stream's counter not carried past another's rows (#35 frames)", LO,
           "total += np.nan_to_num(np.fmax.accumulate(own))", "total += np.nan_to_num(own)",
           FRAMES),
    Mutant("a window's capacity without its queue drops (#35 frames)", DROPS,
           "cap[i] = count[i] + max(drop_i, 0.0)", "cap[i] = count[i]", FRAMES),
    Mutant("a window's capacity without its queue drops on the bounded path (#35 frames)", DG,
           "self.drops.add(t[post], (d + s + x)[post], d[post])",
           "self.drops.add(t[post], (d + s + x)[post], 0 * d[post])", FRAMES),
    Mutant("a window's losses counted from the warm-up's end each time (#35 frames)", DROPS,
           "        prev_lost, prev_drop = lost_max[i], drop_max[i]\n", "", FRAMES),
    Mutant("the drop rate at the end over the last half of the windows (#35 frames)", DROPS,
           "return float(np.mean(vals[-max(1, len(vals) // 4) :]))",
           "return float(np.mean(vals[-max(1, len(vals) // 2) :]))", FRAMES),
    Mutant("rate(drops) over the ticks, missed ones too (#35 frames)", TH,
           'captured = loss.ticks - (loss.counts["missed_ticks"] or 0.0)',
           "captured = loss.ticks", FRAMES),
    Mutant("rate(drops) over the ticks on the bounded path (#35 frames)", TH,
           'loss = dg.loss\n    captured = loss.ticks - (loss.counts["missed_ticks"] or 0.0)',
           "loss = dg.loss\n    captured = loss.ticks", FRAMES),
)  # fmt: skip

_REST = (
    Mutant("warm-up errors judged on the bounded path (#35 frames)", ERR,
           "n_post = dg.counters.err_post if dg",
           "n_post = dg.counters.err_post + dg.counters.err_warm if dg", WARM_LOSSES),
    Mutant("torch's OOM counter read from zero, not from its first value (#35 frames)", OOM,
           "rise = float(ooms.max() - ooms.min()) if ooms.size else 0.0",
           "rise = float(ooms.max()) if ooms.size else 0.0", FLAT_OOMS),
    Mutant("stale-skipped frames counted toward min_frames (#35 frames)", VAL,
           "n_meas = dg.n_measured if dg else int(ctx.measured.sum())",
           "n_meas = dg.n_measured if dg else int(ctx.post.sum())", MIN_FRAMES),
    Mutant("infinite telemetry judged as if finite (#35 frames)", VAL,
           'n = int(np.isinf(a).sum()) if col != "t" and a.dtype.kind == "f" else 0',
           "n = 0", FRAMES),
    Mutant("a GPU's warm-up growth judged on its own floor (#35 frames)", GPUS,
           "for s in devices.memory_series(ctx.data, ctx.t0)",
           "for s in devices.memory_series(ctx.data, 0.0)", FRAMES),
)  # fmt: skip

MUTANTS: tuple[Mutant, ...] = (*_GEN, *_AGE, *_JIT, *_LOSSES, *_REST)
