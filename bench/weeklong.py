"""A week-long soak judged, reported and compared in bounded memory (issue 14).

Generates two synthetic 7-day runs at 30 fps (``week`` and ``week2``, each 18.1 M frames
and 6.05 M telemetry samples at 100 ms) and a 1-hour one straight into a real soakd run
database (the store's own schema, bulk inserts; not timed; cached under
``$SOAKD_WEEKLONG_CACHE``, default /tmp/soakd-weeklong, so reruns skip it). Then times,
each in a fresh child process with its wall time, CPU time (user + system) and peak RSS
(``ru_maxrss`` from ``wait4``), what a user runs on it: ``soakd gate`` (judge), ``soakd
report`` as md, json and html, and ``soakd compare week week2``, each ``--repeat`` times
(the figures are a range: the machine may be shared). Beside them: the exact path's cost
on a 1-day run it can still afford (the whole run loaded as arrays) and the agreement of
the two paths on that run (the bounded path forced on it).

    .venv/bin/python -m bench.weeklong                 # 7 days (generation ~5 min once)
    .venv/bin/python -m bench.weeklong --days 2        # a shorter long run
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench._common import FRAME_SQL, SAMPLE_SQL, _cpu_model

FPS = 30.0
SAMPLE_S = 0.1
WARMUP_S = 5.0
ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("SOAKD_WEEKLONG_CACHE", "/tmp/soakd-weeklong"))
LIMIT_S, LIMIT_MB = 120.0, 300.0  # the target for every command on the long run
MB = 1e6
CHUNK = 400_000


def _overrides(duration_s: float, db: Path) -> list[str]:
    return [
        f"run.db={json.dumps(str(db))}",
        f"run.fps={FPS}",
        f"run.duration={duration_s}",
        f"run.warmup_s={WARMUP_S}",
        "run.sample_interval_ms=100",
        "workload.kind=synthetic",
        "source.kind=synthetic",
    ]


def frame_rows(
    run_id: str, lo: int, n: int, rng: np.random.Generator, *, spike_every: int = 0,
    age_slope_ms_per_min: float = 0.0,
) -> list[tuple[Any, ...]]:  # fmt: skip
    """Frames ``lo`` .. ``lo + n - 1`` of a healthy staged run at 30 fps (infer ~20 ms with
    5 % lognormal jitter, a drop every ~10 k frames); ``spike_every``: every Nth frame's
    infer is 10x; ``age_slope_ms_per_min``: frame age grows (a model falling behind)."""
    fid = np.arange(lo, lo + n)
    t_sched = fid / FPS
    late = rng.exponential(0.1, n)
    grab = 0.3 + rng.exponential(0.05, n)
    t_capture = t_sched + (late + grab) / 1e3
    wait = rng.exponential(0.05, n) + age_slope_ms_per_min * t_sched / 60
    t_dispatch = t_capture + wait / 1e3
    pre = 2.0 * rng.lognormal(0, 0.05, n)
    infer = 20.0 * rng.lognormal(0, 0.05, n)
    if spike_every:
        infer[fid % spike_every == spike_every - 1] *= 10
    dec = 2.0 * rng.lognormal(0, 0.05, n)
    t_done = t_dispatch + (pre + infer + dec) / 1e3
    drops = lo // 10_000 + np.cumsum(rng.random(n) < 1e-4)
    cols = [
        [run_id] * n, fid, t_sched, t_capture, t_dispatch, t_done, late, grab, pre, infer,
        dec, grab + pre + infer + dec, np.ones(n, dtype=int), (t_dispatch - t_capture) * 1e3,
        (t_done - t_sched) * 1e3, drops, np.zeros(n, dtype=int), np.full(n, 8),
        (fid == 0).astype(int), (t_capture < WARMUP_S).astype(int), np.zeros(n, dtype=int),
    ]  # fmt: skip
    return list(zip(*(c if isinstance(c, list) else c.tolist() for c in cols), strict=True))  # type: ignore[attr-defined]


def sample_rows(
    run_id: str, lo: int, m: int, rng: np.random.Generator, t0_wall: float,
    leak_mb_per_min: float = 0.0,
) -> list[tuple[Any, ...]]:  # fmt: skip
    """Samples ``lo`` .. ``lo + m - 1`` at 100 ms: RSS flat at 300 MB under a 20 MB, 60 s
    allocator sawtooth (plus ``leak_mb_per_min``), CPU and host memory."""
    seq = np.arange(lo, lo + m)
    t = seq * SAMPLE_S + rng.exponential(0.0002, m)
    saw = 20 * MB * ((t % 60.0) / 60.0)
    rss = 300 * MB + saw + leak_mb_per_min * MB * t / 60 + rng.normal(0, 0.2 * MB, m)
    cols = [
        [run_id] * m, seq, t, t0_wall + t, rng.exponential(0.2, m),
        0.3 + rng.exponential(0.05, m), rss.astype(np.int64), 50 + rng.normal(0, 2, m),
        np.full(m, 4_000_000_000), np.full(m, 8_000_000_000),
    ]  # fmt: skip
    return list(zip(*(c if isinstance(c, list) else c.tolist() for c in cols), strict=True))  # type: ignore[attr-defined]


def add_run(
    conn: sqlite3.Connection, run_id: str, duration_s: float, *, seed: int = 0,
    started_unix: float = 1_790_000_000.0, overrides: Sequence[str] = (),
    workload: dict[str, Any] | None = None, **faults: float,
) -> None:  # fmt: skip
    """One completed synthetic run of ``duration_s`` at 30 fps into the open database
    (``faults``: ``spike_every``, ``age_slope_ms_per_min``, ``leak_mb_per_min``;
    ``overrides``: more config settings; ``workload``: the stored workload description)."""
    from soakd.config import load_settings
    from soakd.store import db as store
    from soakd.store.runs import NewRun, close_run, open_run

    settings = load_settings(overrides=[*_overrides(duration_s, Path("unused.db")), *overrides])
    run = NewRun(
        id=run_id, name=run_id, mode="soak", workload_kind="synthetic", fps=FPS,
        config=settings.to_dict(), config_hash=settings.config_hash(), workload=workload or {},
        environment={},
    )  # fmt: skip
    n, m = int(duration_s * FPS), int(duration_s / SAMPLE_S)
    summary = {"frames_captured": n, "drops": 0, "queued_at_end": 0, "in_flight_at_end": 0}
    with store.atomic(conn):
        open_run(conn, run, started_unix)
        close_run(conn, run_id, status="completed", reason=None,
                  ended_unix=started_unix + duration_s, duration_s=duration_s,
                  summary=summary)  # fmt: skip
    rng = np.random.default_rng(seed)
    frame_kw = {k: faults[k] for k in ("spike_every", "age_slope_ms_per_min") if k in faults}
    for lo in range(0, n, CHUNK):
        rows = frame_rows(run_id, lo, min(CHUNK, n - lo), rng, **frame_kw)  # type: ignore[arg-type]
        with store.atomic(conn):
            conn.executemany(FRAME_SQL, rows)
    leak = float(faults.get("leak_mb_per_min", 0.0))
    for lo in range(0, m, CHUNK):
        rows = sample_rows(run_id, lo, min(CHUNK, m - lo), rng, started_unix, leak)
        with store.atomic(conn):
            conn.executemany(SAMPLE_SQL, rows)
    with store.atomic(conn):
        conn.executemany(
            "INSERT INTO events (run_id, t, wall, kind, message) VALUES (?, ?, ?, ?, ?)",
            [(run_id, WARMUP_S, started_unix + WARMUP_S, "warmup_end", "warm-up ended"),
             (run_id, duration_s, started_unix + duration_s, "end", "completed")],
        )  # fmt: skip


def make_db(path: Path, days: float) -> None:
    """The benchmark database: ``week`` and ``week2`` (``days`` long each) and ``hour``."""
    from soakd.store import db as store

    tmp = path.with_suffix(".partial")
    for p in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        p.unlink(missing_ok=True)
    conn = store.connect(tmp)
    conn.execute("PRAGMA synchronous = OFF")
    add_run(conn, "week", days * 86400.0, seed=1)
    add_run(conn, "hour", 3600.0, seed=2, started_unix=1_790_900_000.0)
    _add_week2(conn, days)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    tmp.rename(path)


def _add_week2(conn: sqlite3.Connection, days: float) -> None:
    """The second long run ``soakd compare`` reads (same config, another seed)."""
    add_run(conn, "week2", days * 86400.0, seed=3, started_unix=1_790_800_000.0)


def ensure_db(path: Path, days: float) -> float | None:
    """Generate ``path`` unless cached (a cache from before ``week2`` gets it); seconds."""
    t = time.perf_counter()
    if not path.exists():
        make_db(path, days)
        return time.perf_counter() - t
    conn = sqlite3.connect(path)
    try:
        if conn.execute("SELECT 1 FROM runs WHERE id = 'week2'").fetchone():
            return None
        conn.execute("PRAGMA synchronous = OFF")
        _add_week2(conn, days)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return time.perf_counter() - t


#: runs ``python -m soakd ARGS`` and, at exit, writes the process's own peak RSS (VmHWM:
#: ``ru_maxrss`` would also count the image it was forked from, this benchmark's)
_WRAP = (
    "import atexit, os, runpy, sys\n"
    "def hwm():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            open(os.environ['SOAKD_BENCH_HWM'], 'w').write(line.split()[1])\n"
    "atexit.register(hwm)\n"
    "sys.argv = ['soakd', *sys.argv[1:]]\n"
    "runpy.run_module('soakd', run_name='__main__', alter_sys=True)\n"
)


def _cli(args: list[str]) -> dict[str, Any]:
    """One ``soakd`` command in a fresh process: wall time, CPU time (user + system, from
    ``wait4``), exit code, peak RSS (its own VmHWM) and the load average when it ended."""
    hwm = CACHE / "out" / "hwm"
    hwm.unlink(missing_ok=True)
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRAP, *args], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, env={**os.environ, "SOAKD_BENCH_HWM": str(hwm)},
    )  # fmt: skip
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    err = proc.stderr.read().decode() if proc.stderr else ""
    rss = int(hwm.read_text()) / 1024 if hwm.exists() else float("nan")
    return {"wall_s": round(wall, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "rc": os.waitstatus_to_exitcode(status), "peak_rss_mb": round(rss),
            "load1": round(os.getloadavg()[0], 2), "stderr": err.strip()[-300:]}  # fmt: skip


def _agreement(db: Path) -> dict[str, Any]:
    """Judge ``week`` of ``db`` on both paths in this process; the verdicts' agreement."""
    from soakd.analysis import criteria_of, judge
    from soakd.analysis.data import load_run_data

    conn = sqlite3.connect(db)
    out: dict[str, Any] = {}
    verdicts = []
    for path in ("exact", "bounded"):
        t = time.perf_counter()
        data = load_run_data(conn, "week", bounded=path == "bounded")
        verdicts.append(judge(data, criteria_of(data)[0]))
        out[f"{path}_load_judge_s"] = time.perf_counter() - t
    conn.close()
    exact, streamed = verdicts
    diffs = []
    for ce, cb in zip(exact.criteria, streamed.criteria, strict=True):
        a, b = ce.value, cb.value
        if (
            ce.status != cb.status
            or (a is None) != (b is None)
            or (a is not None and b is not None and abs(a - b) > 1e-6 * max(abs(a), abs(b), 1e-300))
        ):
            diffs.append(ce.criterion)
    out.update(exact=exact.status, bounded=streamed.status, differing_criteria=diffs)
    return out


def commands(db: Path, tmp: Path, compare: bool) -> dict[str, list[str]]:
    """What is timed on the run ``week`` of ``db``: ``soakd gate``, ``soakd report`` (md,
    json, html) and, with ``compare``, ``soakd compare week week2`` (the path as
    ``use_bounded`` chooses it)."""
    rows = {"gate": ["gate", "week", "--db", str(db)]}
    for fmt in ("md", "json", "html"):
        out = tmp / f"week.{fmt}"
        rows[f"report {fmt}"] = ["report", "week", "--db", str(db), "-f", fmt, "-o", str(out)]
    if compare:
        out = tmp / "compare.md"
        rows["compare"] = ["compare", "week", "week2", "--db", str(db), "-o", str(out)]
    return rows


def measure(db: Path, tmp: Path, repeat: int, compare: bool = True) -> dict[str, Any]:
    """Each command ``repeat`` times (interleaved), and each figure's range."""
    cmds = commands(db, tmp, compare)
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in cmds}
    for _ in range(repeat):
        for name, args in cmds.items():
            runs[name].append(_cli(args))
    out: dict[str, Any] = {}
    for name, rs in runs.items():
        out[name] = {k: [min(r[k] for r in rs), max(r[k] for r in rs)]
                     for k in ("wall_s", "cpu_s", "peak_rss_mb", "load1")}  # fmt: skip
        out[name]["rc"] = sorted({r["rc"] for r in rs})
        out[name]["stderr"] = next((r["stderr"] for r in rs if r["stderr"]), "")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--days", type=float, default=7.0, help="length of the long runs (days)")
    p.add_argument("--repeat", type=int, default=2, help="times each command is run")
    p.add_argument("--out", type=Path, default=None, help="write the JSON figures here")
    a = p.parse_args(argv)
    (CACHE / "out").mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {"cpu": _cpu_model(), "cpu_count": os.cpu_count(),
                               "load_before": os.getloadavg()}  # fmt: skip
    for days in sorted({1.0, a.days}):
        took = ensure_db(CACHE / f"run-{days:g}d.db", days)
        if took is not None:
            figures[f"generated_{days:g}d_s"] = round(took, 1)
    tmp = CACHE / "out"
    figures["long"] = measure(CACHE / f"run-{a.days:g}d.db", tmp, a.repeat)
    # under BOUNDED_ROWS: the exact path, once
    figures["1 day"] = measure(CACHE / "run-1d.db", tmp, 1, compare=False)
    figures["agreement_1d"] = _agreement(CACHE / "run-1d.db")
    figures["load_after"] = os.getloadavg()
    text = json.dumps(figures, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text)
    ok = all(
        r["peak_rss_mb"][1] <= LIMIT_MB and r["wall_s"][1] <= LIMIT_S
        for r in figures["long"].values()
    )
    return 0 if ok and not figures["agreement_1d"]["differing_criteria"] else 1


if __name__ == "__main__":
    sys.exit(main())
