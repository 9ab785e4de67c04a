"""A served model's server queue on a contended host (issue 31): waiting requests that rise
only while other processes hold the host's CPUs (the server could not run) are INVALID "the
host was contended", never FAIL nor PASS; the same rise on a quiet host, or one the quiet
scrapes show too, FAILs; the running server_queue look stops nothing once the host was
contended. Runs written through the store (tests/stored_runs.py), judged as ``soakd gate``
judges them, and the run's own early-stop observer fed as a run feeds it."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import numpy as np
import pytest

from soakd.analysis.model import CriterionResult
from soakd.config import load_settings
from soakd.observers.base import Progress
from soakd.records import Event, Sample, ServerMetric
from soakd.run.early_stop import EarlyStop, watch_early_stop
from soakd.store import db as store
from soakd.store.server_metrics import server_metric_values

from .stored_runs import HostTick, healthy, host_samples, judged, store_run

DUR, FPS, WARM, TICK = 120.0, 10.0, 5.0, 0.5
QUIET: HostTick = (20.0, 5.0, 5.0)  # others 10 %
BUSY: HostTick = (100.0, 5.0, 0.0)  # others 95 %
SERVER_BUSY: HostTick = (95.0, 5.0, 80.0)  # the model's server itself: others 10 %
WAITING = "vllm:num_requests_waiting"
#: windows of 2 scrapes: 115 of them after the warm-up, 5 in each burst
WINDOWS = {"floor_window_s": 1.0}


def _in_burst(t: np.ndarray) -> np.ndarray:
    """The second 10 s of every 20 s of the run (from the warm-up's end)."""
    return ((t - WARM) % 20.0) >= 10.0


def _waiting(kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Scrape times (at each tick) and the waiting requests then, 4 with noise plus, as the
    tick before the scrape lay in a burst: "burst_rise": 1 per second of the run (60 a
    minute, over the 1 allowed) in the bursts only; "rise": 0.5 per second everywhere
    besides."""
    t = np.arange(TICK, DUR + TICK, TICK)
    y = 4.0 + np.random.default_rng(5).normal(0, 0.3, t.size)
    ramp = np.clip(t - WARM, 0.0, None)
    y = np.where(_in_burst(t - TICK / 2), y + ramp, y)
    return t, y + (0.5 * ramp if kind == "rise" else 0.0)


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    c = store.connect(tmp_path_factory.mktemp("contention_queue") / "runs.db")
    yield c
    c.close()


_made = iter(range(1000))


def _queue(
    conn: sqlite3.Connection, kind: str, in_burst: HostTick, **crit: object
) -> CriterionResult:
    """A served run (workload.kind = "openai") on a 1-CPU host whose bursts' ticks are
    ``in_burst`` (others at 10 % elsewhere), its waiting requests ``_waiting(kind)``, written
    through the store and judged: its server_queue."""
    rid = f"queue{next(_made)}"
    store_run(conn, rid, healthy(DUR, FPS, WARM), crit={**WINDOWS, **crit}, dur=DUR, fps=FPS,
              samples=host_samples(DUR, TICK, _in_burst, in_burst, QUIET),
              environment={"cpu_count": 1}, workload_kind="openai")  # fmt: skip
    t, y = _waiting(kind)
    rows = [
        ServerMetric(i, float(x), WAITING, "", float(v))
        for i, (x, v) in enumerate(zip(t, y, strict=True))
    ]
    with store.atomic(conn):
        store.insert_rows(conn, ServerMetric, rid, [server_metric_values(m) for m in rows])
    c = judged(conn, rid).get("server_queue")
    assert c is not None
    return c


def test_a_queue_rising_only_while_the_host_is_contended_is_invalid(conn) -> None:
    """Waiting requests rising in the bursts where other processes hold 95 % of the CPU,
    flat between them: INVALID "the host was contended" with the scrapes set aside."""
    c = _queue(conn, "burst_rise", BUSY)
    assert c.status == "invalid", c.detail
    assert c.detail.startswith("the host was contended: the queue rose only while "), c.detail
    assert "soak on a quiet host or pin CPUs" in c.detail and " rising " in c.detail, c.detail
    row = c.evidence["contention"]["metrics"][WAITING]
    assert not row["quiet_fails"] and row["others_contended_pct"] == pytest.approx(95.0), row
    # the bursts hold 55 s of the 115 s after the warm-up: 110 scrapes at 2 a second
    assert abs(row["scrapes_contended"] - 110) <= 2 and row["scrapes_quiet"] >= 118, row


def test_the_same_rise_on_a_quiet_host_fails(conn) -> None:
    """The same queue with other processes at 10 % throughout FAILs, also when the CPU the
    bursts hold is the model's server's; and with ``contended_cpu_pct = 100`` (rule off)."""
    for ticks, crit in ((QUIET, {}), (SERVER_BUSY, {}), (BUSY, {"contended_cpu_pct": 100})):
        c = _queue(conn, "burst_rise", ticks, **crit)
        assert c.status == "fail", (ticks, c.detail)
        assert c.detail.startswith(f"{WAITING} rising "), (ticks, c.detail)


def test_a_rise_the_quiet_scrapes_show_too_still_fails(conn) -> None:
    """The queue rising 30 a minute everywhere on the host contended in the bursts: the
    scrapes between them fail the rule alone, so FAIL, counting those set aside."""
    c = _queue(conn, "rise", BUSY)
    assert c.status == "fail", c.detail
    assert (
        "scrape(s) taken while other processes held >= 75 % of the CPUs, the others "
        f"rise alone ({WAITING} +" in c.detail
    ), c.detail


def _watched(busy_from: float) -> list[str]:
    """Two minutes of a served 10-minute stop_on_fail run's ticks every 0.5 s through its
    early-stop observer on a 2-CPU host: waiting requests rising 20 a minute, other
    processes at 5 % but 95 % from ``busy_from`` s for 5 s; a look each second: the stops."""
    s = load_settings(overrides=["run.stop_on_fail=true", "run.duration=600", "run.fps=10",
                                 "criteria.floor_window_s=1"])  # fmt: skip
    stops: list[str] = []
    [watch] = watch_early_stop(s, lambda e: None, stops.append)
    assert isinstance(watch, EarlyStop)
    watch.live.cpus = 2.0
    watch.on_event(Event("warmup_end", 0.0, 0.0))
    rng = np.random.default_rng(0)
    for i, t in enumerate(np.arange(0.5, 120.0, 0.5)):
        host, own = (100.0, 10.0) if busy_from <= t < busy_from + 5 else (45.0, 80.0)
        waiting = max(0.0, 3.0 + 20.0 * t / 60 + rng.normal(0, 1.0))
        metric = ServerMetric(i, float(t), WAITING, "", waiting)
        watch.on_sample(Sample(i, float(t), 0.0, 0.0, 0.1, {"host_cpu_pct": host, "cpu_pct": own},
                               server=(metric,)))  # fmt: skip
        if t == int(t):
            watch.on_progress(Progress(elapsed_s=float(t), remaining_s=600.0 - t, frames_done=0,
                                       frames_captured=0, achieved_fps=10.0, drops=0, stale=0,
                                       errors=0, age_p50_ms=None))  # fmt: skip
        if stops:
            break
    return stops


def test_a_rising_queue_stops_a_run_early_only_on_a_quiet_host() -> None:
    """Waiting requests rising 20 a minute stop a 10-minute run on server_queue within two
    minutes on a quiet host; five seconds of other processes holding 95 % of the CPUs, and
    the look stops nothing: the verdict decides."""
    assert [x.split(":")[0] for x in _watched(busy_from=1e9)] == ["server_queue"]
    assert _watched(busy_from=10.0) == []
