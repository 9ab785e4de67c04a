"""Early decisions on a contended host (issue 31): a running look of jitter, drops or
stage_trend never stops a run once a telemetry tick since the warm-up saw other processes
holding the host's CPUs, nor counts a frame before the tick that covers it has come; on a
quiet host the same faults still stop it; stage_trend stops a run whose stage slows toward
the frame budget, never a flat one. Fed to the run's own early-stop observer as a run hands
frames and samples over, and real soaks. And the verdict's frame age: a backlog that
contention built and that drains after the host went quiet is the host's (stored runs)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from types import ModuleType

import numpy as np
import pytest

from soakd.analysis.criteria import drops, jitter, stage_trend
from soakd.analysis.criteria.base import STAGE_FRAME_COLUMNS, Live, LiveHistogram, LiveTable
from soakd.analysis.model import CriterionResult
from soakd.config import CriteriaSettings
from soakd.observers.base import Progress
from soakd.records import Event, FrameRecord, Sample
from soakd.run.early_stop import EarlyStop
from soakd.run.runner import run_soak
from soakd.store import db as store

from .stored_runs import healthy, judged, store_run

#: a telemetry tick's (host_cpu_pct, soakd's cpu_pct) on 2 CPUs: others 5 % and 95 %
QUIET, BUSY = (45.0, 80.0), (100.0, 10.0)

#: frame -> its infer ms and its cumulative drop count (``_feed``)
Model = Callable[[float], tuple[float, int]]


def _watch(module: ModuleType, planned_s: float, fps: float) -> tuple[EarlyStop, list[str]]:
    """The early-stop observer a ``stop_on_fail`` run builds, asking ``module`` alone; the
    stops it asks for."""
    stops: list[str] = []
    live = Live(planned_s=planned_s, fps=fps, streams=1, cpus=2.0)
    live.stage_ms = {"infer_ms": LiveHistogram()}
    live.frames = LiveTable(STAGE_FRAME_COLUMNS, rows=8192, floor=False)
    watch = EarlyStop(live, CriteriaSettings(), [module], event=lambda e: None,
                      stop=stops.append)  # fmt: skip
    watch.on_event(Event("warmup_end", 0.0, 0.0))
    return watch, stops


def _feed(
    watch: EarlyStop, stops: list[str], model: Model, busy: Callable[[float], bool],
    until: float, fps: float,
) -> float | None:  # fmt: skip
    """Frames at ``fps`` (``model``: infer ms, cumulative drops; done infer ms after
    dispatch), a look at every whole second, and a host tick every 0.5 s at 0.25 s past
    (covering the half second before it, contended where ``busy`` says so at its middle),
    handed over once a frame at or after it has been: a look comes before the tick that
    covers its second's last frames. The time of the stop, or None."""
    tick = 0.25
    for i in range(int(until * fps) + 1):
        t = i / fps
        ms, dropped = model(t)
        watch.on_frames([FrameRecord(i, t, t, t, t + ms / 1e3, 0.0, 0.1, infer_ms=ms,
                                     total_ms=ms + 1.0, frame_age_ms=0.1,
                                     drop_count=dropped)])  # fmt: skip
        if i % round(fps) == 0 and i:
            watch.on_progress(Progress(elapsed_s=t, remaining_s=until - t, frames_done=i,
                                       frames_captured=i, achieved_fps=fps, drops=0, stale=0,
                                       errors=0, age_p50_ms=None))  # fmt: skip
            if stops:
                return t
        while tick <= t + 1e-9:
            host, own = BUSY if busy(tick - 0.25) else QUIET
            watch.on_sample(Sample(i, tick, 0.0, 0.0, 0.1,
                                   {"host_cpu_pct": host, "cpu_pct": own}))  # fmt: skip
            tick += 0.5
    return None


#: spikes (80 ms over a 10 ms model: the 5 frames from 9.8 s to 10 s) and losses (50 a
#: frame from 9.8 s on), at 20 fps
ONSET = 9.8


def _spikes(t: float) -> tuple[float, int]:
    return (80.0 if ONSET - 1e-9 <= t <= 10.0 + 1e-9 else 10.0 + (t * 7919) % 1.0), 0


def _losses(t: float) -> tuple[float, int]:
    return 10.0, 50 * max(round((t - ONSET) * 20) + 1, 0)


@pytest.mark.parametrize(("module", "model"), [(jitter, _spikes), (drops, _losses)])
def test_jitter_and_drops_stop_a_run_on_a_quiet_host_and_never_once_it_was_contended(
    module: ModuleType, model: Model
) -> None:
    """From 9.8 s of a 100 s plan at 20 fps, 5 frames spike 8-fold (jitter: 2 allowed) or
    every frame loses 50 (drops: 100 allowed): on a quiet host a look stops the run on that
    criterion by 20 s (once the tick at 10.25 s covers them); with the host contended from
    9.75 s on, no look stops it through 60 s, neither one at 10 s (the frames' tick has not
    come: they are not counted yet) nor any after it (the verdict decides)."""
    name = module.__name__.rsplit(".", 1)[1]
    watch, stops = _watch(module, 100.0, 20.0)
    at = _feed(watch, stops, model, lambda t: False, 60.0, 20.0)
    assert at is not None and 10.0 < at <= 20.0, (at, stops)
    assert len(stops) == 1 and stops[0].startswith(f"{name}: "), stops
    watch, stops = _watch(module, 100.0, 20.0)
    assert _feed(watch, stops, model, lambda t: t >= 9.75, 60.0, 20.0) is None, stops


def _infer(rise_ms_per_min: float, seed: int = 0) -> Model:
    """A 20 ms infer with 5 % noise, rising ``rise_ms_per_min``."""
    noise = np.random.default_rng(seed).normal(0.0, 0.05, 100_000)
    return lambda t: (20.0 * (1 + noise[round(t * 10)]) + rise_ms_per_min * t / 60.0, 0)


def test_a_stage_slowing_toward_the_frame_budget_stops_the_run_on_a_quiet_host() -> None:
    """Infer rising 30 ms/min (tolerance 5) from 20 ms at 10 fps, a 100 ms budget gone in
    under 3 minutes: a 5-minute plan stops on stage_trend within its first minute, the
    reason naming the stage; with one contended tick (2 s) it runs on."""
    watch, stops = _watch(stage_trend, 300.0, 10.0)
    at = _feed(watch, stops, _infer(30.0), lambda t: False, 300.0, 10.0)
    assert at is not None and at <= 60.0, (at, stops)
    assert stops[0].startswith("stage_trend: stage infer slows down: "), stops
    watch, stops = _watch(stage_trend, 300.0, 10.0)
    assert _feed(watch, stops, _infer(30.0), lambda t: 1.0 <= t < 2.0, 300.0, 10.0) is None


@pytest.mark.parametrize("seed", range(3))
def test_a_flat_stage_never_stops_the_run(seed: int) -> None:
    """The same 20 ms infer, flat, through the whole 5-minute plan (30 looks): no stop."""
    watch, stops = _watch(stage_trend, 300.0, 10.0)
    assert _feed(watch, stops, _infer(0.0, seed), lambda t: False, 300.0, 10.0) is None, stops


def test_a_stage_look_on_too_few_windows_to_test_stops_nothing() -> None:
    """At 1 fps (windows of 5 frames) a 20 ms infer with 20 % noise, rising 30 ms/min: the
    looks at 10 s and 20 s have 2 and 4 windows, too few to test a trend, whose range allows
    more than the tolerance: n/a, which stops nothing."""
    noise = np.random.default_rng(0).normal(0.0, 0.2, 100)
    watch, stops = _watch(stage_trend, 100.0, 1.0)
    model: Model = lambda t: (20.0 * (1 + noise[round(t)]) + 0.5 * t, 0)  # noqa: E731
    assert _feed(watch, stops, model, lambda t: False, 20.0, 1.0) is None, stops
    assert watch.live.looked["stage_trend"] == pytest.approx(0.2), watch.live.looked


def _early_stops(db: str) -> list[tuple[str, float]]:
    """The run's early_stop events: (criterion, t)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT json_extract(data, '$.criterion'), t FROM events WHERE kind = 'early_stop'"
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


@pytest.mark.slow
def test_a_slowing_model_s_real_soak_stops_early_on_stage_trend_and_fails(synthetic) -> None:
    """A real soak whose infer drifts 300 ms/min from 10 ms at 10 fps (a 30 s plan,
    ``stop_on_fail``, contention off as the suite's soaks have it): stage_trend stops it
    within 20 s, and the verdict confirms it (FAIL, stopped early)."""
    res = run_soak(synthetic(
        "run.stop_on_fail=true", "run.duration=30", "run.fps=10", "workload.infer_ms=10",
        "workload.pre_ms=0", "workload.decode_ms=0", "workload.drift_ms_per_min=300",
        "criteria.max_memory_growth_mb_per_min=1000",
    ))  # fmt: skip
    stops = _early_stops(synthetic().run.db)
    assert [c for c, _ in stops] == ["stage_trend"] and stops[0][1] < 20, (stops, res.reason)
    assert res.verdict.status == "FAIL", res.verdict.reason
    assert res.verdict.reason.startswith("stage_trend: stage infer slows down: ")
    assert res.verdict.reason.endswith("(stopped early)"), res.verdict.reason


#: a spinner: a busy loop that ends itself after 60 s (the test also ends it)
_SPIN = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass"


@pytest.mark.slow
def test_a_healthy_soak_beside_cpu_spinners_is_never_stopped_early_by_the_host(
    synthetic,
) -> None:
    """A healthy 0.5 ms CPU-bound model at 50 fps (jitter k = 3, drops allowed 0.1 %), soaked
    15 s with ``stop_on_fail`` at the default ``contended_cpu_pct`` while three spinners per
    CPU hold the host: no look stops it on jitter, drops, frame_age or stage_trend, and
    jitter does not FAIL (the verdict: INVALID "the host was contended", or PASS)."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(3 * (os.cpu_count() or 1))
    ]
    try:
        res = run_soak(synthetic(
            "run.stop_on_fail=true", "run.duration=15", "run.fps=50", "workload.cpu_bound=true",
            "workload.infer_ms=0.5", "workload.pre_ms=0", "workload.decode_ms=0",
            "workload.jitter=0.05", "criteria.jitter_k=3", "criteria.max_drop_fraction=0.001",
            "criteria.max_memory_growth_mb_per_min=1000", "criteria.contended_cpu_pct=75",
        ))  # fmt: skip
    finally:
        for s in spinners:
            s.kill()
        for s in spinners:
            s.wait(10)
    host = {"jitter", "drops", "frame_age", "stage_trend"}
    assert not host & {c for c, _ in _early_stops(synthetic().run.db)}, res.verdict.reason
    # drops may still FAIL at the end on the ticks the pacer missed (soakd did not run on
    # time), which the verdict never excuses; the spikes the host made are not the model's
    j = res.verdict.get("jitter")
    assert j is not None and j.status != "fail", j


# ------------------------------------------------- a backlog draining after contention

DUR, FPS = 120.0, 10.0


def _queue(slow: tuple[float, float], quiet_ms: float = 80.0, slow_ms: float = 250.0) -> dict:
    """A healthy run's columns with its frames through one first-in-first-out queue
    (``consume = "oldest"``) at 10 fps: each takes ``quiet_ms``, or ``slow_ms`` when
    dispatched within ``slow`` (s): a backlog builds there and drains for about half a
    minute after it. Ages, stage times and queue lengths as the queue makes them."""
    cols = healthy(DUR, FPS, 5.0)
    cap = np.asarray(cols["t_capture"], dtype=float)
    done, age, service = 0.0, np.empty(cap.size), np.empty(cap.size)
    for i, c in enumerate(cap):
        d = max(c, done)
        service[i] = slow_ms if slow[0] <= d < slow[1] else quiet_ms
        age[i], done = (d - c) * 1e3, d + service[i] / 1e3
    disp = cap + age / 1e3
    cols["frame_age_ms"], cols["infer_ms"] = age, service - 2.5
    cols["total_ms"] = service
    cols["queue_len"] = np.array([int(np.sum((cap[:i] < c) & (disp[:i] > c)))
                                  for i, c in enumerate(cap)])  # fmt: skip
    return cols


def _ticks(busy: tuple[float, float]) -> list[Sample]:
    """Host ticks every 0.5 s on 1 CPU: other processes at 95 % in ``busy`` (s), else 10 %."""
    out = []
    for i, t in enumerate(np.arange(0.5, DUR + 0.5, 0.5)):
        host = 100.0 if busy[0] <= t - 0.25 < busy[1] else 20.0
        values = {"rss_bytes": 400 << 20, "host_cpu_pct": host, "cpu_pct": 5.0,
                  "server_cpu_pct": 5.0}  # fmt: skip
        out.append(Sample(i, float(t), 0.0, 0.0, 0.1, values))
    return out


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    c = store.connect(tmp_path_factory.mktemp("backlog") / "runs.db")
    yield c
    c.close()


def _age(conn: sqlite3.Connection, rid: str, slow: tuple[float, float],
         busy: tuple[float, float]) -> CriterionResult:  # fmt: skip
    """The frame_age of a stored run of ``_queue(slow)`` with the host contended in
    ``busy``, judged as ``soakd gate`` judges it (p95 limit 1 s, the default 75 %)."""
    store_run(conn, rid, _queue(slow), crit={"max_age_p95_ms": 1000.0}, dur=DUR, fps=FPS,
              run={"consume": "oldest"}, samples=_ticks(busy),
              environment={"cpu_count": 1})  # fmt: skip
    got = judged(conn, rid).get("frame_age")
    assert got is not None
    return got


def test_a_backlog_draining_after_contention_is_the_host_s_not_the_model_s(conn) -> None:
    """Other processes hold the host from 40 s to 55 s and the frames take 250 ms instead
    of 80 ms there: the backlog drains until about 90 s, its frames waiting on a quiet
    host behind the ones contention queued. Their ages are the host's: frame_age is INVALID
    "the host was contended", the drained frames counted contended, never FAIL."""
    age = _age(conn, "drain", (40.0, 55.0), (40.0, 55.0))
    assert age.status == "invalid", age.detail
    assert age.detail.startswith("the host was contended: "), age.detail
    assert "or queued behind frames that did (" in age.detail, age.detail
    cn = age.evidence["contention"]
    assert cn["frames_behind"] > 300 and not cn["quiet_fails"], cn


def test_the_same_backlog_on_a_quiet_host_or_after_the_queue_drained_fails(conn) -> None:
    """The same slowdown with the host quiet throughout FAILs frame_age; and with the host
    contended from 10 s to 20 s instead (the queue empty again long before 40 s: the chain
    of queued frames ends), the backlog is still the model's: FAIL."""
    assert _age(conn, "quiet", (40.0, 55.0), (0.0, 0.0)).status == "fail"
    early = _age(conn, "early", (40.0, 55.0), (10.0, 20.0))
    assert early.status == "fail", early.detail
    assert early.evidence["contention"]["frames_contended"] < 120, early.evidence["contention"]
