"""A week-long soak judged in bounded memory (issue 14).

Generates a synthetic 7-day run at 30 fps (18.1 M frames, 6.05 M telemetry samples at
100 ms) straight into a real soakd run database (the store's own schema, bulk inserts; not
timed; cached under /var/tmp so reruns skip it), plus a 1-hour run of the same config in
the same database. Then times, each in a fresh child process with its peak RSS (``VmHWM``),
what a user runs on it: ``soakd gate`` (judge), ``soakd report`` as md, json and html, and
``soakd compare`` (the week against the hour). Beside them: the exact path's cost on a run
it can still afford (``--exact-days``, default 1 day: the whole run loaded as arrays) and
the agreement of the two paths on that run (the bounded path forced on it).

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
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench._common import _cpu_model

FPS = 30.0
SAMPLE_S = 0.1
WARMUP_S = 5.0
ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("SOAKD_WEEKLONG_CACHE", "/var/tmp/soakd-weeklong"))
MB = 1e6
CHUNK = 400_000

_FRAME_SQL = (
    "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, t_dispatch, t_done, lateness_ms,"
    " grab_ms, pre_ms, infer_ms, decode_ms, total_ms, queue_len, frame_age_ms, e2e_ms,"
    " drop_count, stale_count, out_tokens, first, warmup, skipped)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_SAMPLE_SQL = (
    "INSERT INTO samples (run_id, seq, t, wall, lag_ms, tick_ms, rss_bytes, cpu_pct,"
    " sys_mem_used_bytes, sys_mem_total_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


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
    started_unix: float = 1_790_000_000.0, **faults: float,
) -> None:  # fmt: skip
    """One completed synthetic run of ``duration_s`` at 30 fps into the open database
    (``faults``: ``spike_every``, ``age_slope_ms_per_min``, ``leak_mb_per_min``)."""
    from soakd.config import load_settings
    from soakd.store import db as store
    from soakd.store.runs import NewRun, close_run, open_run

    settings = load_settings(overrides=_overrides(duration_s, Path("unused.db")))
    run = NewRun(
        id=run_id, name=run_id, mode="soak", workload_kind="synthetic", fps=FPS,
        config=settings.to_dict(), config_hash=settings.config_hash(), workload={},
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
            conn.executemany(_FRAME_SQL, rows)
    leak = float(faults.get("leak_mb_per_min", 0.0))
    for lo in range(0, m, CHUNK):
        rows = sample_rows(run_id, lo, min(CHUNK, m - lo), rng, started_unix, leak)
        with store.atomic(conn):
            conn.executemany(_SAMPLE_SQL, rows)
    with store.atomic(conn):
        conn.executemany(
            "INSERT INTO events (run_id, t, wall, kind, message) VALUES (?, ?, ?, ?, ?)",
            [(run_id, WARMUP_S, started_unix + WARMUP_S, "warmup_end", "warm-up ended"),
             (run_id, duration_s, started_unix + duration_s, "end", "completed")],
        )  # fmt: skip


def make_db(path: Path, days: float) -> None:
    """The benchmark database: ``week`` (``days`` long) and ``hour`` (one hour)."""
    from soakd.store import db as store

    tmp = path.with_suffix(".partial")
    for p in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        p.unlink(missing_ok=True)
    conn = store.connect(tmp)
    conn.execute("PRAGMA synchronous = OFF")
    add_run(conn, "week", days * 86400.0, seed=1)
    add_run(conn, "hour", 3600.0, seed=2, started_unix=1_790_900_000.0)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    tmp.rename(path)


def _cli(args: list[str]) -> dict[str, Any]:
    """One ``soakd`` command in a fresh process: wall time, exit code, peak RSS (its own
    ``ru_maxrss`` from ``wait4``)."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "soakd", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    err = proc.stderr.read().decode() if proc.stderr else ""
    return {"wall_s": wall, "rc": os.waitstatus_to_exitcode(status),
            "peak_rss_mb": usage.ru_maxrss / 1024, "stderr": err.strip()[-300:]}  # fmt: skip


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


def measure(db: Path, tmp: Path) -> dict[str, dict[str, Any]]:
    """``soakd gate`` and ``soakd report`` (md, json, html) on the run ``week`` of ``db``
    (the path as ``use_bounded`` chooses it)."""
    rows = {"gate": _cli(["gate", "week", "--db", str(db)])}
    for fmt in ("md", "json", "html"):
        out = tmp / f"week.{fmt}"
        args = ["report", "week", "--db", str(db), "--format", fmt, "-o", str(out)]
        rows[f"report {fmt}"] = _cli(args)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--days", type=float, default=7.0, help="length of the long run (days)")
    p.add_argument("--out", type=Path, default=None, help="write the JSON figures here")
    a = p.parse_args(argv)
    CACHE.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {"cpu": _cpu_model(), "cpu_count": os.cpu_count()}
    for days in sorted({1.0, a.days}):
        db = CACHE / f"run-{days:g}d.db"
        if not db.exists():
            t = time.perf_counter()
            make_db(db, days)
            figures[f"generated_{days:g}d_s"] = time.perf_counter() - t
    tmp = CACHE / "out"
    tmp.mkdir(exist_ok=True)
    figures["long"] = measure(CACHE / f"run-{a.days:g}d.db", tmp)
    figures["1 day"] = measure(CACHE / "run-1d.db", tmp)  # under BOUNDED_ROWS: exact path
    figures["agreement_1d"] = _agreement(CACHE / "run-1d.db")
    text = json.dumps(figures, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text)
    long_gate = next(iter(figures["long"].values()))
    ok = long_gate["peak_rss_mb"] <= 300 and long_gate["wall_s"] <= 120
    return 0 if ok and not figures["agreement_1d"]["differing_criteria"] else 1


if __name__ == "__main__":
    sys.exit(main())
