"""The looks' alpha spending lets a default ``duration = "auto"`` run (``max_duration = 1h``)
stop a 5 MB/min leak within 5 minutes (issue 31; O'Brien–Fleming over the planned hour
spent next to nothing before minute 6): the schedule itself, through the run's own
early-stop observer fed a leak as the synthetic workload plants it, and one real soak."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable

import numpy as np
import pytest

from soakd.analysis import stats
from soakd.analysis.criteria.base import look_alpha
from soakd.config import Settings, load_settings
from soakd.observers.base import Progress
from soakd.records import Event, Sample
from soakd.run.early_stop import EarlyStop, watch_early_stop
from soakd.run.runner import run_soak

MIB = 2**20
WARMUP_S = 5.0


def _rss(t: np.ndarray, mb_per_min: float, seed: int) -> np.ndarray:
    """RSS as the synthetic workload leaks it (whole 1 MiB chunks, a staircase) over 400 MB,
    with 0.3 MB of noise a sample."""
    steps = np.floor(mb_per_min * t / 60.0) * MIB
    return 400e6 + steps + np.random.default_rng(seed).normal(0.0, 0.3e6, t.size)


def _watch(fired: list[str]) -> EarlyStop:
    """The early stop a default ``duration = "auto"`` run builds (max_duration 1 h)."""
    settings = load_settings(overrides=["run.duration='auto'"])
    assert settings.run.duration == 3600.0 and settings.run.stop_on_fail
    [watch] = watch_early_stop(settings, lambda e: None, fired.append)
    assert isinstance(watch, EarlyStop)
    return watch


def _feed(watch: EarlyStop, mb_per_min: float, until_s: float, seed: int = 0) -> float | None:
    """Samples every 150 ms and a progress tick every second, as a run hands them over;
    the time of the early stop, or None."""
    watch.on_event(Event("warmup_end", WARMUP_S, 0.0))
    t = np.arange(WARMUP_S, until_s, 0.15)
    y = _rss(t, mb_per_min, seed)
    tick = WARMUP_S + 1.0
    for i, (ti, yi) in enumerate(zip(t, y, strict=True)):
        watch.on_sample(Sample(i, float(ti), 0.0, 0.0, 0.0, {"rss_bytes": float(yi)}))
        if ti >= tick:
            watch.on_progress(Progress(elapsed_s=float(ti), remaining_s=3600.0 - ti,
                                       frames_done=0, frames_captured=0, achieved_fps=10.0,
                                       drops=0, stale=0, errors=0, age_p50_ms=None))  # fmt: skip
            tick += 1.0
            if watch.fired is not None:
                return float(ti)
    return None


def test_a_5_mb_per_min_leak_stops_a_default_auto_run_within_5_minutes() -> None:
    """Fed a 5 MB/min leak, the early stop of a default auto run fires within 5 minutes,
    on memory_rss (it fires at about 70 s)."""
    fired: list[str] = []
    watch = _watch(fired)
    at = _feed(watch, 5.0, 300.0)
    assert at is not None and at <= 300.0 and len(fired) == 1, (at, fired)
    assert watch.fired is not None and watch.fired.criterion == "memory_rss"


@pytest.mark.parametrize("minute", [2, 3, 4, 5])
def test_the_boundary_at_minutes_2_to_5_of_a_1_hour_plan_lets_a_5_mb_per_min_leak_through(
    minute: int,
) -> None:
    """The alpha a look 20 s after the last spends at minute 2..5 of a 1-hour plan is over
    the p-value the floors of a 5 MB/min leak show by then (O'Brien–Fleming's was ~1e-20
    and under)."""
    planned = 3600.0 - WARMUP_S
    now = 60.0 * minute - WARMUP_S
    alpha = look_alpha(0.01, now / planned, (now - 20.0) / planned)
    t = np.arange(WARMUP_S, 60.0 * minute, 0.15)
    win = stats.window_reduce(t, _rss(t, 5.0, minute), 4.0, t0=WARMUP_S, t1=60.0 * minute,
                              medians=False)  # fmt: skip
    has = win.nonempty()
    tr = stats.trend(win.t[has], win.floor[has], alpha)
    assert alpha > 5e-5 and tr.p < alpha and tr.rising(alpha, 1.5 * MIB / 60), (alpha, tr.p)


def test_a_flat_series_with_the_same_noise_never_stops_in_those_5_minutes() -> None:
    """The same noise without the leak, 5 seeds: no early stop."""
    for seed in range(5):
        fired: list[str] = []
        assert _feed(_watch(fired), 0.0, 300.0, seed) is None and fired == []


@pytest.mark.slow
def test_a_real_auto_run_with_max_duration_1h_stops_a_5_mb_per_min_leak(
    synthetic: Callable[..., Settings],
) -> None:
    """A real synthetic soak leaking 5 MB/min, duration = "auto" with the default
    max_duration (1 h), floor window (4 s), tolerance and alpha: the run stops early on
    memory_rss, FAIL, within 5 minutes (about 70 s). A guard ends it at 5.5 minutes."""
    s = synthetic("run.duration='auto'", "run.warmup_s=5", "criteria.min_duration_s=60",
                  "criteria.floor_window_s=4", "run.sample_interval_ms=150",
                  "workload.leak_mb_per_min=5")  # fmt: skip
    assert s.run.duration == 3600.0
    guard = threading.Event()
    timer = threading.Timer(330.0, guard.set)
    timer.start()
    try:
        res = run_soak(s, stop=guard)
    finally:
        timer.cancel()
    with sqlite3.connect(s.run.db) as conn:  # type: ignore[arg-type]
        stops = conn.execute(
            "SELECT t, json_extract(data, '$.criterion') FROM events WHERE kind = 'early_stop'"
        ).fetchall()
    assert len(stops) == 1 and stops[0][1] == "memory_rss" and stops[0][0] <= 300.0, stops
    assert res.verdict.status == "FAIL" and res.verdict.get("memory_rss").status == "fail"
