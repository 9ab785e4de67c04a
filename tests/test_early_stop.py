"""A run ends as soon as a criterion can no longer pass (``run.stop_on_fail``): real
synthetic soaks with planted errors, drops and a leak stop early as FAIL with an
``early_stop`` event naming the criterion; a healthy one runs its whole length; without the
setting nothing stops; a stop the whole run's judgement does not confirm is never PASS."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from soakd.analysis import judge
from soakd.analysis.criteria import frame_age as frame_age_criterion
from soakd.analysis.criteria import memory as memory_criterion
from soakd.analysis.criteria.base import Live, LiveTable, look_alpha, spent
from soakd.analysis.data import make_run_data
from soakd.analysis.model import RunMeta
from soakd.analysis.stats import trend
from soakd.config import CriteriaSettings, Settings
from soakd.observers.base import Progress
from soakd.records import Event
from soakd.run.early_stop import EarlyStop, early_criteria
from soakd.run.runner import run_soak

pytestmark = pytest.mark.slow


def _soak(synthetic: Callable[..., Settings], *sets: str) -> tuple[Any, list[tuple[Any, ...]]]:
    res = run_soak(synthetic("run.stop_on_fail=true", *sets))
    with sqlite3.connect(synthetic().run.db) as conn:
        events = conn.execute(
            "SELECT kind, t, json_extract(data, '$.criterion') FROM events"
            " WHERE kind = 'early_stop'"
        ).fetchall()
    return res, events


def test_errors_past_their_budget_stop_the_run_at_the_next_look(synthetic) -> None:
    """Every infer raising, max_errors 0: a 30 s run stops within a few seconds of the
    warm-up, FAIL, its early_stop event and the verdict naming errors."""
    res, events = _soak(synthetic, "run.duration=30", "workload.error_every=1")
    assert res.status == "aborted" and res.duration_s < 8, res.reason
    assert [e[2] for e in events] == ["errors"]
    assert res.verdict.status == "FAIL" and int(res.exit_code) == 1
    assert res.verdict.reason.startswith("errors: ") and "(stopped early)" in res.verdict.reason


def test_drops_past_the_limit_of_the_planned_run_stop_it(synthetic) -> None:
    """A 150 ms model at 20 fps loses most ticks: once the losses pass 1 % of every tick
    the 30 s run can have, it stops, FAIL on drops."""
    res, events = _soak(synthetic, "run.duration=30", "workload.infer_ms=150")
    assert res.status == "aborted" and res.duration_s < 10, res.reason
    assert [e[2] for e in events] == ["drops"]
    assert res.verdict.status == "FAIL" and res.verdict.get("drops").status == "fail"


def test_a_fast_leak_stops_the_run_at_a_look_that_has_spent_little_alpha(synthetic) -> None:
    """600 MB/min planted, 0.25 s floor windows (a look every 1.25 s): the 40 s run stops
    at under half its length, FAIL on memory_rss, the event naming it."""
    res, events = _soak(
        synthetic,
        "run.duration=40",
        "workload.leak_mb_per_min=600",
        "criteria.floor_window_s=0.25",
        "criteria.max_memory_growth_mb_per_min=5",
    )
    assert res.status == "aborted" and res.duration_s < 20, res.reason
    assert [e[2] for e in events] == ["memory_rss"]
    assert res.verdict.status == "FAIL" and res.verdict.get("memory_rss").status == "fail"


def test_a_growing_backlog_stops_the_run_on_its_frame_age(synthetic) -> None:
    """Consume oldest, a 52 ms model at 20 fps, a deep queue of tiny frames: frame age
    creeps ~2 s/min while memory stays flat, and the 30 s run stops at under half its
    length, FAIL on frame_age, the event naming it."""
    res, events = _soak(
        synthetic,
        "run.duration=30",
        "run.consume='oldest'",
        "run.max_queue=4096",
        "source.width=8",
        "source.height=8",
        "workload.infer_ms=50",
        "workload.pre_ms=1",
        "workload.decode_ms=1",
        "criteria.max_memory_growth_mb_per_min=1000",
    )
    assert res.status == "aborted" and res.duration_s < 15, res.reason
    assert [e[2] for e in events] == ["frame_age"]
    assert res.verdict.status == "FAIL" and res.verdict.get("frame_age").status == "fail"


def test_a_healthy_run_with_stop_on_fail_runs_its_whole_length(synthetic) -> None:
    """Nothing planted: the run completes, no early_stop event, PASS."""
    res, events = _soak(synthetic, "run.duration=4")
    assert res.status == "completed" and events == []
    assert res.verdict.status == "PASS", res.verdict.reason


def test_without_stop_on_fail_a_failing_run_runs_its_whole_length(synthetic) -> None:
    """Every infer raising, run.stop_on_fail unset (the plain ``soakd run`` default): the
    run completes its 4 s, errors FAIL, and no early_stop event is stored."""
    res = run_soak(synthetic("run.duration=4", "workload.error_every=1"))
    assert res.status == "completed" and res.duration_s >= 3.9
    assert res.verdict.get("errors").status == "fail"
    with sqlite3.connect(synthetic().run.db) as conn:
        sql = "SELECT count(*) FROM events WHERE kind = 'early_stop'"
        assert conn.execute(sql).fetchone()[0] == 0


def test_an_early_stop_the_whole_run_does_not_confirm_is_invalid_never_pass() -> None:
    """A run aborted by an early_stop event naming errors whose stored frames raised none:
    the verdict is INVALID (the run was cut short), not PASS."""
    t = [i * 0.05 for i in range(400)]
    data = make_run_data(
        RunMeta("r", status="aborted", reason="errors: ... (run.stop_on_fail)", fps=20.0,
                duration_s=20.0),
        frames={"t_capture": t, "total_ms": [10.0] * 400, "infer_ms": [8.0] * 400},
        samples={"t": t, "rss_bytes": [1e8] * 400},
        events=[{"t": 0.0, "kind": "warmup_end", "message": ""},
                {"t": 19.0, "kind": "early_stop", "message": "", "data": {"criterion": "errors"}}],
    )  # fmt: skip
    v = judge(data, CriteriaSettings(min_duration_s=1, min_frames=5))
    assert v.get("errors").status == "pass"
    assert v.status == "INVALID"


def test_the_looks_never_spend_more_than_alpha_however_many_there_are() -> None:
    """The spending function: nothing at the start, alpha at the planned end, rising all
    the way, and the looks' alphas (each the spending between two looks) add up to what
    was spent: a run looked at 1000 times still risks a false early FAIL of at most
    alpha."""
    assert spent(0.01, 0.0) == 0.0
    assert spent(0.01, 1.0) == pytest.approx(0.01)
    fractions = np.linspace(0.0, 1.0, 101)
    assert (np.diff([spent(0.01, f) for f in fractions]) > 0).all()
    looks = [i / 1000 for i in range(1001)]
    total = sum(look_alpha(0.01, b, a) for a, b in itertools.pairwise(looks))
    assert total == pytest.approx(0.01)


def test_plain_settings_default_to_running_the_whole_length(tmp_path: Path) -> None:
    """``run.stop_on_fail`` is false unless set."""
    from soakd.config import load_settings

    assert load_settings().run.stop_on_fail is False


def _leak_live(now: float, planned_s: float = 100.0) -> Live:
    """A 60 MB/min RSS rise sampled every 0.1 s from the end of the warm-up (t0 = 0) to
    ``now``, in a run planned for ``planned_s``."""
    t = np.arange(0.0, now, 0.1)
    live = Live(planned_s=planned_s, fps=10.0, streams=1, now=now, t0=0.0)
    live.samples = LiveTable(("t", "rss_bytes"))
    for ti in t:
        live.samples.append((ti, 100e6 + 1e6 * ti))
    return live


def test_a_look_early_in_the_run_spends_only_its_share_of_alpha() -> None:
    """A leak plain on 7 floor windows (significant at alpha = 0.01) does not stop a
    1000 s run at 7 s, where the spending function has spent 1.2e-4; the same leak over
    95 s of a 100 s run does, named memory_rss."""
    crit = CriteriaSettings(floor_window_s=1.0, max_memory_growth_mb_per_min=5)
    early = _leak_live(7.0, planned_s=1000.0)
    t, y = early.samples_now()["t"], early.samples_now()["rss_bytes"]
    assert trend(t[::10], y[::10], 0.01).p < 0.01  # a fixed alpha would stop
    assert memory_criterion.early_fail(early, crit) is None
    late = memory_criterion.early_fail(_leak_live(95.0), crit)
    assert late is not None and late.criterion == "memory_rss", late


def _age_live(now: float, slope_ms_per_s: float, planned_s: float = 100.0) -> Live:
    """Frames at 10 fps from the end of the warm-up (t0 = 0) to ``now``, their age 20 ms
    plus ``slope_ms_per_s`` per second and a little noise, added one by one."""
    live = Live(planned_s=planned_s, fps=10.0, streams=1, now=now, t0=0.0)
    rng = np.random.default_rng(0)
    for t in np.arange(0.0, now, 0.1):
        live.add_age(float(t), 20.0 + slope_ms_per_s * t + rng.normal(0, 2.0))
    return live


def test_live_frame_age_keeps_one_median_per_closed_window() -> None:
    """95 s of frames in 1 s windows (10 frames each at 10 fps): 94 closed windows, each
    kept as its centre and median, the open one not yet."""
    live = _age_live(95.0, 0.0)
    assert live.age_window_s == 1.0
    assert len(live.age_t) == len(live.age_ms) == 94
    assert live.age_t[:2] == [0.5, 1.5]
    assert abs(np.median(live.age_ms) - 20.0) < 1.0


def test_a_creeping_frame_age_stops_the_run_only_at_a_look_with_enough_alpha() -> None:
    """Age rising 120 ms/min, plain on 8 windows (significant at alpha = 0.01): not at 9 s
    of a 100 s run (the spending function has spent 1.4e-3 by then), but at 50 s, named
    frame_age; a flat age never, nor a rise under max_age_slope_ms_per_min."""
    crit = CriteriaSettings()
    early = _age_live(9.0, 2.0)
    tr = trend(np.asarray(early.age_t), np.asarray(early.age_ms), crit.alpha)
    assert tr.rising(crit.alpha, crit.max_age_slope_ms_per_min / 60)  # a fixed alpha stops
    assert frame_age_criterion.early_fail(early, crit) is None
    late = frame_age_criterion.early_fail(_age_live(50.0, 2.0), crit)
    assert late is not None and late.criterion == "frame_age", late
    assert frame_age_criterion.early_fail(_age_live(95.0, 0.0), crit) is None
    assert frame_age_criterion.early_fail(_age_live(95.0, 0.5), crit) is None  # 30 ms/min


def test_a_generator_is_never_stopped_on_frame_age() -> None:
    """A generator's frames are judged on their output intervals: its frame age is not
    asked, however it rises."""
    live = _age_live(95.0, 2.0)
    live.generates = True
    assert frame_age_criterion.early_fail(live, CriteriaSettings()) is None


def test_an_oom_event_stops_the_run_at_the_next_look() -> None:
    """One ``oom`` event after the warm-up: the next progress snapshot stores an early_stop
    event naming oom and asks the run to stop."""
    fired: list[str] = []
    events: list[Event] = []
    crit = CriteriaSettings()
    watch = EarlyStop(Live(planned_s=60.0, fps=10.0, streams=1), crit, early_criteria(True),
                      event=events.append, stop=fired.append)  # fmt: skip
    watch.on_event(Event("warmup_end", 1.0, 0.0))
    tick = Progress(elapsed_s=3.0, remaining_s=57.0, frames_done=20, frames_captured=20,
                    achieved_fps=10.0, drops=0, stale=0, errors=0, age_p50_ms=None)  # fmt: skip
    watch.on_progress(tick)
    assert fired == []
    watch.on_event(Event("oom", 2.5, 0.0, "CUDA out of memory"))
    watch.on_progress(tick)
    assert len(fired) == 1 and fired[0].startswith("oom: 1 out-of-memory error(s)")
    assert [(e.kind, (e.data or {}).get("criterion")) for e in events] == [("early_stop", "oom")]
