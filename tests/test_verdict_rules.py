"""The rules that decide PASS, FAIL or INVALID, one test each, on RunData built directly
(fast and deterministic). Each test fails when the rule its name states is broken; the
mutants in bench/mutate.py name the tests that must catch them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from soakd.analysis import RunData, RunMeta, judge, make_run_data, stats
from soakd.config import CriteriaSettings
from soakd.errors import ExitCode
from soakd.run.outcome import Outcome, exit_code

MIB = float(1 << 20)
CRIT = CriteriaSettings()
Series = Callable[[np.ndarray, np.random.Generator], np.ndarray]


def run_data(
    *,
    dur: float = 300.0,
    fps: float = 10.0,
    warm: float = 5.0,
    rss: Series | None = None,
    infer: Series | None = None,
    status: str = "completed",
    reason: str | None = None,
    seed: int = 0,
    samples: dict[str, Any] | None = None,
    **frames: Any,
) -> RunData:
    """A healthy run of ``dur`` s at ``fps`` (flat noisy RSS sampled at 10 Hz, 20 ms infer,
    small frame age, no drops), with ``rss`` / ``infer`` / frame columns planted."""
    rng = np.random.default_rng(seed)
    st = np.arange(0, dur, 0.1)
    t = np.arange(0, dur, 1 / fps)
    smp: dict[str, Any] = {
        "t": st,
        "rss_bytes": rss(st, rng) if rss else 400 * MIB + rng.normal(0, 0.2 * MIB, st.size),
        **(samples or {}),
    }
    cols: dict[str, Any] = {
        "t_capture": t,
        "warmup": (t < warm).astype(float),
        "infer_ms": infer(t, rng) if infer else 20 * np.exp(rng.normal(0, 0.05, t.size)),
        "frame_age_ms": 3 + rng.gamma(2, 1.5, t.size),
        "queue_len": np.zeros(t.size),
        **frames,
    }
    meta = RunMeta("r", status=status, reason=reason, duration_s=dur, fps=fps)
    return make_run_data(meta, frames=cols, samples=smp)


def status_of(data: RunData, criterion: str, crit: CriteriaSettings = CRIT) -> str:
    c = judge(data, crit).get(criterion)
    assert c is not None
    return c.status


def _saw_phase(t: np.ndarray, period: float = 5.0) -> np.ndarray:
    return (t % period) / period


# --------------------------------------------------------------------------- memory


def test_leak_under_a_capped_peak_fails_memory_because_floors_are_judged() -> None:
    """Floors rising 10 MB/min under a sawtooth whose peak stays at 700 MB: memory_rss fails
    (the window minima rise; the maxima do not)."""

    def rss(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        floor = 400 * MIB + 10 * MIB * t / 60
        return floor + (700 * MIB - floor) * _saw_phase(t) + rng.normal(0, 0.1 * MIB, t.size)

    assert status_of(run_data(rss=rss), "memory_rss") == "fail"


def test_growing_sawtooth_peaks_over_a_flat_floor_pass_memory() -> None:
    """A sawtooth whose peaks grow from 400 MB to 700 MB while it keeps returning to the same
    floor passes memory_rss: allocator caches are not a leak."""

    def rss(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        amp = 300 * MIB * t / t.max()
        return 400 * MIB + amp * _saw_phase(t) + rng.normal(0, 0.1 * MIB, t.size)

    assert status_of(run_data(rss=rss), "memory_rss") == "pass"


def test_one_transient_memory_spike_does_not_make_a_slow_creep_a_leak() -> None:
    """RSS creeping 1 MB/min (significant, under the 5 MB/min tolerance) with one 20 s
    transient of +1 GB near the end passes memory_rss at ~1 MB/min: the Theil–Sen slope is
    a median of the pairwise slopes, which the one window cannot move (their mean reads
    ~12 MB/min)."""

    def rss(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        spike = np.where((t > 560) & (t < 582), 1000 * MIB, 0.0)
        return 400 * MIB + MIB * t / 60 + spike + rng.normal(0, 0.2 * MIB, t.size)

    c = judge(run_data(dur=600.0, rss=rss), CRIT).get("memory_rss")
    assert c is not None
    assert c.status == "pass", c.detail
    assert c.value is not None and 0.8 < c.value < 1.2
    assert c.evidence["p_value"] < CRIT.alpha and c.evidence["peak_mb"] > 1300


def test_a_memory_trend_its_autocorrelation_leaves_untestable_is_invalid_never_pass() -> None:
    """RSS flat, then one 50 MB step at 85 % of a 10-minute run: the floors are so
    autocorrelated that under 3 effective windows remain, and their range allows more than
    the tolerance, so memory_rss is INVALID "untested", never PASS."""

    def rss(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        step = np.where(t > 0.85 * t.max(), 50 * MIB, 0.0)
        return 400 * MIB + step + rng.normal(0, 0.2 * MIB, t.size)

    c = judge(run_data(dur=600.0, rss=rss), CRIT).get("memory_rss")
    assert c is not None
    assert c.evidence["n_effective"] < 3 and c.evidence["decided_by"] == "untested"
    assert c.status == "invalid" and c.detail.startswith("untested"), c.detail


def test_a_steep_slope_the_trend_test_does_not_confirm_is_undecided_never_pass() -> None:
    """Floors noisy enough (40 MB per sample) that their Theil–Sen slope reads above the
    1.5 MB/min tolerance by chance, with p far above alpha: memory_rss is INVALID
    "undecided" (not FAIL: the test did not confirm it; not PASS: the run points to growth
    over the tolerance), with the run length that would decide it; the same floors under
    a tolerance above their slopes (the whole window's and its last half's) pass."""

    def rss(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return 400 * MIB + rng.normal(0, 40 * MIB, t.size)

    d = run_data(dur=90.0, rss=rss)
    c = judge(d, CRIT).get("memory_rss")
    assert c is not None and c.value is not None
    assert c.value > CRIT.max_memory_growth_mb_per_min and c.evidence["p_value"] > 0.05
    assert c.status == "invalid" and c.detail.startswith("undecided: "), c.detail
    assert "above 1.5 MB/min but not significant at alpha = 0.01" in c.detail, c.detail
    assert "min after the warm-up would decide it" in c.detail, c.detail
    # over the whole window's slope, its last half's still over: undecided; over both: PASS
    half = judge(d, _tol(c.value * 1.01)).get("memory_rss")
    assert half is not None and half.status == "invalid" and "since t =" in half.detail, half
    assert status_of(d, "memory_rss", _tol(half.evidence["late"]["slope"] * 1.01)) == "pass"


def _tol(mb_per_min: float) -> CriteriaSettings:
    return CRIT.model_copy(update={"max_memory_growth_mb_per_min": mb_per_min})


def test_an_insignificant_trend_is_not_rising_however_steep() -> None:
    """Trend.rising needs p < alpha as well as slope > tolerance."""
    steep_noise = stats.Trend(10.0, 0.0, 0.5, 0.6, 40, 40.0, 1.0, 1.0, 0.1)
    assert not steep_noise.rising(0.01, 1.0)
    assert steep_noise.__class__(10.0, 0.0, 4.0, 0.001, 40, 40.0, 1.0, 1.0, 0.1).rising(0.01, 1.0)


def test_theil_sen_ignores_one_outlier_at_the_end() -> None:
    """A flat series with one huge last value has a Theil–Sen slope of ~0 (a mean of the
    pairwise slopes would be pulled to ~1 per step)."""
    t = np.arange(100.0)
    y = np.tile([0.0, 0.01], 50)
    y[-1] = 1000.0
    tr = stats.trend(t, y)
    assert abs(tr.slope) < 0.01


# --------------------------------------------------------------------------- oom, jitter


def test_torch_oom_counter_rising_fails_oom_without_any_oom_event() -> None:
    """The model caught its own OOMs: no ``oom`` event, but torch's num_ooms rose by 2 in
    the samples; oom fails with value 2."""
    n = 3000  # 300 s at 10 Hz
    ooms = np.zeros(n)
    ooms[1000:] = 1
    ooms[2000:] = 2
    v = judge(run_data(samples={"torch_ooms": ooms}), CRIT)
    c = v.get("oom")
    assert c is not None and c.status == "fail" and c.value == 2.0
    assert v.status == "FAIL"


def test_a_flat_torch_oom_counter_passes_oom() -> None:
    """A torch num_ooms that never moves (already 3 when the run started) passes."""
    assert status_of(run_data(samples={"torch_ooms": np.full(3000, 3.0)}), "oom") == "pass"


def test_jitter_is_judged_against_the_median_which_frequent_spikes_cannot_lift() -> None:
    """Every 10th-ish frame (random, 10 %) at 8x: the mean rises to ~1.7x the median, so
    k x mean would hide them; against k x median they fail jitter."""

    def infer(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        y = 20 * np.exp(rng.normal(0, 0.02, t.size))
        y[rng.random(t.size) < 0.1] = 160.0
        return y

    c = judge(run_data(infer=infer), CRIT).get("jitter")
    assert c is not None and c.status == "fail"
    assert 19 < c.evidence["median_ms"] < 21 and c.evidence["exceed_count"] > 200


# --------------------------------------------------------------------------- drops


def test_zero_drops_pass_when_no_drop_is_allowed() -> None:
    """max_drop_fraction = 0: a run with zero drops passes (the rule is fraction > max)."""
    crit = CriteriaSettings(max_drop_fraction=0.0)
    assert status_of(run_data(), "drops", crit) == "pass"


def test_one_drop_fails_when_no_drop_is_allowed() -> None:
    """max_drop_fraction = 0: one dropped frame after the warm-up fails drops."""
    n = 3000
    drops = np.zeros(n)
    drops[1500:] = 1
    crit = CriteriaSettings(max_drop_fraction=0.0)
    assert status_of(run_data(drop_count=drops), "drops", crit) == "fail"


# --------------------------------------------------------------------------- precedence


def _leak(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return 400 * MIB + 20 * MIB * t / 60 + rng.normal(0, 0.2 * MIB, t.size)


def test_an_aborted_run_that_also_leaks_is_invalid_exit_3() -> None:
    """INVALID beats FAIL: an aborted run whose memory also fails is INVALID (exit 3), with
    the failing criterion still evaluated and shown."""
    v = judge(run_data(rss=_leak, status="aborted", reason="signal SIGTERM"), CRIT)
    assert v.status == "INVALID" and v.exit_code == ExitCode.INVALID
    assert {c.criterion: c.status for c in v.criteria}["memory_rss"] == "fail"
    assert exit_code(Outcome("aborted", "signal SIGTERM"), v) == ExitCode.INVALID


def test_a_completed_run_that_leaks_fails_exit_1() -> None:
    """A valid run with one failing criterion is FAIL, exit 1, naming the criterion."""
    v = judge(run_data(rss=_leak), CRIT)
    assert (v.status, v.exit_code) == ("FAIL", ExitCode.FAIL)
    assert "memory_rss" in v.reason
    assert exit_code(Outcome("completed"), v) == ExitCode.FAIL


def test_a_healthy_run_passes_exit_0() -> None:
    """The builder's healthy run passes every applicable criterion: exit 0."""
    v = judge(run_data(), CRIT)
    assert (v.status, v.exit_code) == ("PASS", ExitCode.PASS), v.reason
    assert exit_code(Outcome("completed"), v) == ExitCode.PASS


# --------------------------------------------------------------------------- validity


def test_a_run_shorter_than_min_duration_is_invalid() -> None:
    """A 20 s run with min_duration_s = 30 is INVALID, naming min_duration_s."""
    v = judge(run_data(dur=20.0), CriteriaSettings(min_duration_s=30))
    assert v.status == "INVALID" and "min_duration_s" in v.reason


def test_a_run_with_fewer_post_warmup_frames_than_min_frames_is_invalid() -> None:
    """2990 post-warm-up frames against min_frames = 5000: INVALID, naming min_frames."""
    v = judge(run_data(), CriteriaSettings(min_frames=5000))
    assert v.status == "INVALID" and "min_frames" in v.reason


def test_a_frame_in_flight_at_the_end_is_invalid() -> None:
    """The summary says a dispatched frame never finished (the workload hung): INVALID."""
    d = run_data()
    d.meta.summary = {"in_flight_at_end": 1, "in_flight_since_s": 250.0}
    v = judge(d, CRIT)
    assert v.status == "INVALID" and "never finished" in v.reason


def test_errors_after_warmup_fail_and_errors_during_warmup_only_warn() -> None:
    """Three frames raising inside the 5 s warm-up pass errors with a warning; one raising
    after it fails errors."""
    err = np.zeros(3000)
    err[[10, 20, 30]] = 1
    c = judge(run_data(has_error=err), CRIT).get("errors")
    assert c is not None and c.status == "pass" and c.warnings
    err[2000] = 1
    c = judge(run_data(has_error=err), CRIT).get("errors")
    assert c is not None and c.status == "fail" and c.value == 1.0


def test_an_invalid_verdict_whose_every_frame_raised_names_the_errors_in_its_reason() -> None:
    """Every post-warm-up frame raising leaves jitter nothing to judge (INVALID), and the
    overall reason names the failing errors criterion too, not only "no infer timings"."""
    n = 3000
    err = np.zeros(n)
    err[100:] = 1
    v = judge(run_data(has_error=err, infer_ms=np.full(n, np.nan)), CRIT)
    assert v.status == "INVALID"
    assert {c.criterion: c.status for c in v.criteria}["errors"] == "fail"
    assert "errors:" in v.reason and "failing too" in v.reason


def test_memory_growth_during_the_warmup_is_not_judged() -> None:
    """RSS rising 100 MB/min in a 60 s warm-up, flat after it: memory_rss passes."""

    def rss(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        ramp = 100 * MIB * np.minimum(t, 60.0) / 60
        return 400 * MIB + ramp + rng.normal(0, 0.2 * MIB, t.size)

    assert status_of(run_data(rss=rss, warm=60.0), "memory_rss") == "pass"


def test_a_cuda_workload_without_gpu_memory_samples_is_invalid() -> None:
    """workload.device = cuda:0 and no GPU memory samples at all: memory_gpu is INVALID."""
    d = run_data()
    d.meta.device = "cuda:0"
    assert status_of(d, "memory_gpu") == "invalid"


def test_a_healthy_minute_long_run_is_judged_on_whole_floor_windows_and_passes() -> None:
    """60 s with the default 4 s floor window: 13 whole windows after the 5 s warm-up, none
    shortened, and memory is tested and passes."""
    c = judge(run_data(dur=60.0), CRIT).get("memory_rss")
    assert c is not None
    assert c.status == "pass", c.detail
    assert c.evidence["floor_window_s"] == CRIT.floor_window_s
    assert c.evidence["n_windows"] >= 12 and not any("shortened" in w for w in c.warnings)


# --------------------------------------------------------------------------- trends


def _age(slope_ms_min: float) -> np.ndarray:
    t = np.arange(0, 300, 0.1)
    rng = np.random.default_rng(1)
    return 20 + slope_ms_min * t / 60 + rng.normal(0, 1.0, t.size)


def test_frame_age_rising_above_the_tolerance_fails_and_below_it_passes() -> None:
    """Frame age rising 100 ms/min fails frame_age (value ~100 ms/min); rising 10 ms/min
    (significant, under the 50 ms/min tolerance) passes."""
    fast = judge(run_data(frame_age_ms=_age(100.0)), CRIT).get("frame_age")
    assert fast is not None and fast.status == "fail"
    assert fast.value is not None and 90 < fast.value < 110
    slow = judge(run_data(frame_age_ms=_age(10.0)), CRIT).get("frame_age")
    assert slow is not None and slow.status == "pass" and slow.evidence["p_value"] < 0.01


def test_a_trend_too_short_to_test_whose_range_exceeds_the_tolerance_is_invalid() -> None:
    """A 6 s run (5 frame-age windows, too few for a trend test) whose window medians range
    over tens of ms is INVALID "untested", never PASS."""
    rng = np.random.default_rng(3)
    d = run_data(dur=6.0, warm=1.0, frame_age_ms=rng.uniform(0, 100, 60))
    c = judge(d, CriteriaSettings(min_duration_s=1, min_frames=5)).get("frame_age")
    assert c is not None and c.status == "invalid" and c.detail.startswith("untested")


def test_a_stage_slowing_down_on_a_contended_host_is_invalid_on_a_quiet_one_fail() -> None:
    """Infer tripling (20 -> 60 ms) inside its 100 ms budget FAILs stage_trend on a quiet
    host; the same run while other processes held 95 % of the CPUs is INVALID (the host may
    have slowed it), never PASS."""

    def slowing(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return (20 + 40 * t / t[-1]) * np.exp(rng.normal(0, 0.02, t.size))

    crit = CriteriaSettings(contended_cpu_pct=75)
    st = np.arange(0, 300, 0.1)
    for host, want in ((5.0, "fail"), (95.0, "invalid")):
        busy = {"host_cpu_pct": np.full(st.size, host), "cpu_pct": np.zeros(st.size)}
        c = judge(run_data(infer=slowing, samples=busy), crit).get("stage_trend")
        assert c is not None and c.status == want, (host, c.detail)


def test_a_zero_memory_tolerance_judges_without_dividing_by_it() -> None:
    """criteria.max_memory_growth_mb_per_min = 0 (no growth allowed, which the settings
    accept) judges a slope that is not significant; nothing estimates the run length that
    would decide it (a ZeroDivisionError before)."""

    def rss(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return 400 * MIB + 0.01 * MIB * t / 60 + rng.normal(0, 2 * MIB, t.size)

    c = judge(run_data(rss=rss, seed=0), CriteriaSettings(max_memory_growth_mb_per_min=0))
    m = c.get("memory_rss")
    assert m is not None and m.status in ("pass", "invalid") and "would decide" not in m.detail


def test_headroom_that_only_a_worst_case_bound_exhausts_is_invalid_never_fail() -> None:
    """An 8 s run too short for a memory trend test (its floors' range bounds the slope)
    whose bound would use up the little host memory left within the horizon: a worst-case
    bound is no claim about the model, so memory_headroom is INVALID, not FAIL."""

    def steps(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return 400 * MIB + np.floor(t / 3) % 2  # flat, one-byte steps

    d = run_data(dur=8.0, warm=1.0, rss=steps)
    d.meta.environment = {"host_mem_total_bytes": 400.05 * MIB}
    v = judge(d, CriteriaSettings(min_duration_s=1, min_frames=5, floor_window_s=0.5))
    m, h = v.get("memory_rss"), v.get("memory_headroom")
    assert m is not None and m.evidence.get("decided_by") == "bounded"
    assert h is not None and h.status == "invalid" and "too short to rule out" in h.detail


def test_headroom_fails_when_a_slow_leak_exhausts_host_memory_within_a_day() -> None:
    """A leak at half the slope tolerance with ~440 MB left of a 1 GiB host: gone within
    hours, so memory_headroom fails while memory_rss passes."""
    leak = 0.5 * CRIT.max_memory_growth_mb_per_min

    def rss(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return 580 * MIB + leak * MIB * t / 60 + rng.normal(0, 0.2 * MIB, t.size)

    d = run_data(rss=rss)
    d.meta.environment = {"host_mem_total_bytes": 1024 * MIB}
    v = judge(d, CriteriaSettings(max_memory_growth_mb_per_min=5.0))  # the docstring's 5
    st = {c.criterion: c.status for c in v.criteria}
    assert (st["memory_rss"], st["memory_headroom"]) == ("pass", "fail")
    h = v.get("memory_headroom")
    assert h is not None and h.value is not None and 1.0 < h.value < 24


def test_drops_rising_to_over_the_threshold_fail_before_the_total_does() -> None:
    """A loss rate rising steadily from 0 to 8 %: ~4 % lost in all (under 5 %), yet drops
    fails on the accelerating rate, whose fitted end is over the threshold."""
    t = np.arange(0, 300, 0.1)
    cum = np.floor(np.cumsum(0.08 * t / t.max()))  # one drop each time the rate adds to 1
    c = judge(run_data(drop_count=cum), CRIT).get("drops")
    assert c is not None and c.value is not None and c.value < CRIT.max_drop_fraction
    assert c.status == "fail" and c.evidence["accelerating"]


def test_a_server_queue_trend_too_short_to_test_is_invalid_never_pass() -> None:
    """A served run whose waiting queue was scraped 5 times (too few windows for a trend
    test) and rose 20 over the run, more than the 1 a minute allowed: server_queue is
    INVALID "untested", never PASS."""
    d = run_data(dur=300.0)
    d.meta.workload_kind = "openai"
    t = np.array([10.0, 70.0, 130.0, 190.0, 250.0])
    d.server = {"vllm:num_requests_waiting": (t, np.array([0.0, 12.0, 3.0, 20.0, 5.0]))}
    c = judge(d, CRIT).get("server_queue")
    assert c is not None and c.status == "invalid" and c.detail.startswith("untested"), c


def test_a_run_stopped_early_is_judged_up_to_its_stop_not_its_shutdown() -> None:
    """RSS rising 60 MB/min until an early stop on memory_rss at 30 s, then level for the
    20 s the shutdown took: judged up to the stop, the leak still FAILs and the stop is
    confirmed (FAIL, not INVALID "growth that stopped")."""

    def rss(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return 400 * MIB + np.minimum(t, 30.0) * MIB + rng.normal(0, 0.05 * MIB, t.size)

    d = run_data(dur=50.0, rss=rss, status="aborted", reason="memory_rss: floor rising")
    d.events = [{"kind": "warmup_end", "t": 5.0},
                {"kind": "early_stop", "t": 30.0, "data": {"criterion": "memory_rss"}}]  # fmt: skip
    v = judge(d, CRIT.model_copy(update={"floor_window_s": 1.0}))
    mem = v.get("memory_rss")
    assert mem is not None and mem.status == "fail", mem
    assert v.status == "FAIL" and "stopped early" in v.reason, v.reason


# --------------------------------------------------------------------------- undecided trends


def _undecided(c: Any, tol: float) -> None:
    """``c`` is undecided: its slope over ``tol``, its test not significant, INVALID."""
    assert c is not None and c.value is not None and c.value > tol, c
    assert c.evidence["p_value"] > CRIT.alpha and c.evidence["decided_by"] == "undecided", c
    assert c.status == "invalid" and c.detail.startswith("undecided: "), c.detail


def test_frame_age_rising_over_its_tolerance_unconfirmed_is_undecided_never_pass() -> None:
    """Frame age rising 200 ms/min under 1.5 s of noise over 90 s: the slope reads over the
    50 ms/min tolerance but the test cannot confirm it, so frame_age is INVALID
    "undecided"; the same frames under a tolerance at or above their slope pass."""
    rng = np.random.default_rng(5)
    t = np.arange(0, 90, 0.1)
    age = 500 + 200 * t / 60 + np.abs(rng.normal(0, 1500, t.size))
    d = run_data(dur=90.0, frame_age_ms=age)
    c = judge(d, CRIT).get("frame_age")
    _undecided(c, CRIT.max_age_slope_ms_per_min)
    assert c is not None and c.value is not None
    wide = CriteriaSettings(max_age_slope_ms_per_min=c.value * 1.01)
    assert status_of(d, "frame_age", wide) == "pass"
    at = CriteriaSettings(max_age_slope_ms_per_min=c.value)  # a slope at it is not over it
    assert status_of(d, "frame_age", at) == "pass"


def test_a_server_queue_rising_over_its_tolerance_unconfirmed_is_undecided_never_pass() -> None:
    """A served run's waiting queue scraped every 5 s, noisy (0-40) with a slope over the 1
    a minute allowed that the test cannot confirm: server_queue is INVALID "undecided"."""
    rng = np.random.default_rng(2)
    d = run_data(dur=120.0)
    d.meta.workload_kind = "openai"
    t = np.arange(5.0, 120.0, 5.0)
    d.server = {"vllm:num_requests_waiting": (t, np.round(rng.uniform(0, 40, t.size) + t / 20))}
    c = judge(d, CRIT).get("server_queue")
    assert c is not None and c.value is not None
    assert c.value > CRIT.max_server_queue_slope_per_min and c.status == "invalid", c
    assert c.detail.startswith("undecided: "), c.detail


def test_a_stage_rising_over_its_tolerance_unconfirmed_is_undecided_not_applicable() -> None:
    """Infer times whose slope reads over the 5 ms/min tolerance under heavy noise, not
    significant: stage_trend is n/a "undecided" (frame age judges the timing of a run this
    noisy), never PASS."""

    def noisy(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return 40 + 6 * t / 60 + rng.normal(0, 10.0, t.size)

    c = judge(run_data(dur=60.0, fps=10.0, infer=noisy), CRIT).get("stage_trend")
    assert c is not None and c.status == "n/a" and "undecided, infer_ms" in c.detail, c.detail


def test_a_late_rise_over_the_tolerance_unconfirmed_is_undecided_never_pass() -> None:
    """Floors level for a minute, then rising 3 MB/min under 1.5 MB of noise: the whole
    window's slope is under the tolerance, the last half's over it but not significant at
    alpha / 2: memory_rss is INVALID "undecided" (it passed before), naming the late slope."""

    def rss(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        late = 3 * MIB * np.clip(t - 60, 0, None) / 60
        return 400 * MIB + late + rng.normal(0, 1.5 * MIB, t.size)

    c = judge(run_data(dur=120.0, rss=rss, seed=1), CRIT).get("memory_rss")
    tol = CRIT.max_memory_growth_mb_per_min
    assert c is not None and c.evidence["slope"] <= tol < c.evidence["late"]["slope"], c
    assert c.evidence["late"]["p_value"] > CRIT.alpha / 2, c
    assert c.status == "invalid" and c.detail.startswith("undecided: floor slope +3"), c.detail


def test_headroom_never_judges_a_memory_slope_the_test_left_undecided() -> None:
    """Floors whose slope reads over the tolerance by noise, not significant, on a host with
    little memory left: memory_headroom is INVALID (its hours unknown), never PASS on a
    slope taken as flat."""

    def rss(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return 400 * MIB + rng.normal(0, 40 * MIB, t.size)

    d = run_data(dur=90.0, rss=rss)
    d.meta.environment = {"host_mem_total_bytes": 600 * MIB}
    v = judge(d, CRIT)
    assert v.get("memory_rss").evidence["decided_by"] == "undecided"  # type: ignore[union-attr]
    assert v.get("memory_headroom").status == "invalid"  # type: ignore[union-attr]


def test_a_fail_beside_an_undecided_trend_is_fail_beside_an_untested_one_invalid() -> None:
    """Errors after the warm-up FAIL the run (exit 1) beside a memory trend left undecided
    (its slope over the tolerance, not significant: no fault the failure could be an
    artefact of), which the reason names; beside an untested trend the run is INVALID."""
    err = np.zeros(900)
    err[600] = 1

    def noisy(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return 400 * MIB + rng.normal(0, 40 * MIB, t.size)

    v = judge(run_data(dur=90.0, rss=noisy, has_error=err), CRIT)
    assert v.get("memory_rss").evidence["decided_by"] == "undecided"  # type: ignore[union-attr]
    assert (v.status, v.exit_code) == ("FAIL", ExitCode.FAIL), v.reason
    assert v.reason.startswith("errors: ") and "undecided too: memory_rss" in v.reason
    few_err = np.zeros(60)
    few_err[40] = 1
    ages = np.random.default_rng(3).uniform(0, 100, 60)
    crit = CriteriaSettings(min_duration_s=1, min_frames=5)
    few = judge(run_data(dur=6.0, warm=1.0, frame_age_ms=ages, has_error=few_err), crit)
    assert few.get("errors").status == "fail"  # type: ignore[union-attr]
    assert few.get("frame_age").detail.startswith("untested")  # type: ignore[union-attr]
    assert (few.status, few.exit_code) == ("INVALID", ExitCode.INVALID), few.reason
