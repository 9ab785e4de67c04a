"""The served model's server pinned at its rules (issue 35): its memory judged per server
lifetime and its queue's trend, on runs written row by row through the store
(tests/stored_runs.py) and judged as ``soakd gate`` judges them, on both sides of each
boundary; the probe on real processes (a real process tree, real sockets shared with
SO_REUSEPORT, a real /metrics page). bench/mutants/server.py's mutants name these tests."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import psutil
import pytest

from soakd.analysis.model import CriterionResult
from soakd.records import Event, Sample, ServerMetric
from soakd.store import db as store
from soakd.store.server_metrics import server_metric_values
from soakd.telemetry import server as srv
from soakd.telemetry.probes import Values
from soakd.telemetry.server import ServerMetricsProbe, ServerProcessProbe

from .stored_runs import MIB, healthy, judged, store_run
from .test_server_followed import _holder
from .test_server_telemetry import _MetricsServer, _Page

DUR = 130.0  # a 5 s warm-up, then 125 s: two lifetimes of 60 s each judge alone (>= 45.6 s)
EVERY = 0.5  # a telemetry tick


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    c = store.connect(tmp_path_factory.mktemp("server-pins") / "runs.db")
    yield c
    c.close()


def _ticks(dur: float = DUR) -> np.ndarray:
    return np.arange(0.0, dur, EVERY)


def _replaced(t: float, old: int, new: int) -> Event:
    data = {"old_pid": old, "new_pid": new, "old_created": 1.0, "new_created": 2.0}
    return Event("server_replaced", t, 0.0, f"model server pid {old} replaced by pid {new}",
                 data=data)  # fmt: skip


def _lost(t: float, pid: int) -> Event:
    return Event("server_lost", t, 0.0, f"model server pid {pid} is gone", data={"pid": pid})


def _served(
    conn: sqlite3.Connection,
    rid: str,
    server_rss: np.ndarray,
    events: Sequence[Event] = (),
    *,
    metrics: dict[str, np.ndarray] | None = None,
    dur: float = DUR,
    **crit: Any,
) -> str:
    """A served run (workload.kind = "openai") of ``dur`` s, 5 s of warm-up, its own RSS flat,
    the server's RSS ``server_rss`` (bytes, NaN: not sampled) at each tick, the server's
    ``events`` after the warm-up_end event, and ``metrics`` (name: value at each tick) as
    server_metrics rows of two label sets each (halves, summed back on load)."""
    t = _ticks(dur)
    samples = [
        Sample(i, float(x), 0.0, 0.0, 0.1, {
            "rss_bytes": 400 * MIB,
            "server_rss_bytes": None if np.isnan(v) else int(v),
        })
        for i, (x, v) in enumerate(zip(t, server_rss, strict=True))
    ]  # fmt: skip
    warm = Event("warmup_end", 5.0, 0.0, "warm-up of 5 s ended")
    crit = {"max_memory_growth_mb_per_min": 10.0, **crit}
    rid = store_run(conn, rid, healthy(dur), dur=dur, samples=samples, events=[warm, *events],
                    crit=crit, workload_kind="openai")  # fmt: skip
    rows = [
        ServerMetric(i, float(x), name, f'engine="{e}"', float(v) / 2)
        for name, ys in (metrics or {}).items()
        for i, (x, v) in enumerate(zip(t, ys, strict=True))
        for e in (0, 1)
    ]
    with store.atomic(conn):
        store.insert_rows(conn, ServerMetric, rid, [server_metric_values(m) for m in rows])
    return rid


def _rss(
    t: np.ndarray, level_mb: float, slope_mb_per_min: float = 0.0, seed: int = 0
) -> np.ndarray:
    """A server's RSS: ``level_mb`` growing ``slope_mb_per_min``, 0.2 MB of noise."""
    rng = np.random.default_rng(seed)
    return (level_mb + slope_mb_per_min * t / 60 + rng.normal(0, 0.2, t.size)) * MIB


def _memory(conn: sqlite3.Connection, rid: str) -> CriterionResult:
    got = judged(conn, rid).get("memory_server_rss")
    assert got is not None
    return got


# --------------------------------------------------------------------------- lifetimes


def test_each_lifetime_is_judged_alone_so_a_step_at_the_replacement_is_no_leak(
    conn: sqlite3.Connection,
) -> None:
    """A flat 100 MB server replaced at t = 65 s by a flat 600 MB one: each lifetime is
    judged in its own window, so the 500 MB step between two processes is no leak: PASS,
    decided by the last server."""
    t = _ticks()
    rss = np.where(t < 65, _rss(t, 100), _rss(t, 600, seed=1))
    got = _memory(conn, _served(conn, "step", rss, [_replaced(65.0, 111, 222)]))
    assert got.status == "pass", got.detail
    assert got.detail.startswith("server pid 222 (from t = 65.0 s)"), got.detail
    rows = (got.evidence or {})["lifetimes"]
    assert [(r["pid"], r["start"], r["end"], r["ended"]) for r in rows] == [
        (111, None, 65.0, "replaced"), (222, 65.0, None, None)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("slopes", "leaker", "mb_per_min"),
    [((40.0, 0.0), 111, 40.0), ((20.0, 40.0), 222, 40.0), ((40.0, 20.0), 111, 40.0)],
    ids=["first-leaks", "steeper-last", "steeper-first"],
)
def test_any_lifetime_that_leaks_fails_and_the_steepest_leak_is_reported(
    conn: sqlite3.Connection, slopes: tuple[float, float], leaker: int, mb_per_min: float
) -> None:
    """Two 60 s lifetimes (10 MB/min allowed): FAIL when either leaks, never hidden by a flat
    last one; the detail, the value and the evidence are the steepest leak's (its pid, its
    MB/min, the peak of its own samples)."""
    t = _ticks()
    first, second = _rss(t, 100, slopes[0]), _rss(t - 65, 300, slopes[1], seed=1)
    rss = np.where(t < 65, first, second)
    rid = _served(conn, f"leak-{slopes}", rss, [_replaced(65.0, 111, 222)])
    got = _memory(conn, rid)
    assert got.status == "fail", got.detail
    assert f"server pid {leaker} " in got.detail, got.detail
    assert got.value is not None and abs(got.value - mb_per_min) < 0.1 * mb_per_min
    own = rss[(t >= 5) & ((t < 65) if leaker == 111 else (t >= 65))]
    assert abs((got.evidence or {})["peak_mb"] - own.max() / MIB) < 0.5  # its own samples only


def test_a_lost_server_is_invalid_never_a_pass_on_the_dead_process_s_samples(
    conn: sqlite3.Connection,
) -> None:
    """A server flat for 85 s then lost (server_lost, no samples after): INVALID "lost at
    t = 90.0 s", though its 85 s of flat samples alone would PASS."""
    t = _ticks()
    rss = np.where(t < 90, _rss(t, 100), np.nan)
    alive = _memory(conn, _served(conn, "alive", rss))
    assert alive.status == "pass", alive.detail  # the same samples, no event
    got = _memory(conn, _served(conn, "lost", rss, [_lost(90.0, 111)]))
    assert got.status == "invalid", got.detail
    assert "(pid 111) was lost at t = 90.0 s" in got.detail, got.detail


@pytest.mark.parametrize(("at", "expect"), [(75.0, "pass"), (85.0, "invalid")])
def test_the_last_server_decides_only_when_it_lived_12_floor_windows(
    conn: sqlite3.Connection, at: float, expect: str
) -> None:
    """The replacement's own life is judged when it lasts 12 floor windows of 4 s (less 5 %)
    after a warm-up of its own as long as the run's (5 s): replaced at t = 75 s (50 s left
    after it) it decides, PASS; at t = 85 s (40 s) INVALID "the server was replaced at
    t = 85.0 s", never a PASS on the first server's samples."""
    t = _ticks()
    rss = np.where(t < at, _rss(t, 100), _rss(t, 300, seed=1))
    got = _memory(conn, _served(conn, f"late-{at}", rss, [_replaced(at, 111, 222)]))
    assert got.status == expect, got.detail
    if expect == "invalid":
        assert got.detail.startswith(f"the server was replaced at t = {at:.1f} s"), got.detail
    else:
        assert got.detail.startswith(f"server pid 222 (from t = {at:.1f} s)"), got.detail


def test_a_served_run_whose_server_was_never_sampled_is_invalid(
    conn: sqlite3.Connection,
) -> None:
    """A served run of a local server (telemetry.server_process not "off") without one
    server RSS sample after the warm-up: memory_server_rss INVALID, not n/a."""
    t = _ticks()
    rss = np.where(t < 5, 100 * MIB, np.nan)  # sampled only in the warm-up
    got = _memory(conn, _served(conn, "never", rss))
    assert got.status == "invalid", got.detail
    assert "no server RSS samples after warm-up" in got.detail


def test_the_server_s_warmup_is_out_of_its_memory_evidence(conn: sqlite3.Connection) -> None:
    """A server loading 3 GB in the warm-up, then flat at 100 MB: PASS, its peak 100 MB (the
    warm-up's samples are out of the window and of the evidence)."""
    t = _ticks()
    rss = np.where(t < 5, 3000 * MIB, _rss(t, 100))
    got = _memory(conn, _served(conn, "warm", rss))
    assert got.status == "pass", got.detail
    assert abs((got.evidence or {})["peak_mb"] - 100) < 2


# --------------------------------------------------------------------------- the queue


WAITING, KV = "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"


def _queue(conn: sqlite3.Connection, rid: str) -> CriterionResult:
    got = judged(conn, rid).get("server_queue")
    assert got is not None
    return got


def _flat_rss() -> np.ndarray:
    return _rss(_ticks(), 100)


@pytest.fixture(scope="module")
def rising(conn: sqlite3.Connection) -> dict[float, str]:
    """The waiting requests rising 3 per minute after a warm-up queue of 50, the KV cache
    flat; judged with 2 and with 4 requests/min allowed."""
    t = _ticks()
    rng = np.random.default_rng(3)
    waiting = np.where(t < 5, 50.0, 4 + 3 * t / 60 + rng.normal(0, 0.3, t.size))
    kv = np.full(t.size, 0.3)
    runs = {}
    for thr in (2.0, 4.0):
        metrics = {WAITING: waiting, KV: kv}
        runs[thr] = _served(conn, f"queue-{thr}", _flat_rss(), metrics=metrics,
                            max_server_queue_slope_per_min=thr)  # fmt: skip
    return runs


def test_a_queue_rising_faster_than_its_tolerance_per_minute_fails(
    conn: sqlite3.Connection, rising: dict[float, str]
) -> None:
    """Waiting requests rising 3/min: FAIL at 2 requests/min allowed, PASS at 4 (the
    tolerance is per minute, the waiting metric's own, not the KV cache's); the value is
    the slope in requests/min."""
    fail, ok = _queue(conn, rising[2.0]), _queue(conn, rising[4.0])
    assert (fail.status, ok.status) == ("fail", "pass"), (fail.detail, ok.detail)
    assert fail.unit == "requests/min" and fail.value is not None
    assert abs(fail.value - 3.0) < 0.3
    assert fail.detail.startswith(f"{WAITING} rising +3"), fail.detail


def test_the_queue_s_warmup_is_out_of_its_evidence(
    conn: sqlite3.Connection, rising: dict[float, str]
) -> None:
    """The warm-up's queue of 50 is left out: the waiting metric's max is the measured
    part's (~10), its median the measured part's."""
    ev = (_queue(conn, rising[4.0]).evidence or {})["metrics"][WAITING]
    assert ev["max"] < 12 and abs(ev["median"] - 7.1) < 0.5, ev


def test_a_rising_kv_cache_fails_though_the_waiting_queue_is_flat(
    conn: sqlite3.Connection,
) -> None:
    """The KV cache's use rising 0.03 share/min (0.01 allowed) and the waiting requests
    flat: FAIL on the KV cache (the worst metric decides)."""
    t = _ticks()
    rng = np.random.default_rng(4)
    kv = 0.2 + 0.03 * t / 60 + rng.normal(0, 0.002, t.size)
    metrics = {WAITING: np.full(t.size, 2.0), KV: kv}
    got = _queue(conn, _served(conn, "kv", _flat_rss(), metrics=metrics))
    assert got.status == "fail", got.detail
    assert got.detail.startswith(f"{KV} rising"), got.detail


def test_the_queue_trend_is_of_window_medians_not_floors(conn: sqlite3.Connection) -> None:
    """Each 4 s window's median flat at 10 while one sample in it (its floor) rises from 0
    to 10: no rising queue, PASS at 1 request/min allowed."""
    t = _ticks()
    k = np.floor((t - 5) / 4)
    first = (t >= 5) & (((t - 5) % 4) == 0)
    waiting = np.where(first, 10 * k / k.max(), 10.0)
    got = _queue(conn, _served(conn, "medians", _flat_rss(), metrics={WAITING: waiting}))
    assert got.status == "pass", got.detail


# --------------------------------------------------------------------------- the probe

# a process holding argv[1] MB; prints a line once it holds them
_HOLD = (
    "import sys, time; held = bytearray(b'\\x01') * (int(sys.argv[1]) << 20);"
    " print(flush=True); time.sleep(60)"
)
# a worker holding argv[1] MB with a worker of its own holding twice that; prints that pid
_MID = textwrap.dedent(
    """
    import subprocess, sys, time
    hold, mb = sys.argv[1], int(sys.argv[2])
    held = bytearray(b"\\x01") * (mb << 20)
    leaf = subprocess.Popen([sys.executable, "-c", hold, str(2 * mb)], stdout=subprocess.PIPE)
    leaf.stdout.readline()
    print(leaf.pid, flush=True)
    time.sleep(60)
    """
)
# a server starting _MID (20 MB, its worker 40 MB); prints the two pids; on a line on stdin
# it ends both and starts a new worker holding 80 MB, prints its pid once it holds them
_NESTED = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    hold, mid_code = sys.argv[1], sys.argv[2]
    mid = subprocess.Popen([sys.executable, "-c", mid_code, hold, "20"], stdout=subprocess.PIPE,
                           text=True)
    leaf = int(mid.stdout.readline())
    print(mid.pid, leaf, flush=True)
    sys.stdin.readline()
    os.kill(leaf, signal.SIGKILL)
    mid.kill()
    mid.wait()
    new = subprocess.Popen([sys.executable, "-c", hold, "80"], stdout=subprocess.PIPE)
    new.stdout.readline()
    print(new.pid, flush=True)
    sys.stdin.readline()
    """
)


def _rss_of(*pids: int) -> int:
    return sum(psutil.Process(p).memory_info().rss for p in pids)


def _sample(probe: ServerProcessProbe) -> Values:
    into: Values = {}
    probe.sample(into)
    return into


@pytest.fixture
def nested() -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    p = subprocess.Popen([sys.executable, "-c", _NESTED, _HOLD, _MID], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stdout is not None
    mid, leaf = map(int, p.stdout.readline().split())
    yield p, mid, leaf
    for pid in psutil.Process(p.pid).children(recursive=True):
        pid.kill()
    p.kill()
    p.wait(5)


def test_the_server_s_rss_sums_every_descendant_not_only_its_children(
    nested: tuple[subprocess.Popen[str], int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """server_rss_bytes is the server's RSS plus its worker's plus that worker's own worker
    (20 and 40 MB); when the worker ends and a new one (80 MB) starts between two tree
    listings, the tick it vanishes lists the tree again and counts the new one at once."""
    p, mid, leaf = nested
    monkeypatch.setattr(srv, "TREE_REFRESH_S", 600.0)  # only a vanishing lists it again
    probe = ServerProcessProbe(p.pid)
    got = _sample(probe)["server_rss_bytes"] or 0
    assert abs(got - _rss_of(p.pid, mid, leaf)) < 3 * MIB
    assert got > psutil.Process(p.pid).memory_info().rss + 55 * MIB
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write("swap\n")
    p.stdin.flush()
    new = int(p.stdout.readline())
    got = _sample(probe)["server_rss_bytes"] or 0
    assert abs(got - _rss_of(p.pid, new)) < 3 * MIB
    assert got > psutil.Process(p.pid).memory_info().rss + 75 * MIB


def test_the_tree_read_from_proc_is_psutil_s_every_descendant(
    nested: tuple[subprocess.Popen[str], int, int],
) -> None:
    """procfs.descendants (the tree's own /proc task files, not a walk of the host) lists
    the processes psutil's walk lists: the worker and the worker's own worker."""
    from soakd.telemetry import procfs

    if not procfs.HAS_CHILDREN:
        pytest.skip("this kernel does not list children in /proc (CONFIG_PROC_CHILDREN)")
    p, mid, leaf = nested
    mine = procfs.descendants(p.pid)
    theirs = {c.pid for c in psutil.Process(p.pid).children(recursive=True)}
    assert mine is not None and set(mine) == theirs == {mid, leaf}


_SPAWN_LATER = textwrap.dedent(
    """
    import subprocess, sys, time
    print(flush=True)
    sys.stdin.readline()
    w = subprocess.Popen([sys.executable, "-c", sys.argv[1], "40"], stdout=subprocess.PIPE)
    w.stdout.readline()
    print(w.pid, flush=True)
    time.sleep(60)
    """
)


def test_a_worker_started_later_is_counted_within_a_few_refresh_periods() -> None:
    """The tree is listed again every TREE_REFRESH_S = 2 s: a worker started later (40 MB)
    is in server_rss_bytes within 10 s, with no process of the tree vanishing."""
    p = subprocess.Popen([sys.executable, "-c", _SPAWN_LATER, _HOLD], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert p.stdin is not None and p.stdout is not None
        p.stdout.readline()
        probe = ServerProcessProbe(p.pid)
        alone = _sample(probe)["server_rss_bytes"] or 0
        p.stdin.write("spawn\n")
        p.stdin.flush()
        p.stdout.readline()
        deadline = time.monotonic() + 10
        while (_sample(probe)["server_rss_bytes"] or 0) < alone + 35 * MIB:
            assert time.monotonic() < deadline, "the later worker was not counted within 10 s"
            time.sleep(0.1)
    finally:
        for c in psutil.Process(p.pid).children(recursive=True):
            c.kill()
        p.kill()
        p.wait(5)


def test_a_server_lost_then_replaced_then_lost_again_says_so_each_time() -> None:
    """Port mode: the server dies (server_lost), another takes the port (server_replaced,
    from the lost pid), and it dies too: a second server_lost, naming the second pid, said
    once though the port is looked at again every TREE_REFRESH_S."""
    a, port = _holder(0, 5)
    b = None
    try:
        probe = ServerProcessProbe(a.pid, port=port)
        a.kill()
        a.wait(5)
        assert _sample(probe).get("server_rss_bytes") is None
        assert [(c.kind, c.data["pid"]) for c in probe.take_changes()] == [("server_lost", a.pid)]
        b, _ = _holder(port, 5)
        deadline = time.monotonic() + srv.TREE_REFRESH_S + 10
        while not (changes := probe.take_changes()):
            assert time.monotonic() < deadline, "the new server was never followed"
            _sample(probe)
            time.sleep(0.1)
        assert [(c.kind, c.data["new_pid"]) for c in changes] == [("server_replaced", b.pid)]
        b.kill()
        b.wait(5)
        deadline = time.monotonic() + srv.TREE_REFRESH_S + 10
        while not (changes := probe.take_changes()):
            assert time.monotonic() < deadline, "the second loss was never said"
            _sample(probe)
            time.sleep(0.1)
        assert [(c.kind, c.data["pid"]) for c in changes] == [("server_lost", b.pid)]
        quiet = time.monotonic() + srv.TREE_REFRESH_S + 0.5  # looked for again, not said again
        while time.monotonic() < quiet:
            _sample(probe)
            time.sleep(0.1)
        assert probe.take_changes() == []
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(5)


def test_each_scrape_reads_the_page_anew_never_the_last_tick_s_rows() -> None:
    """Two ticks of the /metrics probe with the page changed between them: the second tick's
    rows are the new values (a finished scrape is never handed out again)."""
    page = _MetricsServer(("127.0.0.1", 0), _Page)
    page.release = threading.Event()
    threading.Thread(target=page.serve_forever, args=(0.05,), daemon=True).start()
    probe = ServerMetricsProbe(page.url, (WAITING,), timeout_s=5.0)
    try:
        page.text = f"# TYPE {WAITING} gauge\n{WAITING} 3.0\n"
        assert [m.value for m in probe.sample_server(1, 0.5)] == [3.0]
        page.text = f"# TYPE {WAITING} gauge\n{WAITING} 9.0\n"
        assert [m.value for m in probe.sample_server(2, 1.0)] == [9.0]
    finally:
        probe.close()
        page.shutdown()
        page.server_close()


# in a pid namespace of its own (so a pid can be handed out again on purpose): a server on a
# port, probed; it dies, and a new process gets its very pid and listens on its port; prints
# the probe's changes as JSON
_REUSED = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from soakd.telemetry.server import ServerProcessProbe
    listen = sys.argv[1]

    def start(port):
        p = subprocess.Popen([sys.executable, "-c", listen, str(port), "5"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        return p, int(p.stdout.readline())

    a, port = start(0)
    probe = ServerProcessProbe(a.pid, port=port)
    probe.sample({})
    a.kill()
    a.wait()
    time.sleep(0.05)  # a later create time (clock ticks of 10 ms)
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(a.pid - 1))
    b, _ = start(port)
    into = {}
    probe.sample(into)
    print(json.dumps({"a": a.pid, "b": b.pid, "rss": into.get("server_rss_bytes"),
                      "changes": [[c.kind, c.data] for c in probe.take_changes()]}))
    b.kill()
    """
)


def test_a_new_process_given_the_server_s_pid_is_a_replacement_not_the_server() -> None:
    """The server is its pid and create time: when it dies and a new process gets the same
    pid (made so in a pid namespace) and its port, that is a server_replaced event from the
    pid to itself, with two create times, and the new process is sampled."""
    from .test_server_followed import _HOLDER

    unshare = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]
    try:
        ok = subprocess.run([*unshare, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        pytest.skip("no user and pid namespaces here (unshare failed): a pid cannot be reused")
    out = subprocess.run([*unshare, sys.executable, "-c", _REUSED, _HOLDER],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["a"] == got["b"], got  # the pid was handed out again
    [(kind, data)] = got["changes"]
    assert kind == "server_replaced" and data["old_pid"] == data["new_pid"] == got["a"]
    assert data["new_created"] > data["old_created"]
    assert got["rss"] and got["rss"] > 5 * MIB
