"""Ticks the pacer missed because soakd's process did not run on time (``pause`` events) are
the host's when other processes held its CPUs then (issue 31): drops is INVALID, never PASS
nor FAIL on them alone; the same pauses on a quiet host (a SIGSTOP) still FAIL, and so do
quiet losses over the budget beside them; a slow source's missed ticks are never excused.
Runs written through the store (tests/stored_runs.py), judged as ``soakd gate`` judges them."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from soakd.analysis import criteria_of, evaluate
from soakd.analysis.data import load_run_data
from soakd.analysis.model import CriterionResult
from soakd.records import Event, Sample
from soakd.store import db as store

from .conftest import SYNTH_CLI, soakd_cmd
from .stored_runs import HostTick, healthy, host_samples, judged, store_run

DUR, FPS, WARM, TICK = 60.0, 10.0, 5.0, 0.5
QUIET: HostTick = (20.0, 5.0, 5.0)  # others 10 %
BUSY: HostTick = (100.0, 5.0, 0.0)  # others 95 %
OWN_BUSY: HostTick = (95.0, 80.0, 5.0)  # soakd's own process (the model in it): others 10 %
#: eight pauses of 5 ticks (500 ms) each, all in the bursts: 40 of the run's 550 ticks
PAUSES = (17.0, 19.0, 21.0, 23.0, 37.0, 39.0, 41.0, 43.0)
PAUSE_TICKS = 5
#: the detail's words for them when all 40 are the host's
SET_ASIDE = "40 of the 40 tick(s) the pacer missed in pauses (0 kept as the model's)"


def _in_burst(t: np.ndarray) -> np.ndarray:
    """The second 10 s of every 20 s of the run (from the warm-up's end)."""
    return ((t - WARM) % 20.0) >= 10.0


def _samples(in_burst: HostTick) -> list[Sample]:
    """Ticks every 0.5 s, each covering the half second before it: ``in_burst`` in the
    bursts, others at 10 % elsewhere; RSS flat."""
    return host_samples(DUR, TICK, _in_burst, in_burst, QUIET)


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    c = store.connect(tmp_path_factory.mktemp("drops_pauses") / "runs.db")
    yield c
    c.close()


_made = iter(range(1000))


def _drops(
    conn: sqlite3.Connection,
    in_burst: HostTick,
    *,
    cause: str = "pause",
    quiet_drops: int = 0,
    **crit: object,
) -> CriterionResult:
    """A healthy 60 s run at 10 fps whose pacer missed 40 ticks for ``cause`` ("pause":
    the process did not run on time, 5 at each of ``PAUSES``, one event each; "source": a
    read that took 4 s up to t = 21 s, in a burst, its one event), its rows for those ticks
    absent, with ``quiet_drops`` queue drops spread over the frames outside the bursts;
    written through the store on a 1-CPU host whose bursts' ticks are ``in_burst``, judged:
    its drops."""
    cols = healthy(DUR, FPS, WARM)
    c = cols["t_capture"]
    spans = [(t, PAUSE_TICKS) for t in PAUSES] if cause == "pause" else [(21.0, 40)]
    gone = np.zeros(c.size, dtype=bool)
    for t, n in spans:
        gone |= (c > t - n / FPS) & (c <= t)
    if quiet_drops:
        quiet = np.flatnonzero(~cols["warmup"] & ~_in_burst(c) & ~gone)
        at = quiet[np.linspace(0, quiet.size - 1, quiet_drops).astype(int)]
        cols["drop_count"][at] = 1
        cols["drop_count"] = np.cumsum(cols["drop_count"])
    cols = {k: v[~gone] for k, v in cols.items()}
    missed = sum(n for _, n in spans)
    what = "the process did not run on time" if cause == "pause" else "the source was slow"
    kind = "pause" if cause == "pause" else "source_slow"
    events = [Event("warmup_end", WARM, 0.0, f"warm-up of {WARM:g} s ended")]
    events += [Event(kind, t, 0.0, f"{n} tick(s) missed (~{n * 1e3 / FPS:.0f} ms): {what}")
               for t, n in spans]  # fmt: skip
    summary = {"drops": quiet_drops, "stale": 0, "queued_at_end": 0, "in_flight_at_end": 0,
               "pacer_missed_ticks": missed, "missed_ticks_source": 0, "missed_ticks_pause": 0,
               f"missed_ticks_{cause}": missed}  # fmt: skip
    rid = store_run(conn, f"pauses{next(_made)}", cols, crit=dict(crit), dur=DUR, fps=FPS,
                    samples=_samples(in_burst), events=events, summary=summary,
                    environment={"cpu_count": 1})  # fmt: skip
    d = judged(conn, rid).get("drops")
    assert d is not None
    return d


def test_ticks_missed_in_pauses_while_the_host_was_contended_are_invalid(conn) -> None:
    """40 of 550 ticks missed in pauses while other processes held 95 % of the CPU, nothing
    else lost: drops INVALID naming the 40 ticks set aside (0 kept), never PASS nor FAIL;
    FAIL with ``contended_cpu_pct = 100`` (the rule off)."""
    c = _drops(conn, BUSY)
    assert c.status == "invalid", c.detail
    assert c.detail.startswith("the host was contended: 100% of the 40 lost frame(s) "), c.detail
    assert SET_ASIDE in c.detail, c.detail
    assert "soak on a quiet host or pin CPUs" in c.detail, c.detail
    cn = c.evidence["contention"]
    assert (cn["missed_pause_contended"], cn["missed_pause_kept"]) == (40, 0), cn
    assert (cn["pause_events"], cn["pause_events_contended"]) == (8, 8), cn
    assert cn["others_contended_pct"] == pytest.approx(95.0) and not cn["quiet_fails"], cn
    off = _drops(conn, BUSY, contended_cpu_pct=100)
    assert off.status == "fail" and off.evidence["contention"] is None, off.detail


def test_the_same_pauses_on_a_quiet_host_fail(conn) -> None:
    """The same pauses with other processes at 10 % (soakd's own process busy, or not: a
    SIGSTOP) FAIL, every missed tick counted whole as the model's."""
    for ticks in (QUIET, OWN_BUSY):
        c = _drops(conn, ticks)
        assert c.status == "fail", (ticks, c.detail)
        assert c.detail.startswith("40 of "), (ticks, c.detail)
        cn = c.evidence["contention"]
        assert (cn["missed_pause_contended"], cn["missed_pause_kept"]) == (0, 40), cn
        assert cn["quiet_fails"], cn


def test_quiet_losses_over_the_budget_beside_contended_pauses_still_fail(conn) -> None:
    """35 queue drops in the quiet windows (~12 % of their frames) beside the 40 contended
    pause ticks: the quiet part alone fails, so FAIL, the detail naming what was set aside."""
    c = _drops(conn, BUSY, quiet_drops=35)
    assert c.status == "fail", c.detail
    assert "; set aside as the host's (other processes held >= 75 % of the CPUs): " in c.detail
    assert SET_ASIDE in c.detail, c.detail
    cn = c.evidence["contention"]
    assert cn["quiet_fails"] and cn["quiet_fraction"] > 0.05, cn


def test_a_slow_sources_missed_ticks_on_a_contended_host_are_not_excused(conn) -> None:
    """40 ticks missed because a read took 4 s (``missed_ticks_source``, a ``source_slow``
    event) while other processes held 95 % of the CPU: the source's, never the host's:
    FAIL with none of them set aside."""
    c = _drops(conn, BUSY, cause="source")
    assert c.status == "fail", c.detail
    assert c.evidence["contention"]["missed_pause_contended"] == 0, c.evidence


#: one-tick pauses, more than the 200 events a run's verdict loads of every kind
MANY = 240


def _many_pauses(conn: sqlite3.Connection, in_burst: HostTick) -> CriterionResult:
    """A healthy 60 s run at 10 fps whose pacer missed the first ``MANY`` ticks of the
    bursts, one ``pause`` event each with its ticks in its data as the pacer writes it
    (soakd/run/runner.py), their rows absent; on a 1-CPU host whose bursts' ticks are
    ``in_burst``, written through the store and judged: its drops."""
    cols = healthy(DUR, FPS, WARM)
    c = cols["t_capture"]
    gone = np.zeros(c.size, dtype=bool)
    gone[np.flatnonzero(_in_burst(c) & ~cols["warmup"])[:MANY]] = True
    events = [Event("warmup_end", WARM, 0.0, f"warm-up of {WARM:g} s ended")]
    events += [Event("pause", float(t), 0.0, "1 tick(s) missed (~100 ms): the process did not "
                     "run on time", data={"ticks": 1, "ms": 100.0}) for t in c[gone]]  # fmt: skip
    summary = {"drops": 0, "stale": 0, "queued_at_end": 0, "in_flight_at_end": 0,
               "pacer_missed_ticks": MANY, "missed_ticks_source": 0,
               "missed_ticks_pause": MANY}  # fmt: skip
    rid = store_run(conn, f"pauses{next(_made)}", {k: v[~gone] for k, v in cols.items()},
                    dur=DUR, fps=FPS, samples=_samples(in_burst), events=events,
                    summary=summary, environment={"cpu_count": 1})  # fmt: skip
    d = judged(conn, rid).get("drops")
    assert d is not None
    return d


def test_every_pause_event_counts_beyond_the_200_events_a_run_loads(conn) -> None:
    """240 one-tick pauses (each its ticks in its data) while other processes held 95 % of
    the CPU: all 240 read, set aside but the 3 that straddle a burst's start, INVALID (with
    the first 200 events alone, the 41 unread were the model's: FAIL); on a quiet host
    FAIL, all 240 kept."""
    busy = _many_pauses(conn, BUSY)
    assert busy.status == "invalid", busy.detail
    cn = busy.evidence["contention"]
    assert (cn["pause_events"], cn["pause_events_unread"]) == (MANY, 0), cn
    # all but the 3 at a burst's first tick (their 100 ms straddle a quiet tick)
    assert cn["missed_pause_contended"] == cn["pause_events_contended"] == MANY - 3, cn
    quiet = _many_pauses(conn, QUIET)
    assert quiet.status == "fail", quiet.detail
    assert quiet.evidence["contention"]["missed_pause_kept"] == MANY, quiet.evidence


def _starved(conn: sqlite3.Connection, in_burst: HostTick) -> CriterionResult:
    """A healthy 60 s run at 10 fps (a latest-frame queue) whose model dispatched nothing in
    the last 3 s of the first two bursts (15-25 s, 35-45 s): the 30 frames the queue replaced
    each time are counted on the first row dispatched after the burst, captured after it;
    on a 1-CPU host whose bursts' ticks are ``in_burst``, written through the store and
    judged: its drops."""
    cols = healthy(DUR, FPS, WARM)
    c = cols["t_capture"]
    starved = ((c >= 22) & (c < 25)) | ((c >= 42) & (c < 45))
    drops = np.zeros(c.size, dtype=int)
    drops[[np.flatnonzero(c >= end)[0] for end in (25.0, 45.0)]] = 30
    cols["drop_count"] = np.cumsum(drops)
    summary = {"drops": 60, "stale": 0, "queued_at_end": 0, "in_flight_at_end": 0,
               "pacer_missed_ticks": 0, "missed_ticks_source": 0,
               "missed_ticks_pause": 0}  # fmt: skip
    rid = store_run(conn, f"pauses{next(_made)}", {k: v[~starved] for k, v in cols.items()},
                    dur=DUR, fps=FPS, run={"consume": "latest"}, samples=_samples(in_burst),
                    summary=summary, environment={"cpu_count": 1})  # fmt: skip
    d = judged(conn, rid).get("drops")
    assert d is not None
    return d


def test_losses_counted_just_after_a_contended_spell_the_model_could_not_run_in_are_the_host_s(
    conn,
) -> None:
    """60 frames lost while the model could not run at the end of two contended bursts and
    counted on the first frame after each (in a quiet window): set aside as the host's,
    INVALID; the same on a quiet host FAILs (11 % of the ticks lost)."""
    busy = _starved(conn, BUSY)
    assert busy.status == "invalid", busy.detail
    cn = busy.evidence["contention"]
    assert (cn["lost_carried"], cn["lost_contended"], cn["quiet_rate"]) == (60, 60, 0), cn
    assert "or counted just after them (60)" in busy.detail, busy.detail
    quiet = _starved(conn, QUIET)
    assert quiet.status == "fail" and quiet.evidence["contention"]["lost_carried"] == 0, quiet


def _real_drops(db: Path, rid: str, others_pct: float) -> CriterionResult:
    """The stored real run re-judged (``soakd gate RUN_ID``, ``contended_cpu_pct = 75``)
    with its host telemetry rewritten: the host's busy share becomes soakd's own share plus
    ``others_pct``, so the other processes are the ones the test names, whatever else this
    shared machine runs."""
    ncpu = os.cpu_count() or 1
    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE samples SET host_cpu_pct = "
                     f"min(100.0, coalesce(cpu_pct, 0) / {ncpu} + {others_pct})")  # fmt: skip
        crit, _ = criteria_of(load_run_data(conn, rid))
        _, v = evaluate(conn, rid, crit.model_copy(update={"contended_cpu_pct": 75.0}))
    d = v.get("drops")
    assert d is not None
    return d


@pytest.mark.slow
def test_a_real_sigstop_fails_on_a_quiet_host_and_is_invalid_on_a_contended_one(
    tmp_path: Path,
) -> None:
    """A real soak stopped 2 s with SIGSTOP: with the host quiet meanwhile (others at 0 %)
    its missed ticks are the model's, drops FAIL; the same run with other processes holding
    every CPU is INVALID, every pause tick set aside, never PASS."""
    db = tmp_path / "p.db"
    args = ["run", "--duration", "8s", "--fps", "20", "--db", str(db), "--no-live",
            *SYNTH_CLI, "--set", "run.sample_interval_ms=100"]  # fmt: skip
    proc = subprocess.Popen(soakd_cmd(*args), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # frames after the warm-up: the run is going
            try:
                with sqlite3.connect(db, timeout=5) as conn:
                    if conn.execute("SELECT count(*) FROM frames").fetchone()[0] >= 20:
                        break
            except sqlite3.OperationalError:
                pass
            time.sleep(0.2)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(2.0)
        proc.send_signal(signal.SIGCONT)
        assert proc.wait(120) in (1, 3)
    finally:
        proc.kill()
    with sqlite3.connect(db) as conn:
        rid = str(conn.execute("SELECT id FROM runs").fetchone()[0])
    quiet = _real_drops(db, rid, 0.0)
    paused = quiet.evidence["missed_ticks_pause"]
    assert paused >= 30, quiet.evidence  # 2 s at 20 fps, less what the pacer saw at the edges
    assert quiet.status == "fail", quiet.detail
    assert quiet.evidence["contention"]["missed_pause_kept"] == paused, quiet.evidence
    with sqlite3.connect(db) as conn:  # the pacer's pauses carry their ticks in their data
        data = [
            json.loads(d) for (d,) in conn.execute("SELECT data FROM events WHERE kind = 'pause'")
        ]
    assert sum(d["ticks"] for d in data) == paused, data
    busy = _real_drops(db, rid, 100.0)
    assert busy.status == "invalid", busy.detail
    assert busy.detail.startswith("the host was contended: "), busy.detail
    assert busy.evidence["contention"]["missed_pause_contended"] == paused, busy.evidence
