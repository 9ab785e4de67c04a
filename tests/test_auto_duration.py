"""``run.duration = "auto"``: a soak runs until every criterion is decided, at most
``run.max_duration``. Real synthetic soaks: a healthy one stops once its trends could have
seen their tolerances and PASSes saying when and what it could see; a leak stops early as
FAIL; one that cannot decide by max_duration is INVALID, never PASS."""

from __future__ import annotations

import io
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import structlog
from rich.console import Console

from soakd.analysis import evaluate, judge
from soakd.analysis.criteria.base import undecided
from soakd.config import CriteriaSettings, Settings, load_settings
from soakd.observers.base import Progress, RunInfo
from soakd.observers.display import LiveDisplay
from soakd.observers.logs import FrameLogObserver
from soakd.records import DECIDED, LOOK_EVENT, UNDECIDED, Event, Standing, standings
from soakd.report.html import render_html
from soakd.run.runner import run_soak
from soakd.store.db import connect

from .test_verdict import MIB, planted

pytestmark = pytest.mark.slow

#: short floor windows so that a few seconds hold enough of them to decide
AUTO = (
    "run.duration='auto'", "run.warmup_s=1", "criteria.min_duration_s=4",
    "criteria.min_frames=20", "criteria.floor_window_s=0.25",
)  # fmt: skip


def _events(settings: Settings, kind: str) -> list[tuple[float, str]]:
    with sqlite3.connect(settings.run.db) as conn:  # type: ignore[arg-type]
        return conn.execute("SELECT t, message FROM events WHERE kind = ?", (kind,)).fetchall()


def test_a_healthy_auto_run_stops_once_decided_and_says_when_and_what_it_could_see(
    synthetic: Callable[..., Settings],
) -> None:
    """No leak (a tolerance of 60 MB/min, which a few seconds can decide): the run stops
    long before its 60 s max_duration, completed, PASS, with a decided event, and the run
    criterion says "decided after ..." with the slope each trend could see."""
    s = synthetic(*AUTO, "run.max_duration=60", "criteria.max_memory_growth_mb_per_min=60")
    res = run_soak(s)
    # before max_duration, by deciding (a loaded host's noise takes longer to decide: the
    # rule is the decided event, not how fast)
    assert res.status == "completed" and res.duration_s < 60, res.reason
    assert res.verdict.status == "PASS", res.verdict.reason
    assert len(_events(s, "decided")) == 1
    run = res.verdict.get("run")
    assert run is not None and "decided after" in run.detail, run
    assert "memory_rss could see" in run.detail and "MB/min" in run.detail, run.detail
    looks = _looks(s)
    assert looks and all(t >= 4.0 for t, _ in looks)  # from criteria.min_duration_s on
    last = looks[-1][1]
    assert all(st.state == DECIDED for st in last), last
    mem = next(st for st in last if st.criterion == "memory_rss")
    assert mem.tolerance == 60 and mem.unit == "MB/min" and mem.detectable is not None
    assert mem.detectable <= 60
    html = _report(s, res.run_id)  # the looks drawn against the tolerance
    panel = html[html.index('data-panel="convergence"') :].split("</svg>")[0]
    note = html[html.index('id="convergence-note"') :].split("</p>")[0].split(">", 1)[1]
    assert "decided below 1" in panel and "every criterion decided at the last look" in note
    # memory_rss is a line, a mark when one look saw it (both carry data-series), or, at 0
    # x tolerance at every look (its windows did not vary), named under the panel instead
    ratios = [
        st.detectable / st.tolerance
        for _, stands in looks
        for st in stands
        if st.criterion == "memory_rss" and st.tolerance and st.detectable is not None
    ]
    assert ratios
    if max(ratios) == 0:
        assert 'data-series="memory_rss"' not in panel, panel
        flat = note.split(": 0 x tolerance at every look")[0]
        assert "memory_rss" in flat.split(", ") and "not drawn" in note, note
    else:
        drawn = '<g class="series" data-series="memory_rss"' if len(ratios) == 1 else (
            '<path class="series" data-series="memory_rss"'
        )  # fmt: skip
        assert drawn in panel, panel


def _report(settings: Settings, run_id: str) -> str:
    conn = connect(str(settings.run.db), readonly=True)
    try:
        data, verdict = evaluate(conn, run_id)
    finally:
        conn.close()
    return render_html(data, verdict)


def _looks(settings: Settings) -> list[tuple[float, list[Standing]]]:
    with sqlite3.connect(settings.run.db) as conn:  # type: ignore[arg-type]
        rows = conn.execute("SELECT t, data FROM events WHERE kind = 'look' ORDER BY t")
        return [(t, standings(json.loads(data))) for t, data in rows]


def test_the_live_display_and_the_log_lines_show_each_look(
    synthetic: Callable[..., Settings],
) -> None:
    """A real auto run's looks, fed to the live display (80 columns) and the log-line
    observer as the run feeds them: each criterion decided or not, with the smallest growth
    each trend could see beside its tolerance, as the last look found them; the progress
    lines after a look name what the run still waits on. (Whether this in-process run's
    RSS, the pytest worker's, is decided in time is not this test's business.)"""
    s = synthetic(*AUTO, "run.max_duration=30", "criteria.max_memory_growth_mb_per_min=60")
    live = Console(file=io.StringIO(), width=80)
    display, logs = LiveDisplay(live), FrameLogObserver(every=0, progress_every_s=1.0)
    with structlog.testing.capture_logs() as lines:
        res = run_soak(s, observers=[display, logs])
    shown = Console(file=io.StringIO(), record=True, width=80)  # the last look alone
    shown.print(display._render(_snapshot(res.duration_s)))
    rows = {ln.split()[0]: ln for ln in shown.export_text().splitlines() if ln.strip()}
    look = [x for x in lines if x["event"] == "look"]
    assert look and rows["look"].startswith("look at 0:"), rows
    last = look[-1]
    for name, state in last["standing"].items():  # the table is the last look's
        assert rows[name].split()[1] == state, (name, rows[name])
    assert last["standing"]["frame_age"] == "decided"
    assert "ms/min (tolerance 50)" in rows["frame_age"], rows["frame_age"]
    assert last["could_see"]["frame_age"].endswith("ms/min (tolerance 50)")
    assert last["waiting_on"] == [n for n, st in last["standing"].items() if st != "decided"]
    after = lines[lines.index(look[0]) :]  # logged after the first look came back
    assert all("waiting_on" in x for x in after if x["event"] == "progress")


def _snapshot(t: float) -> Progress:
    return Progress(elapsed_s=t, remaining_s=0.0, frames_done=100, frames_captured=100,
                    achieved_fps=20.0, drops=0, stale=0, errors=0, age_p50_ms=1.0)  # fmt: skip


def test_an_undecided_criterion_is_shown_with_why() -> None:
    """A look that still waits on memory_rss: the display names it undecided, what it could
    see and why; before the first look it says when that comes; a run of fixed length shows
    no looks."""
    auto = load_settings(overrides=["run.duration='auto'", "criteria.min_duration_s=90"])
    data = {"criteria": [Standing("memory_rss", UNDECIDED, 3.2, 1.5, "MB/min",
                                  "too short to judge").as_row()]}  # fmt: skip
    texts = []
    for settings, event in ((auto, None), (auto, data), (load_settings(), data)):
        con = Console(file=io.StringIO(), record=True, width=80)
        d = LiveDisplay(con)
        d.info = RunInfo("r", settings, Path("x.db"), "h")
        if event is not None:
            d.on_event(Event(LOOK_EVENT, 95.0, 0.0, "waiting on memory_rss", data=event))
        con.print(d._render(_snapshot(100.0)))
        texts.append(con.export_text())
    assert "the first look at 1:30" in texts[0]
    row = next(line for line in texts[1].splitlines() if line.startswith("memory_rss"))
    assert row.split()[1] == "undecided" and "3.2 MB/min (tolerance 1.5)" in row, texts[1]
    assert "too short to judge" in row
    assert "look" not in texts[2] and "memory_rss" not in texts[2]


def test_a_run_of_fixed_length_has_no_convergence_panel(
    synthetic: Callable[..., Settings],
) -> None:
    """The HTML report draws the looks of a duration = "auto" run only."""
    fixed = synthetic("run.duration=2")
    assert 'data-panel="convergence"' not in _report(fixed, run_soak(fixed).run_id)


def test_a_leaking_auto_run_fails_early(synthetic: Callable[..., Settings]) -> None:
    """A 600 MB/min leak: duration = "auto" turns stop_on_fail on, so the run stops at a
    look long before max_duration, FAIL on memory_rss, with an early_stop event."""
    s = synthetic(*AUTO, "run.max_duration=60", "workload.leak_mb_per_min=600",
                  "criteria.max_memory_growth_mb_per_min=5")  # fmt: skip
    res = run_soak(s)
    assert res.status == "aborted" and res.duration_s < 40, res.reason
    assert res.verdict.status == "FAIL", res.verdict.reason
    assert res.verdict.get("memory_rss").status == "fail"
    assert len(_events(s, "early_stop")) == 1 and not _events(s, "decided")


def test_an_auto_run_that_cannot_decide_by_max_duration_is_invalid_never_pass(
    synthetic: Callable[..., Settings],
) -> None:
    """A memory tolerance of 0.001 MB/min under an 8 MB, 0.7 s sawtooth, which 8 s cannot
    resolve (stop_on_fail off, so nothing stops it early): the run goes to its
    max_duration, never decided, and its memory trend is INVALID or FAIL, never PASS. (An
    RSS with not a page of change would be decided: nothing could hide 0.001 MB/min.)"""
    s = synthetic(*AUTO, "run.max_duration=8", "criteria.max_memory_growth_mb_per_min=0.001",
                  "run.stop_on_fail=false", "workload.sawtooth_mb=8",
                  "workload.sawtooth_period_s=0.7")  # fmt: skip
    res = run_soak(s)
    assert res.status == "completed" and res.duration_s >= 7.9 and not _events(s, "decided")
    mem = res.verdict.get("memory_rss")
    assert mem is not None and mem.status in ("invalid", "fail"), mem
    if mem.status == "invalid":  # too few effective windows to test, to decide, or to show
        # that a rise which stopped stays level
        assert mem.detail.startswith(("undecided", "untested", "still settling")), mem.detail
    assert res.verdict.status in ("INVALID", "FAIL")  # never PASS


def test_duration_auto_is_max_duration_with_stop_on_fail_unless_set_false() -> None:
    """``run.duration = "auto"`` plans ``max_duration`` and turns stop_on_fail on; a config
    that sets stop_on_fail false keeps it false; a later numeric duration is a fixed run."""
    s = load_settings(overrides=["run.duration='auto'", "run.max_duration='20m'"])
    assert (s.run.duration, s.run.auto_duration, s.run.stop_on_fail) == (1200.0, True, True)
    s = load_settings(overrides=["run.duration='auto'", "run.stop_on_fail=false"])
    assert (s.run.auto_duration, s.run.stop_on_fail) == (True, False)
    s = load_settings(overrides=["run.duration='auto'"], flags={"run.duration": 30.0})
    assert (s.run.duration, s.run.auto_duration) == (30.0, False)


def test_a_look_waits_on_every_criterion_that_is_not_pass_but_the_run_itself() -> None:
    """The run's own validity (a running run is never complete) is not waited on; a FAIL,
    an INVALID (an undecided trend) is; PASS and n/a are decided."""
    statuses = [("run", "invalid"), ("drops", "pass"), ("memory_gpu", "n/a"),
                ("memory_rss", "invalid"), ("jitter", "fail")]  # fmt: skip
    assert undecided(statuses) == ["memory_rss", "jitter"]


def test_a_flat_but_noisy_trend_passes_a_fixed_run_and_is_undecided_in_an_auto_one() -> None:
    """The same 60 s of a flat RSS too noisy to see 1.5 MB/min, its slopes under it: PASS
    on a fixed-length run (not significant), INVALID "undecided" on a duration = "auto"
    one (it could not have seen the tolerance)."""

    def noisy(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return 400 * MIB + rng.normal(0, 6 * MIB, t.size)

    crit = CriteriaSettings(min_duration_s=10, floor_window_s=2)
    data = planted(dur=60.0, rss=noisy, seed=1)
    assert judge(data, crit).get("memory_rss").status == "pass"  # type: ignore[union-attr]
    data.meta.config = {"run": {"auto_duration": True}}
    mem = judge(data, crit).get("memory_rss")
    assert mem is not None and mem.status == "invalid" and mem.detail.startswith("undecided")


def test_a_run_stopped_as_decided_is_not_undecided_by_the_second_after_the_look() -> None:
    """The flat noisy run of the test above, stopped by a look that found it decided (a
    ``decided`` event): the final judgement keeps memory_rss PASS."""

    def noisy(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return 400 * MIB + rng.normal(0, 6 * MIB, t.size)

    data = planted(dur=60.0, rss=noisy, seed=1)
    data.meta.config = {"run": {"auto_duration": True}}
    data.events = [*data.events, {"t": 59.0, "kind": "decided", "message": "", "data": {}}]
    mem = judge(data, CriteriaSettings(min_duration_s=10, floor_window_s=2)).get("memory_rss")
    assert mem is not None and mem.status == "pass", mem


def test_the_progress_lines_after_a_look_name_what_the_run_waits_on() -> None:
    """Before any look a progress line says nothing of it; after a look waiting on
    memory_rss, each says ``waiting_on: ["memory_rss"]``."""
    logs = FrameLogObserver(every=0, progress_every_s=1.0)
    data = {"criteria": [Standing("memory_rss", UNDECIDED, 3.2, 1.5, "MB/min", "").as_row(),
                         Standing("drops", DECIDED).as_row()]}  # fmt: skip
    with structlog.testing.capture_logs() as lines:
        logs.on_progress(_snapshot(2.0))
        logs.on_event(Event(LOOK_EVENT, 2.5, 0.0, "waiting on memory_rss", data=data))
        logs.on_progress(_snapshot(3.0))
    before, look, after = lines
    assert "waiting_on" not in before and look["event"] == "look"
    assert look["could_see"] == {"memory_rss": "3.2 MB/min (tolerance 1.5)"}
    assert after["event"] == "progress" and after["waiting_on"] == ["memory_rss"]
