"""Stopping a run early and ``run.duration = "auto"`` pinned at their boundaries (issue 35):
the looks' alpha spending and each criterion's record of it, each early_fail limit on both
sides (fed to the run's own early-stop observer as a run hands frames and samples over),
which events mean decided or stopped (on runs written through the store and judged, a
duration = "auto" look judging a stored run in its own process, and one real soak).
bench/mutants/early_auto.py's mutants name this file."""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from soakd.analysis.criteria import drops, errors, frame_age, memory, oom
from soakd.analysis.criteria.base import Live, LiveTable
from soakd.analysis.criteria.validity import convergence
from soakd.config import CriteriaSettings, Settings, load_settings
from soakd.observers.base import Progress, RunInfo
from soakd.records import FAILING, LOOK_EVENT, Event, FrameRecord, Sample, ServerMetric, standings
from soakd.run.auto_duration import AutoDuration, _judge_here, look_event
from soakd.run.early_stop import EarlyStop, watch_early_stop
from soakd.run.runner import run_soak
from soakd.store import db as store

from .stored_runs import MIB, healthy, judged, store_run

# --------------------------------------------------------------------------- the looks


def _looks(live: Live, names: tuple[str, ...], every_s: float, until: float) -> dict[str, list]:
    """Each criterion asking for a look at every whole second from the warm-up's end to
    ``until``: the (time, alpha) of each look it was given."""
    got: dict[str, list] = {n: [] for n in names}
    assert live.t0 is not None
    for now in np.arange(live.t0, until + 1.0, 1.0):
        live.now = float(now)
        for n in names:
            a = live.look(n, every_s, 0.01)
            if a is not None:
                got[n].append((live.now, a))
    return got


def _pocock(alpha: float, fraction: float) -> float:
    """docs/verdict.md's spending function: alpha x ln(1 + (e - 1) t)."""
    return alpha * math.log1p((math.e - 1.0) * fraction)


def test_each_criterion_looks_every_every_s_from_the_warm_up_s_end_until_the_planned_end() -> None:
    """A 64 s measured plan after a 4 s warm-up, a look every 8 s: each criterion is given
    its own looks at 12, 20 .. 60 s (exactly 8 s apart, counted from its last look), none at
    or past the planned end, whatever the other criteria looked at."""
    live = Live(planned_s=68.0, fps=10.0, streams=1, t0=4.0)
    got = _looks(live, ("memory", "frame_age"), 8.0, 80.0)
    assert [t for t, _ in got["memory"]] == [12.0, 20.0, 28.0, 36.0, 44.0, 52.0, 60.0]
    assert got["frame_age"] == got["memory"]


def test_a_look_spends_the_pocock_increment_since_its_last_and_the_looks_add_up() -> None:
    """The looks of one criterion over the same plan: the first at 1/8 of the measured run
    spends Pocock's alpha x ln(1 + (e - 1) / 8), each later one what the spending function
    spends since the previous, and all of them together what it has spent by the last."""
    live = Live(planned_s=68.0, fps=10.0, streams=1, t0=4.0)
    looks = _looks(live, ("memory",), 8.0, 80.0)["memory"]
    fractions = [(t - 4.0) / 64.0 for t, _ in looks]
    assert looks[0][1] == pytest.approx(_pocock(0.01, 0.125), rel=1e-9)
    for f0, f1, (_, a) in zip([0.0, *fractions], fractions, looks, strict=False):
        assert a == pytest.approx(_pocock(0.01, f1) - _pocock(0.01, f0), rel=1e-9)
    assert sum(a for _, a in looks) == pytest.approx(_pocock(0.01, 0.875), rel=1e-9)
    assert sum(a for _, a in looks) < 0.01


def test_a_look_tests_at_most_64_windows_however_long_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/verdict.md: a look tests at most 64 windows. The 100 frame-age windows of 1000 s
    of a long run reach the frame-age trend test as 64 or fewer, and a 3 ms/s creep over
    them still stops the run."""
    from soakd.analysis import stats

    seen: list[int] = []
    real = stats.trend

    def counting(t: np.ndarray, y: np.ndarray, alpha: float = 0.01) -> stats.Trend:
        seen.append(int(np.asarray(t).size))
        return real(t, y, alpha)

    monkeypatch.setattr(stats, "trend", counting)
    live = Live(planned_s=2000.0, fps=1.0, streams=1, t0=0.0, now=1001.0)
    for t in range(1001):
        live.add_age(float(t) + 0.5, 20.0 + 3.0 * t + (t % 5))
    assert len(live.age_t) > 64
    found = frame_age.early_fail(live, CriteriaSettings())
    assert found is not None and found.criterion == "frame_age"
    assert seen and max(seen) <= 64, seen


# ------------------------------------------------------------ the running criteria's limits


def _tick(watch: EarlyStop, t: float) -> str | None:
    watch.on_progress(Progress(elapsed_s=t, remaining_s=600.0 - t, frames_done=0,
                               frames_captured=0, achieved_fps=10.0, drops=0, stale=0,
                               errors=0, age_p50_ms=None))  # fmt: skip
    return watch.fired.criterion if watch.fired else None


def _observer(planned_s: float, modules: tuple[Any, ...], crit: CriteriaSettings,
              streams: int = 1) -> tuple[EarlyStop, list[Event], list[str]]:  # fmt: skip
    """The run's early-stop observer over ``modules``, the warm-up over at 5 s."""
    events: list[Event] = []
    stopped: list[str] = []
    live = Live(planned_s=planned_s, fps=10.0, streams=streams)
    watch = EarlyStop(live, crit, modules, event=events.append, stop=stopped.append)
    watch.on_event(Event("warmup_end", 5.0, 0.0))
    return watch, events, stopped


def _frame(i: int, t: float, stream: int = 0, **kw: Any) -> FrameRecord:
    return FrameRecord(i, t, t, t, t + 0.01, 0.0, 0.1, infer_ms=10.0, total_ms=11.0,
                       frame_age_ms=1.0, stream=stream, **kw)  # fmt: skip


def _losses(watch: EarlyStop, lost: tuple[int, int]) -> str | None:
    """Two streams' warm-up frames having dropped 30 each (before the warm-up's end), then
    one measured frame each with ``lost`` more dropped since: what a look stops on."""
    for s in (0, 1):
        watch.on_frame(_frame(s, 4.0, s, warmup=True, drop_count=30))
    for s in (0, 1):
        watch.on_frame(_frame(2 + s, 5.5, s, drop_count=30 + lost[s]))
    return _tick(watch, 6.0)


@pytest.mark.parametrize(("lost", "stops"), [((60, 41), False), ((60, 42), True)])
def test_drops_stop_a_run_past_max_drop_fraction_of_the_planned_run_s_ticks(
    lost: tuple[int, int], stops: bool
) -> None:
    """Two streams at 10 fps, 10 s planned after the warm-up: 2 x (100 + 1) = 202 ticks
    the whole run can have; at max_drop_fraction 0.5, 101 frames lost since the warm-up
    (the warm-up's own drops not counted, nor judged against the 4 frames seen so far) do
    not stop it, 102 do, on drops."""
    crit = CriteriaSettings(max_drop_fraction=0.5)
    watch, events, stopped = _observer(15.0, (drops,), crit, streams=2)
    assert _losses(watch, lost) == ("drops" if stops else None)
    assert len(stopped) == int(stops)
    assert [(e.data or {}).get("criterion") for e in events] == (["drops"] if stops else [])


@pytest.mark.parametrize(("raised", "stops"), [(2, False), (3, True)])
def test_errors_stop_a_run_past_max_errors_and_never_on_the_warm_up_s(
    raised: int, stops: bool
) -> None:
    """max_errors = 2: five warm-up frames raising and 2 measured ones do not stop the run;
    a third measured one does, its early_stop event naming errors at the look's time."""
    watch, events, stopped = _observer(60.0, (errors,), CriteriaSettings(max_errors=2))
    for i in range(5):
        watch.on_frame(_frame(i, 1.0 + i * 0.5, warmup=True, error="boom"))
    assert _tick(watch, 5.2) is None
    for i in range(raised):
        watch.on_frame(_frame(10 + i, 5.5 + i * 0.1, error="boom"))
    assert _tick(watch, 6.0) == ("errors" if stops else None)
    assert [(e.kind, (e.data or {}).get("criterion"), (e.data or {}).get("t")) for e in events] == (
        [("early_stop", "errors", 6.0)] if stops else []
    )
    assert len(stopped) == int(stops) and all(r.startswith("errors: ") for r in stopped)


def test_the_torch_oom_counter_stops_a_run_on_its_rise_not_its_first_reading() -> None:
    """An allocator that had counted 3 OOMs before the run does not stop it; one more OOM
    counted during the run does, on oom."""
    watch, _events, _stopped = _observer(60.0, (oom,), CriteriaSettings())
    for i, t in enumerate(np.arange(5.0, 8.0, 0.5)):
        watch.on_sample(Sample(i, float(t), 0.0, 0.0, 0.0, {"torch_ooms": 3}))
    assert _tick(watch, 8.0) is None
    watch.on_sample(Sample(10, 8.5, 0.0, 0.0, 0.0, {"torch_ooms": 4}))
    assert _tick(watch, 9.0) == "oom"


def _stop_on_fail_watch() -> EarlyStop:
    """The early stop of a 10-minute stop_on_fail run at 10 fps, warm-up over at 1 s."""
    s = load_settings(overrides=["run.stop_on_fail=true", "run.duration=600", "run.fps=10",
                                 "criteria.floor_window_s=1"])  # fmt: skip
    [watch] = watch_early_stop(s, lambda e: None, lambda r: None)
    assert isinstance(watch, EarlyStop)
    watch.on_event(Event("warmup_end", 1.0, 0.0))
    return watch


@pytest.mark.parametrize(("spikes", "stops"), [(5, False), (6, True)])
def test_jitter_stops_a_run_past_the_allowance_of_the_planned_run_not_of_the_frames_so_far(
    spikes: int, stops: bool
) -> None:
    """A 10-minute plan at 10 fps allows 5 frames over k x the median (0.1 % of its 5991
    ticks): 5 spikes of 8 x the median in the first 20 s (where 0.1 % of the 200 frames
    seen would allow 2) do not stop it by 30 s; 6 do, on jitter."""
    watch = _stop_on_fail_watch()
    rng = np.random.default_rng(1)
    at = np.linspace(20, 190, spikes).astype(int)
    got = None
    for i in range(300):
        t = 1.0 + i / 10
        ms = 80.0 if i in at else 10 + rng.gamma(2, 0.5)
        watch.on_frames([FrameRecord(i, t, t, t, t + ms / 1e3, 0.0, 0.1, infer_ms=ms,
                                     total_ms=ms + 1, frame_age_ms=0.1)])  # fmt: skip
        if i % 10 == 9:
            got = got or _tick(watch, t)
    assert got == ("jitter" if stops else None)


def test_a_look_on_too_few_windows_to_test_stops_nothing() -> None:
    """Ten seconds of an RSS flat but noisy and a served model's waiting requests swinging
    3 either way every 5 s: at the looks (6 and 11 s) too few floor windows to test either
    trend (their verdict there is INVALID, untested), and an untested trend stops nothing."""
    watch = _stop_on_fail_watch()
    rng = np.random.default_rng(3)
    fired = None
    for i, t in enumerate(1.0 + np.arange(55) / 5):
        values = {"rss_bytes": 3e8 + rng.normal(0, 5e6)}
        waiting = 5.0 + 3.0 * math.sin(2 * math.pi * (t - 1.0) / 5.0)
        metrics = (ServerMetric(i, float(t), "vllm:num_requests_waiting", "", waiting),)
        watch.on_sample(Sample(i, float(t), 0.0, 0.0, 0.0, values, server=metrics))
        if i % 5 == 0:
            fired = fired or _tick(watch, float(t))
    assert set(watch.live.looked) >= {"memory", "server_queue"}  # the looks were made
    assert fired is None


def _leak(planned_s: float) -> Live:
    """60 s of RSS rising 10 MB/min under 6 MB of noise (a floor trend of p ~ 3e-4 over
    2 s windows), looked at 60 s after the warm-up of a run planned for ``planned_s``."""
    rng = np.random.default_rng(3)
    live = Live(planned_s=planned_s, fps=10.0, streams=1, now=60.0, t0=0.0)
    live.samples = LiveTable(("t", "rss_bytes"))
    for t in np.arange(0.0, 60.0, 0.2):
        live.samples.append((t, 3e8 + 10e6 * t / 60 + rng.normal(0, 6e6)))
    return live


def test_a_memory_look_tests_the_leak_at_the_alpha_spent_by_then_not_the_full_alpha() -> None:
    """The same leak at the same first look: it stops a run planned to end at 61 s (the
    look spends 0.0099) on memory_rss, not one planned for 100000 s (it spends 1e-5)."""
    crit = CriteriaSettings(floor_window_s=2.0, max_memory_growth_mb_per_min=5)
    late = memory.early_fail(_leak(61.0), crit)
    assert late is not None and late.criterion == "memory_rss", late
    assert memory.early_fail(_leak(1e5), crit) is None


# ------------------------------------------------ decided, stopped, confirmed: stored runs


def _noisy(dur: float) -> list[Sample]:
    """Telemetry every 0.1 s: RSS flat at 400 MB with 6 MB of noise (no 60 s run can see
    1.5 MB/min in it)."""
    rng = np.random.default_rng(11)
    st = np.arange(0, dur, 0.1)
    return [Sample(i, float(t), 0.0, 0.0, 0.1,
                   {"rss_bytes": int(400 * MIB + rng.normal(0, 6 * MIB)), "cpu_pct": 50.0})
            for i, t in enumerate(st)]  # fmt: skip


AUTO_CRIT = {"min_duration_s": 10, "floor_window_s": 2, "max_memory_growth_mb_per_min": 1.5}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[sqlite3.Connection, Path]]:
    path = tmp_path_factory.mktemp("early") / "runs.db"
    c = store.connect(path)
    yield c, path
    c.close()


def _auto_run(conn: sqlite3.Connection, rid: str, *, raised: bool = False,
              events: tuple[Event, ...] = (), noisy: bool = True, **meta: Any) -> str:  # fmt: skip
    """A 60 s duration = "auto" run written through the store (warm-up 5 s), its RSS
    ``_noisy`` (undecidable) or flat; ``raised``: every 10th measured frame raised."""
    cols = healthy(60.0)
    if raised:
        err = np.full(cols["error"].size, None, dtype=object)
        err[np.flatnonzero(~cols["warmup"])[::10]] = "RuntimeError: boom"
        cols["error"] = err
    warm = (Event("warmup_end", 5.0, 0.0, "warm-up of 5 s ended"),)
    return store_run(conn, rid, cols, dur=60.0, run={"auto_duration": True},
                     crit=AUTO_CRIT if noisy else {}, samples=_noisy(60.0) if noisy else None,
                     events=(*warm, *events), **meta)  # fmt: skip


def test_an_auto_run_undecided_at_max_duration_is_invalid_and_names_what_it_waited_on(
    db: tuple[sqlite3.Connection, Path],
) -> None:
    """The noisy auto run, completed at max_duration without a decided event: memory_rss
    INVALID (undecided), never PASS, and its convergence names it."""
    v = judged(db[0], _auto_run(db[0], "undecided"))
    mem = v.get("memory_rss")
    assert mem is not None and mem.status == "invalid" and mem.detail.startswith("undecided")
    assert v.status == "INVALID"
    assert convergence(v) == "undecided at run.max_duration: memory_rss"


def test_an_early_stopped_auto_run_is_fail_confirmed_and_never_reads_as_decided(
    db: tuple[sqlite3.Connection, Path],
) -> None:
    """The noisy auto run cut short by an early stop on errors its frames confirm: FAIL
    "(stopped early)"; its undecided memory trend stays INVALID (the early stop decided
    nothing of it) and it does not read "decided after"."""
    stop = Event("early_stop", 59.0, 0.0, "errors: ... (run.stop_on_fail)",
                 data={"criterion": "errors", "t": 59.0})  # fmt: skip
    rid = _auto_run(db[0], "cut", raised=True, events=(stop,), status="aborted",
                    reason="errors: ... (run.stop_on_fail)")  # fmt: skip
    v = judged(db[0], rid)
    assert v.status == "FAIL" and v.reason.startswith("errors: "), v.reason
    assert v.reason.endswith("(stopped early)"), v.reason
    mem = v.get("memory_rss")
    assert mem is not None and mem.status == "invalid" and mem.detail.startswith("undecided")
    run = v.get("run")
    assert run is not None and "decided" not in run.detail, run.detail
    assert "decided_after_s" not in run.evidence
    assert not convergence(v).startswith("decided")


def test_a_look_shows_a_failing_criterion_as_failing(
    db: tuple[sqlite3.Connection, Path],
) -> None:
    """A look at a stored run whose errors FAIL so far: its look event stands errors
    failing (a longer run cannot undo errors, but the look does not call it decided)."""
    rid = _auto_run(db[0], "failing", raised=True)
    rows = [tuple(r) for r in _judge_here(rid, str(db[1]))]
    ev = look_event(20.0, rows, ["errors"])  # type: ignore[arg-type]
    stands = {st.criterion: st.state for st in standings(ev.data)}
    assert stands["errors"] == FAILING, stands


def _auto_looks(db: Path, rid: str, ticks: range) -> tuple[list[Event], int]:
    """A duration = "auto" run's looks (criteria.min_duration_s = 4) at one progress tick a
    second, each judging the stored run ``rid`` in its own process: the events they stored
    and how many times they stopped the run."""
    events: list[Event] = []
    stops: list[int] = []
    auto = AutoDuration(CriteriaSettings(min_duration_s=4), event=events.append,
                        stop=lambda: stops.append(1))  # fmt: skip
    auto.on_run_start(RunInfo(rid, load_settings(), db, "h"))
    for t in ticks:
        auto.on_progress(Progress(elapsed_s=float(t), remaining_s=60.0, frames_done=0,
                                  frames_captured=0, achieved_fps=10.0, drops=0, stale=0,
                                  errors=0, age_p50_ms=None))  # fmt: skip
        time.sleep(0.05)  # a tick a second, sped up: the worker takes each look in turn
    auto.on_stopping("completed")
    return events, len(stops)


@pytest.mark.slow
def test_an_auto_run_looks_from_min_duration_s_on_and_an_undecided_look_stops_nothing(
    db: tuple[sqlite3.Connection, Path],
) -> None:
    """Ticks at 0 .. 13 s of an auto run whose stored run is undecided: one look, at 4 s
    (criteria.min_duration_s; the next is 10 s later), waiting on memory_rss; no decided
    event and no stop."""
    rid = _auto_run(db[0], "looked")
    events, stops = _auto_looks(db[1], rid, range(14))
    assert [(e.kind, e.t) for e in events] == [(LOOK_EVENT, 4.0)], events
    assert events[0].message == "waiting on memory_rss"
    assert stops == 0


@pytest.mark.slow
def test_a_decided_look_stores_when_and_stops_the_run_once(
    db: tuple[sqlite3.Connection, Path],
) -> None:
    """Ticks at 0 .. 8 s of an auto run whose stored run is decided (flat RSS, far from its
    tolerance): the look at 4 s stores a decided event "after 4 s" and stops the run once;
    no look follows."""
    rid = _auto_run(db[0], "decides", noisy=False)
    events, stops = _auto_looks(db[1], rid, range(9))
    assert [(e.kind, e.t) for e in events] == [(LOOK_EVENT, 4.0), ("decided", 4.0)], events
    assert (events[1].data or {}).get("after_s") == 4.0
    assert events[1].message == "every criterion decided after 4 s"
    assert stops == 1


# --------------------------------------------------------------------------- a real soak


@pytest.mark.slow
def test_an_auto_soak_stopped_early_is_aborted_fail_and_not_decided(
    synthetic: Callable[..., Settings],
) -> None:
    """A duration = "auto" soak whose every infer raises: the early stop ends it aborted
    within seconds (not completed), FAIL on errors "(stopped early)", no decided event, and
    its verdict does not read as converged. (criteria.min_duration_s = 20: no look comes
    first.)"""
    s = synthetic(
        "run.duration='auto'",
        "run.max_duration=30",
        "workload.error_every=1",
        "criteria.min_duration_s=20",
    )
    res = run_soak(s)
    assert res.status == "aborted" and res.duration_s < 20, res.reason
    assert res.verdict.status == "FAIL" and res.verdict.reason.startswith("errors: ")
    with sqlite3.connect(s.run.db) as conn:  # type: ignore[arg-type]
        kinds = [k for (k,) in conn.execute("SELECT kind FROM events")]
    assert "early_stop" in kinds and "decided" not in kinds
    assert not convergence(res.verdict).startswith("decided")
