"""The verdict: criteria 1-5, INVALID and n/a rules, history, diagnosis, storage, and
end-to-end runs of the synthetic workload with planted truth."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from soakd.analysis import (
    RunData,
    RunMeta,
    evaluate,
    judge,
    judge_run,
    make_run_data,
    stats,
)
from soakd.analysis.criteria.jitter import DEFAULT_JITTER_K, HISTORY_MARGIN, resolve_jitter_k
from soakd.analysis.model import age_window_s, floor_window_s
from soakd.config import CriteriaSettings, Settings, load_settings
from soakd.errors import ExitCode
from soakd.store import db as store

from .conftest import make_run

MIB = float(1 << 20)


def planted(
    *,
    dur: float = 600.0,
    fps: float = 30.0,
    warm: float = 5.0,
    age: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None,
    infer: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None,
    rss: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None,
    gpu: bool = False,
    device: str = "cpu",
    status: str = "completed",
    seed: int = 0,
    **frames: Any,
) -> RunData:
    """A run of ``dur`` seconds at ``fps`` with healthy noisy defaults and planted series."""
    rng = np.random.default_rng(seed)
    t = np.arange(0, dur, 1 / fps)
    n = t.size
    cols: dict[str, Any] = {
        "t_capture": t,
        "warmup": (t < warm).astype(float),
        "grab_ms": 1 + rng.exponential(0.1, n),
        "pre_ms": 2 * np.exp(rng.normal(0, 0.05, n)),
        "infer_ms": infer(t, rng) if infer else 20 * np.exp(rng.normal(0, 0.05, n)),
        "decode_ms": 2 * np.exp(rng.normal(0, 0.05, n)),
        "frame_age_ms": age(t, rng) if age else 3 + rng.gamma(2, 1.5, n),
        "queue_len": np.zeros(n),
    }
    cols["total_ms"] = cols["grab_ms"] + cols["pre_ms"] + cols["infer_ms"] + cols["decode_ms"]
    cols.update(frames)
    st = np.arange(0, dur, 0.1)
    base = 400 * MIB + rng.normal(0, 0.2 * MIB, st.size)
    samples: dict[str, Any] = {
        "t": st,
        "rss_bytes": rss(st, rng) if rss else base,
        "cpu_pct": 50 + rng.normal(0, 5, st.size),
    }
    if gpu:
        samples["gpu_mem_used_bytes"] = 2000 * MIB + rng.normal(0, MIB, st.size)
        samples["gpu_util_pct"] = 80 + rng.normal(0, 3, st.size)
    meta = RunMeta(
        "r", status=status, duration_s=dur, fps=fps, device=device, workload_kind="synthetic"
    )
    return make_run_data(meta, frames=cols, samples=samples)


CRIT = CriteriaSettings()


def statuses(v: Any) -> dict[str, str]:
    return {c.criterion: c.status for c in v.criteria}


def test_healthy_noisy_run_passes() -> None:
    """Flat but noisy frame age, memory and infer times: PASS, exit code 0."""
    v = judge(planted(), CRIT)
    assert v.status == "PASS" and v.exit_code == ExitCode.PASS
    assert statuses(v)["memory_gpu"] == "n/a"


def test_autocorrelated_flat_age_passes() -> None:
    """Frame age wandering as AR(1) noise around a flat level does not fail."""

    def ar(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        e = np.zeros(t.size)
        for i in range(1, t.size):
            e[i] = 0.995 * e[i - 1] + rng.normal(0, 0.5)
        return 20 + e

    v = judge(planted(age=ar), CRIT)
    assert statuses(v)["frame_age"] == "pass"


def test_slow_frame_age_creep_fails() -> None:
    """Frame age rising 100 ms/min under noise fails frame_age with the slope as value."""
    v = judge(planted(age=lambda t, r: 20 + t / 60 * 100 + r.normal(0, 10, t.size)), CRIT)
    c = v.get("frame_age")
    assert v.status == "FAIL" and c is not None and c.status == "fail"
    assert c.value is not None and 80 < c.value < 120


def test_creep_below_tolerance_passes() -> None:
    """A significant but small age trend (10 ms/min < 50) passes."""
    v = judge(planted(age=lambda t, r: 20 + t / 60 * 10 + r.normal(0, 1, t.size)), CRIT)
    c = v.get("frame_age")
    assert c is not None and c.status == "pass" and c.evidence["p_value"] < 0.01


def test_age_p95_ceiling_fails_when_set() -> None:
    """max_age_p95_ms fails a flat run whose p95 frame age is above it."""
    crit = CriteriaSettings(max_age_p95_ms=5.0)
    v = judge(planted(), crit)
    assert statuses(v)["frame_age"] == "fail"


def _saw(period: float, amp_mb: float, leak_mb_min: float) -> Callable[..., np.ndarray]:
    def f(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return (
            400 * MIB
            + amp_mb * MIB * ((t % period) / period)
            + leak_mb_min * MIB * t / 60
            + rng.normal(0, 0.1 * MIB, t.size)
        )

    return f


def test_sawtooth_without_leak_passes() -> None:
    """A 300 MB allocator sawtooth returning to the same floor passes memory."""
    v = judge(planted(rss=_saw(7.0, 300, 0.0)), CRIT)
    c = v.get("memory_rss")
    assert c is not None and c.status == "pass"
    assert c.evidence["sawtooth"]["drops"] > 10
    assert any("sawtooth" in h and "not a leak" in h for h in v.hints)


def test_leak_under_sawtooth_fails() -> None:
    """A 10 MB/min leak under a 300 MB sawtooth lifts the floor: memory_rss fails."""
    v = judge(planted(rss=_saw(7.0, 300, 10.0)), CRIT)
    c = v.get("memory_rss")
    assert v.status == "FAIL" and c is not None and c.status == "fail"
    assert c.value is not None and 8 < c.value < 12
    assert any("leak under an allocator sawtooth" in h for h in v.hints)


def test_gpu_memory_judged_when_present_and_invalid_when_cuda_lacks_it() -> None:
    """GPU samples make memory_gpu applicable; a CUDA workload without them is INVALID."""
    assert statuses(judge(planted(gpu=True), CRIT))["memory_gpu"] == "pass"
    v = judge(planted(device="cuda:0"), CRIT)
    assert v.status == "INVALID" and statuses(v)["memory_gpu"] == "invalid"
    assert "without GPU" in v.reason


def test_oom_event_fails() -> None:
    """An out-of-memory event fails the oom criterion."""
    d = planted()
    d.events.append({"t": 100.0, "kind": "oom", "message": "CUDA out of memory"})
    d.event_counts["oom"] = 1
    v = judge(d, CRIT)
    assert statuses(v)["oom"] == "fail" and v.status == "FAIL"


def test_periodic_spikes_fail_jitter_and_are_called_periodic() -> None:
    """An 8x infer spike every 50th frame fails jitter; the hint names the period."""

    def spikes(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        y = 20 * np.exp(rng.normal(0, 0.05, t.size))
        y[7::50] *= 8
        return y

    v = judge(planted(infer=spikes), CRIT)
    c = v.get("jitter")
    assert c is not None and c.status == "fail" and c.value is not None and c.value > 5
    assert c.evidence["tail_periodic"] and c.evidence["tail_period"] == 50
    assert any("every 50 frames" in h for h in v.hints)


def test_random_spikes_are_called_irregular() -> None:
    """Spikes at random frames fail jitter and are not called periodic."""

    def spikes(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        y = 20 * np.exp(rng.normal(0, 0.05, t.size))
        y[rng.choice(t.size, 40, replace=False)] *= 8
        return y

    v = judge(planted(infer=spikes), CRIT)
    c = v.get("jitter")
    assert c is not None and c.status == "fail" and not c.evidence["tail_periodic"]


def test_errors_fail_and_warmup_errors_do_not() -> None:
    """Frames that raised after warm-up fail errors; those during warm-up only warn."""
    n = 600 * 30
    err = np.zeros(n)
    err[10] = 1  # warm-up
    v = judge(planted(has_error=err), CRIT)
    assert statuses(v)["errors"] == "pass" and v.get("errors").warnings  # type: ignore[union-attr]
    err[5000] = 1
    v = judge(planted(has_error=err), CRIT)
    assert statuses(v)["errors"] == "fail" and v.get("errors").value == 1  # type: ignore[union-attr]


def test_drops_fraction_fails() -> None:
    """10 % of captured frames dropped fails drops with the fraction as value."""
    n = 600 * 30
    drops = np.floor(np.arange(n) / 9)  # one drop per 9 rows -> 10 % of captured
    v = judge(planted(drop_count=drops), CRIT)
    c = v.get("drops")
    assert c is not None and c.status == "fail" and c.value is not None
    assert 0.08 < c.value < 0.12


def test_accelerating_drops_fail_before_the_total_does() -> None:
    """A drop rate rising to 12 % by the end fails even with ~6 % lost in all... or less."""
    n = 600 * 30
    t = np.arange(n) / 30
    rate = 0.12 * (t / 600) ** 3  # accelerating; overall fraction ~3 %
    drops = np.floor(np.cumsum(rate / (1 - rate)))
    v = judge(planted(drop_count=drops), CRIT)
    c = v.get("drops")
    assert c is not None and c.value is not None and c.value < CRIT.max_drop_fraction
    assert c.evidence["accelerating"] and c.status == "fail"


def test_too_short_run_is_invalid() -> None:
    """A run shorter than min_duration_s is INVALID with the reason, exit code 3."""
    v = judge(planted(dur=6.0, warm=1.0), CRIT)
    assert v.status == "INVALID" and v.exit_code == ExitCode.INVALID
    assert "too short for a soak" in v.reason


def test_aborted_run_is_invalid_even_when_criteria_pass() -> None:
    """An aborted run is INVALID, naming the abort reason."""
    d = planted(status="aborted")
    d.meta.reason = "stalled: no frame finished for 60 s"
    v = judge(d, CRIT)
    assert v.status == "INVALID" and "stalled" in v.reason


def test_too_few_frames_is_invalid() -> None:
    """Fewer post-warm-up frames than min_frames is INVALID."""
    v = judge(planted(dur=30.0, fps=0.5), CriteriaSettings(min_frames=20))
    assert v.status == "INVALID" and "min_frames" in v.reason


def test_short_run_warns_it_cannot_see_small_leaks() -> None:
    """A noisy 2-minute run reports the smallest detectable leak and warns when the
    threshold is below it."""
    v = judge(
        planted(dur=120.0, rss=lambda t, r: 400 * MIB + r.normal(0, 20 * MIB, t.size)),
        CriteriaSettings(max_memory_growth_mb_per_min=0.5),
    )
    c = v.get("memory_rss")
    assert c is not None and c.evidence["min_detectable_slope"] > 0.5
    assert any("cannot see leaks under" in w for w in v.warnings)


def test_jitter_history_rule() -> None:
    """k = "history": margin x the largest passing ratio with enough runs, else the default."""
    crit = CriteriaSettings(jitter_k="history", jitter_history_min_runs=3)
    k, note = resolve_jitter_k(crit, [1.5, 2.0])
    assert k == DEFAULT_JITTER_K and "default" in note
    k, _ = resolve_jitter_k(crit, [1.5, 2.0, 1.8])
    assert k == pytest.approx(HISTORY_MARGIN * 2.0)
    v = judge(planted(), crit, [1.1, 1.1, 1.1])
    c = v.get("jitter")
    assert c is not None and c.threshold == pytest.approx(HISTORY_MARGIN * 1.1)


def test_fps_too_high_hint_recommends_a_rate() -> None:
    """Frame age and queue rising with total flat: the hint recommends 0.5-0.7 x 1000/total."""
    d = planted(age=lambda t, r: 20 + t * 2 + r.normal(0, 1, t.size))
    d.frames["queue_len"] = np.minimum(d.frames["t_capture"] / 60, 8.0)
    v = judge(d, CRIT)
    assert any("soak at" in h and "fps" in h for h in v.hints)


def test_drops_from_a_long_tail_are_not_blamed_on_the_rate() -> None:
    """Drops at a rate inside 0.5-0.7 x 1000/median total are attributed to the long tail,
    and no lower frame rate is recommended (25 ms frames at 20 fps)."""
    n = 600 * 20
    drops = np.floor(np.arange(n) / 9)
    v = judge(planted(fps=20, drop_count=drops), CRIT)
    assert v.get("drops") is not None and v.get("drops").status == "fail"  # type: ignore[union-attr]
    assert not any("soak at" in h for h in v.hints)
    assert any("long-tail frames" in h for h in v.hints)


def test_judge_survives_an_empty_run() -> None:
    """A run with no frames and no samples is INVALID, not an exception."""
    v = judge(make_run_data(RunMeta("empty", duration_s=0.0)), CRIT)
    assert v.status == "INVALID"


# --------------------------------------------------------------------------- storage


def _insert_run(
    conn: sqlite3.Connection,
    rid: str,
    started: float,
    *,
    host: str = "h",
    config_hash: str = "abc",
    criteria: dict[str, Any] | None = None,
) -> None:
    # a 20 s run: judged with criteria a 20 s run can meet
    crit = {"min_duration_s": 10, "floor_window_s": 1, **(criteria or {})}
    cfg = {"criteria": crit, "workload": {"kind": "synthetic"}, "run": {"warmup_s": 1.0}}
    make_run(
        conn,
        id=rid,
        started_unix=started,
        host=host,
        workload_kind="synthetic",
        fps=10,
        config=cfg,
        config_hash=config_hash,
        duration_s=20,
    )
    rng = np.random.default_rng(int(started))
    rows = [
        (rid, i, i / 10, i / 10, int(i < 10), float(20 * np.exp(rng.normal(0, 0.05))), 3.0)
        for i in range(200)
    ]
    conn.executemany(
        "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, warmup, infer_ms, "
        "frame_age_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    conn.executemany(
        "INSERT INTO samples (run_id, seq, t, wall, rss_bytes) VALUES (?, ?, ?, 0, ?)",
        [(rid, i, i / 10, 400 << 20) for i in range(200)],
    )


def test_verdict_is_stored_and_history_feeds_the_next_run(db_path: Path) -> None:
    """judge_run stores one verdicts row per criterion and runs.verdict; later runs with
    jitter_k = "history" draw k from earlier passing runs of the same config and host."""
    conn = store.connect(db_path)
    for i in range(3):
        _insert_run(conn, f"old{i}", 1000.0 + i)
        judge_run(conn, f"old{i}")
    rows = conn.execute("SELECT criterion, status FROM verdicts WHERE run_id = 'old0'").fetchall()
    assert {r[0] for r in rows} >= {
        "run",
        "drops",
        "frame_age",
        "memory_rss",
        "jitter",
        "errors",
        "oom",
    }
    assert conn.execute("SELECT verdict, exit_code FROM runs WHERE id='old0'").fetchone()[:] == (
        "PASS",
        0,
    )
    _insert_run(conn, "other-host", 1500.0, host="elsewhere")
    judge_run(conn, "other-host")
    _insert_run(conn, "new", 2000.0, criteria={"jitter_k": "history"})
    _, v = evaluate(conn, "new")
    c = v.get("jitter")
    assert c is not None and c.evidence["history_runs"] == 3
    ratios = [
        r[0]
        for r in conn.execute(
            "SELECT value FROM verdicts WHERE criterion='jitter' AND run_id LIKE 'old%'"
        )
    ]
    assert c.threshold == pytest.approx(HISTORY_MARGIN * max(ratios))
    conn.close()


# --------------------------------------------------------------------------- end to end

E2E = (
    "run.duration=14",
    "run.fps=25",
    "run.warmup_s=2",
    "criteria.min_duration_s=10",
    "criteria.min_frames=50",
    "criteria.floor_window_s=1",
    "run.sample_interval_ms=100",
    "workload.pre_ms=1",
    "workload.infer_ms=10",
    "workload.decode_ms=1",
    "workload.jitter=0.05",
)


def _run(synthetic: Callable[..., Settings], *extra: str) -> Any:
    from soakd.run.runner import run_soak

    res = run_soak(synthetic(*E2E, *extra))
    assert res.verdict is not None, res.summary.get("verdict_error")
    return res


@pytest.mark.slow
def test_e2e_healthy_with_noise_passes(synthetic: Callable[..., Settings]) -> None:
    """A healthy synthetic run with jitter passes and exits 0."""
    res = _run(synthetic, "workload.jitter=0.1")
    assert res.verdict.status == "PASS", res.verdict.reason
    assert res.exit_code == 0


@pytest.mark.slow
def test_e2e_leak_fails_memory(synthetic: Callable[..., Settings]) -> None:
    """A real 120 MB/min RSS leak fails memory_rss."""
    res = _run(synthetic, "workload.leak_mb_per_min=120")
    assert res.verdict.status == "FAIL"
    assert res.verdict.get("memory_rss").status == "fail"
    assert res.exit_code == ExitCode.FAIL


@pytest.mark.slow
def test_e2e_sawtooth_without_leak_passes(synthetic: Callable[..., Settings]) -> None:
    """A real 40 MB sawtooth with a 0.5 s period and no leak passes memory: never a leak
    (on a starved host its 14 s may leave the floor undecided or settling: INVALID)."""
    res = _run(synthetic, "workload.sawtooth_mb=40", "workload.sawtooth_period_s=0.5")
    mem = res.verdict.get("memory_rss")
    assert mem.status == "pass" or mem.detail.startswith(STARVED), res.verdict.reason


@pytest.mark.slow
def test_e2e_leak_under_sawtooth_fails(synthetic: Callable[..., Settings]) -> None:
    """A 120 MB/min leak under a 40 MB sawtooth still fails memory_rss, never passes (on a
    starved host its 14 s may leave the floor undecided: INVALID, a run length named)."""
    res = _run(
        synthetic,
        "workload.sawtooth_mb=40",
        "workload.sawtooth_period_s=0.5",
        "workload.leak_mb_per_min=120",
    )
    mem = res.verdict.get("memory_rss")
    assert mem.status == "fail" or mem.detail.startswith("undecided: "), res.verdict.reason


#: what memory_rss says of a healthy floor a starved host left unjudged (INVALID)
STARVED = ("undecided: ", "still settling: ")


@pytest.mark.slow
def test_e2e_slowing_workload_oldest_fails_frame_age(synthetic: Callable[..., Settings]) -> None:
    """A workload slowing 600 ms/min with consume = "oldest" and a deep queue fails age."""
    res = _run(
        synthetic,
        "run.consume='oldest'",
        "run.max_queue=1000",
        "run.fps=20",
        "workload.infer_ms=40",
        "workload.drift_ms_per_min=600",
        # the memory the growing queue holds is not what this test judges: a loose tolerance
        # lets memory_rss pass on its bound instead of being untested on a busy machine, and
        # a day's horizon keeps that worst-case bound (~70 h of headroom) from leaving
        # memory_headroom undecided (INVALID) against the default week
        "criteria.max_memory_growth_mb_per_min=1000",
        "criteria.horizon='24h'",
    )
    assert res.verdict.get("frame_age").status == "fail", res.verdict.reason
    assert res.verdict.status == "FAIL", res.verdict.reason


@pytest.mark.slow
def test_e2e_workload_slower_than_rate_fails_drops(synthetic: Callable[..., Settings]) -> None:
    """A 60 ms workload at 25 fps drops frames: drops fails, the hint recommends a rate."""
    res = _run(synthetic, "workload.infer_ms=60")
    assert res.verdict.get("drops").status == "fail"
    assert any("soak at" in h for h in res.verdict.hints)


@pytest.mark.slow
def test_e2e_periodic_spikes_fail_jitter(synthetic: Callable[..., Settings]) -> None:
    """A 100 ms spike every 20th frame fails jitter."""
    res = _run(synthetic, "workload.spike_every=20", "workload.spike_ms=100")
    assert res.verdict.get("jitter").status == "fail", res.verdict.reason


@pytest.mark.slow
def test_e2e_errors_fail_errors(synthetic: Callable[..., Settings]) -> None:
    """A workload raising every 30th frame fails errors."""
    res = _run(synthetic, "workload.error_every=30")
    assert res.verdict.get("errors").status == "fail"


@pytest.mark.slow
def test_e2e_too_short_run_is_invalid(synthetic: Callable[..., Settings]) -> None:
    """A 4 s run with min_duration_s = 10 is INVALID and exits 3."""
    res = _run(synthetic, "run.duration=4")
    assert res.verdict.status == "INVALID" and res.exit_code == ExitCode.INVALID


# --------------------------------------------------------------------------- issue 10
# every tick the target rate asked for is judged; untestable is never PASS; headroom in
# hours; jitter robust to a lone outlier


def _with(d: RunData, *, summary: dict[str, Any] | None = None, **config: Any) -> RunData:
    d.meta.summary = dict(summary or {})
    d.meta.config = {k: dict(v) for k, v in config.items()}
    return d


def _new_summary(d: RunData, **over: float) -> dict[str, Any]:
    """The summary a current runner writes for ``d`` with nothing lost."""
    n = d.n_frames
    s: dict[str, Any] = {
        "frames_captured": n,
        "frames_done": n,
        "drops": 0,
        "stale": 0,
        "queued_at_end": 0,
        "in_flight_at_end": 0,
        "pacer_missed_ticks": 0,
        "pacer_ticks": n,
        "missed_ticks_source": 0,
        "missed_ticks_pause": 0,
        "stall_timeout_s": 60.0,
    }
    s.update(over)
    return s


def test_frames_captured_after_the_last_finished_frame_count_as_lost() -> None:
    """A hang near the end: 340 frames captured and dropped after the last row are losses
    the rows cannot show; the summary's totals count them and drops fails."""
    d = planted(dur=20.0, fps=20.0, warm=2.0)
    n = d.n_frames
    d = _with(d, summary=_new_summary(d, frames_captured=n + 340, drops=340, pacer_ticks=n + 340))
    c = judge(d, CRIT).get("drops")
    assert c is not None and c.status == "fail" and c.evidence["dropped"] == 340
    assert "340 dropped" in c.detail


def test_a_frame_in_flight_at_the_end_makes_the_run_invalid_naming_the_hang() -> None:
    """A frame dispatched and never finished is a hang: the run criterion is INVALID with
    the reason and the time, and INVALID wins over the drops FAIL its losses give."""
    d = planted(dur=20.0, fps=20.0, warm=2.0)
    n = d.n_frames
    summary = _new_summary(
        d, frames_captured=n + 341, drops=340, in_flight_at_end=1, in_flight_since_s=3.0
    )
    v = judge(_with(d, summary=summary), CRIT)
    assert v.status == "INVALID" and v.exit_code == ExitCode.INVALID
    run = v.get("run")
    assert run is not None and run.status == "invalid" and "hung" in run.detail
    assert "3 s" in run.detail and statuses(v)["drops"] == "fail"
    assert "1 in flight at the end" in v.get("drops").detail  # type: ignore[union-attr]


def test_missed_pacer_ticks_are_losses_counted_against_the_target_rate() -> None:
    """A source delivering 20 fps against a 40 fps target: the ticks the pacer skipped are
    losses out of the ticks the target rate asked for, named with their cause."""
    d = planted(dur=20.0, fps=20.0, warm=2.0)
    d.meta.fps = 40.0
    n = d.n_frames
    summary = _new_summary(
        d, pacer_missed_ticks=n, missed_ticks_source=n, pacer_ticks=2 * n, frames_captured=n
    )
    c = judge(_with(d, summary=summary), CRIT).get("drops")
    assert c is not None and c.status == "fail" and c.value is not None and c.value > 0.45
    assert f"{n} missed ticks ({n} source, 0 pause)" in c.detail


def test_frames_still_queued_at_the_end_count_as_lost() -> None:
    """consume = "oldest": 64 frames still queued when the run stopped are losses."""
    d = planted(dur=40.0, fps=20.0, warm=2.0)
    n = d.n_frames
    summary = _new_summary(d, frames_captured=n + 64, queued_at_end=64)
    c = judge(_with(d, summary=summary, run={"consume": "oldest"}), CRIT).get("drops")
    assert c is not None and c.evidence["queued_at_end"] == 64 and c.status == "fail"
    assert "64 queued at the end" in c.detail


def test_an_old_run_without_the_new_counters_names_no_unknown_loss() -> None:
    """A run stored before the runner wrote queued_at_end etc.: those kinds are unknown,
    not zero, so the report does not claim "0 queued at the end"."""
    c = judge(planted(dur=60.0), CRIT).get("drops")
    assert c is not None and c.status == "pass"
    assert "queued" not in c.detail and c.evidence["queued_at_end"] is None


def _backlog_run(rss_mb_per_min: float = 0.0) -> RunData:
    """consume = "oldest" with the queue growing 10 frames per minute, frame age flat."""
    d = planted(dur=300.0, fps=10.0, warm=5.0, rss=None)
    t = d.frames["t_capture"]
    d.frames["queue_len"] = np.floor(t / 6.0)
    rng = np.random.default_rng(1)
    st = d.samples["t"]
    d.samples["rss_bytes"] = (
        400 * MIB + rss_mb_per_min * MIB * st / 60 + rng.normal(0, 0.05 * MIB, st.size)
    )
    n = d.n_frames
    summary = _new_summary(d, frames_captured=n + 50, queued_at_end=50)
    return _with(
        d,
        summary=summary,
        run={"consume": "oldest"},
        source={"kind": "synthetic", "width": 640, "height": 480},
    )


def test_a_growing_backlog_fails_frame_age_with_consume_oldest() -> None:
    """With consume = "oldest" a queue that keeps growing fails frame_age (each queued frame
    ages one period more), though the dispatched frames' ages look flat."""
    v = judge(_backlog_run(), CRIT)
    c = v.get("frame_age")
    assert c is not None and c.status == "fail" and "backlog growing" in c.detail
    assert c.evidence["backlog"]["implied_age_slope_ms_per_min"] > 500


def test_rss_growth_that_tracks_the_queue_is_called_the_backlog_not_a_leak() -> None:
    """RSS rising as fast as queue growth x frame bytes (10 frames/min x 0.88 MB): the hint
    says it is the backlog, not a leak."""
    v = judge(_backlog_run(rss_mb_per_min=8.8), CRIT)
    assert statuses(v)["memory_rss"] == "fail"
    assert any("backlog the queue holds, not a leak" in h for h in v.hints)
    assert not any(h.endswith(": a leak") for h in v.hints)


def test_a_leak_beside_a_growing_backlog_is_still_called_a_leak() -> None:
    """RSS rising 30 MB/min beyond the 8.8 MB/min the growing queue holds: the hint names
    the backlog's share and calls the rest a leak, never "not a leak"."""
    v = judge(_backlog_run(rss_mb_per_min=8.8 + 30), CRIT)
    assert statuses(v)["memory_rss"] == "fail"
    assert not any("not a leak" in h for h in v.hints), v.hints
    assert any("the backlog accounts for" in h and "MB/min is a leak" in h for h in v.hints)


def test_an_untestable_trend_is_invalid_and_says_how_long_the_run_must_be() -> None:
    """A 12 s run at 2 fps: frame age has one window and RSS creeps faster than any bound
    allows; neither is PASS: INVALID "untested", no p-value, and the run length that would
    test it."""
    d = planted(
        dur=12.0,
        fps=2.0,
        warm=5.0,
        age=lambda t, r: 3 + r.gamma(2, 20, t.size),
        rss=lambda t, r: 400 * MIB + 4 * MIB * np.sqrt(t) + r.normal(0, 0.3 * MIB, t.size),
    )
    v = judge(d, CRIT)
    assert v.status == "INVALID"
    age = v.get("frame_age")
    assert age is not None and age.status == "invalid" and age.detail.startswith("untested")
    assert "run.duration >=" in age.detail and "p =" not in age.detail
    assert age.evidence["min_span_to_test_s"] == 7 * 5.0  # 7 windows of 10 frames at 2 fps


def test_a_short_run_whose_window_range_bounds_the_slope_passes() -> None:
    """Too few windows for a trend test, but the windows' range allows less growth than the
    tolerance: that is a bound, not a guess, and it passes."""
    d = planted(dur=20.0, fps=2.0, warm=5.0, age=lambda t, r: 1 + r.normal(0, 0.01, t.size))
    c = judge(d, CRIT).get("frame_age")
    assert c is not None and c.status == "pass" and c.evidence["decided_by"] == "bounded"
    assert "p =" not in c.detail


def test_the_embedded_default_run_is_long_enough_to_test_its_own_trends() -> None:
    """The README's first command (the embedded default) has enough frame-age and memory
    windows for a trend test at its alpha."""
    s = load_settings()
    span = s.run.duration - s.run.warmup_s
    need = stats.min_trend_points(s.criteria.alpha)
    assert span / age_window_s(span, s.run.fps) >= need + 3  # a margin for windows
    w, _ = floor_window_s(span, s.criteria.floor_window_s)
    assert span / w >= need


def _small_host(d: RunData, total_mb: float, cgroup_mb: float | None = None) -> RunData:
    d.meta.environment = {"host_mem_total_bytes": total_mb * MIB}
    if cgroup_mb is not None:
        d.meta.environment["cgroup_mem_max_bytes"] = cgroup_mb * MIB
    return d


def _leak(mb_per_min: float) -> Callable[..., np.ndarray]:
    return lambda t, r: 400 * MIB + mb_per_min * MIB * t / 60 + r.normal(0, 0.1 * MIB, t.size)


def test_headroom_fails_when_a_slow_leak_exhausts_memory_within_min_headroom_hours() -> None:
    """A 1.2 MB/min leak (under the slope tolerance) on a 1 GB host with 600 MB left is
    gone in ~8 h: memory_headroom fails beside a passing memory_rss."""
    v = judge(_small_host(planted(rss=_leak(1.2)), 1024), CRIT)
    h = v.get("memory_headroom")
    assert statuses(v)["memory_rss"] == "pass" and h is not None and h.status == "fail"
    assert h.value is not None and 6 < h.value < 10 and "host memory" in h.detail


def test_headroom_uses_the_cgroup_limit_when_lower_than_the_host() -> None:
    """The cgroup's memory.max is the limit when it is below the host's memory."""
    v = judge(_small_host(planted(rss=_leak(1.2)), 64_000, cgroup_mb=1024), CRIT)
    h = v.get("memory_headroom")
    assert h is not None and h.status == "fail" and "cgroup" in h.detail


def test_a_flat_floor_has_infinite_headroom() -> None:
    """No significant floor growth: infinite time to exhaustion, even on a small host."""
    v = judge(_small_host(planted(), 512), CRIT)
    h = v.get("memory_headroom")
    assert h is not None and h.status == "pass" and h.value is None and "flat" in h.detail


def test_gpu_headroom_is_the_device_total_minus_its_peak_used() -> None:
    """GPU memory: total - peak used at the floor slope; a 10 MB/min GPU leak with 1 GB
    left fails."""
    d = planted(gpu=True)
    st = d.samples["t"]
    d.samples["gpu_mem_used_bytes"] = 2000 * MIB + 10 * MIB * st / 60
    d.samples["gpu_mem_total_bytes"] = np.full(st.size, 3100 * MIB)
    h = judge(d, CRIT).get("memory_headroom")
    assert h is not None and h.status == "fail" and "GPU memory" in h.detail


def test_headroom_without_a_known_limit_is_not_applicable() -> None:
    """No host total, no cgroup, no GPU: n/a, never a silent pass."""
    h = judge(planted(), CRIT).get("memory_headroom")
    assert h is not None and h.status == "n/a"


def _lone(n_spikes: int, every: int | None = None) -> RunData:
    """1,617 frames at 60 fps, infer median 5 ms, ``n_spikes`` 23 ms frames (4.6 x ... over
    k = 4 here) at random or every ``every`` frames."""
    rng = np.random.default_rng(3)
    d = planted(dur=1617 / 60 + 5.0, fps=60.0, warm=5.0)
    y = 5 * np.exp(rng.normal(0, 0.03, d.n_frames))
    idx = (
        np.arange(400, d.n_frames, every)
        if every
        else rng.choice(np.arange(400, d.n_frames), n_spikes, replace=False)
    )
    y[idx[:n_spikes] if not every else idx] = 23.0
    d.frames["infer_ms"] = y
    return d


def test_a_lone_outlier_does_not_fail_jitter_by_default() -> None:
    """One 23 ms frame among ~1,600 at a 5 ms median passes (k = 4), and the report says
    how many frames exceeded k x median and when; the seed's "max" rule still fails it."""
    crit = CriteriaSettings(jitter_k=4.0)
    c = judge(_lone(1), crit).get("jitter")
    assert c is not None and c.status == "pass"
    assert c.evidence["exceed_count"] == 1 and c.evidence["exceed_first_t"] > 5
    assert "1 frame(s) over k x median" in c.detail
    strict = judge(_lone(1), CriteriaSettings(jitter_k=4.0, jitter_rule="max")).get("jitter")
    assert strict is not None and strict.status == "fail"


def test_more_spikes_than_allowed_fail_jitter() -> None:
    """Three 23 ms frames where two are allowed fail, naming first and last time."""
    c = judge(_lone(3), CriteriaSettings(jitter_k=4.0)).get("jitter")
    assert c is not None and c.status == "fail" and c.evidence["exceed_count"] == 3
    assert c.evidence["exceed_last_t"] > c.evidence["exceed_first_t"]


def test_recurrent_spikes_fail_even_under_the_allowed_share() -> None:
    """Spikes every 2,000th frame of a long run (0.05 %, under the 0.1 % share) recur at
    regular positions: jitter fails."""

    def spikes(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        y = 20 * np.exp(rng.normal(0, 0.05, t.size))
        y[1000::2000] *= 8
        return y

    c = judge(planted(infer=spikes), CRIT).get("jitter")
    assert c is not None and c.evidence["exceed_count"] <= c.evidence["exceed_allowed"]
    assert c.status == "fail" and c.evidence["exceed_periodic"]
    assert "recurring every 2000 frames" in c.detail


# --------------------------------------------------------------------------- issue 10 e2e


@pytest.mark.slow
def test_e2e_a_hang_near_the_end_is_never_pass(synthetic: Callable[..., Settings]) -> None:
    """The model hangs 5 s into a 9 s run: the frames captured after the last finished one
    are counted and the run is INVALID (hung or stalled), never PASS."""
    res = _run(
        synthetic,
        "run.duration=9",
        "run.fps=20",
        "run.stall_timeout_s=30",
        "workload.stall_after_s=5",
        "criteria.min_frames=20",
    )
    v = res.verdict
    assert v.status == "INVALID" and res.exit_code == ExitCode.INVALID, v.reason
    assert "hung" in v.reason or "stalled" in v.reason
    drops = v.get("drops")
    assert drops is not None and drops.status == "fail" and drops.evidence["lost"] >= 40


@pytest.mark.slow
def test_e2e_a_pause_counts_its_missed_ticks_and_blames_the_machine(db_path: Path) -> None:
    """A real `soakd run` stopped for 3 s with SIGSTOP / SIGCONT: the ticks it missed are
    losses, drops fails and the hint names the machine, not the model."""
    args = [*E2E, "run.duration=10", "run.fps=20", "workload.kind=synthetic", "run.log_every=0",
            # the suite's busy host would make the pause the host's (tests/test_drops_pauses.py)
            "criteria.contended_cpu_pct=100"]  # fmt: skip
    sets = [x for a in args for x in ("--set", a)]
    cmd = [sys.executable, "-m", "soakd", "run", "--db", str(db_path), "--no-live", *sets]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(6)  # loaded and running
    p.send_signal(signal.SIGSTOP)
    time.sleep(3)
    p.send_signal(signal.SIGCONT)
    _, err = p.communicate(timeout=120)
    assert p.returncode in (1, 3), err[-2000:]
    conn = store.connect(db_path)
    ((rid,),) = conn.execute("SELECT id FROM runs").fetchall()
    _, v = evaluate(conn, rid)
    conn.close()
    drops = v.get("drops")
    assert drops is not None and drops.evidence["missed_ticks_pause"] >= 40, drops
    assert drops.status == "fail" and "missed ticks" in drops.detail
    assert any("the machine is the bottleneck" in h for h in v.hints), v.hints


@pytest.mark.slow
def test_e2e_a_backlog_left_in_the_queue_is_counted(synthetic: Callable[..., Settings]) -> None:
    """consume = "oldest", a deep queue and a model slower than the rate: the frames still
    queued at the end are losses and frame age fails on the growing backlog."""
    res = _run(
        synthetic,
        "run.consume='oldest'",
        "run.max_queue=1000",
        "run.fps=25",
        "workload.infer_ms=60",
        # the queue's memory (and how long the host's memory lasts) is judged elsewhere
        "criteria.max_memory_growth_mb_per_min=1000",
        "criteria.horizon=1h",
    )
    v = res.verdict
    drops, age = v.get("drops"), v.get("frame_age")
    assert drops is not None and drops.evidence["queued_at_end"] >= 50
    assert "queued at the end" in drops.detail and drops.status == "fail"
    assert age is not None and age.status == "fail" and v.status == "FAIL", v.reason


@pytest.mark.slow
def test_e2e_a_run_too_short_for_its_trends_is_invalid(synthetic: Callable[..., Settings]) -> None:
    """8 s at 2 fps: one frame-age window, so the trend is untested: INVALID naming the
    run length that would test it."""
    res = _run(synthetic, "run.duration=8", "run.fps=2", "run.warmup_s=1", "criteria.min_frames=5")
    v = res.verdict
    assert v.status == "INVALID" and res.exit_code == ExitCode.INVALID
    age = v.get("frame_age")
    assert age is not None and age.detail.startswith("untested") and "run.duration >=" in age.detail


@pytest.mark.slow
def test_e2e_a_fast_leak_fails_memory_headroom(synthetic: Callable[..., Settings]) -> None:
    """A real 120 MB/min leak against this host's memory: hours, not days, to exhaustion."""
    res = _run(synthetic, "workload.leak_mb_per_min=120", "criteria.min_headroom_hours=1e6")
    h = res.verdict.get("memory_headroom")
    assert h is not None and h.status == "fail", h
    assert h.evidence["metrics"]["memory_rss"]["limit_source"] in (
        "host memory",
        "cgroup memory.max",
    )


@pytest.mark.slow
def test_e2e_one_spike_passes_jitter_and_the_max_rule_fails_it(
    synthetic: Callable[..., Settings], db_path: Path
) -> None:
    """One 100 ms infer spike among ~300 frames: the default rule passes and reports it;
    re-judged with jitter_rule = "max" (the seed's rule) it fails."""
    res = _run(synthetic, "workload.spike_every=200", "workload.spike_ms=100")
    j = res.verdict.get("jitter")
    assert j is not None and j.status == "pass" and j.evidence["exceed_count"] == 1, j
    conn = store.connect(db_path)
    # contended_cpu_pct = 100: the model judged, whatever this busy machine runs (conftest)
    strict_rule = CriteriaSettings(jitter_rule="max", contended_cpu_pct=100)
    _, strict = evaluate(conn, res.run_id, strict_rule)
    conn.close()
    assert strict.get("jitter").status == "fail"  # type: ignore[union-attr]
