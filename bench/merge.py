"""Merge: ``soakd.store.merge`` against a raw SQLite copy of the same tables.

Target (issue 13): merging run databases from many hosts (``soakd merge OUT IN...``) goes
at >= 0.8x the speed of the plainest copy SQLite can do of the same rows, measured in the
same process: two databases of 100 k frames + 30 k samples each (4 runs apiece, with labels,
events and verdicts) merged into a new file.

soakd's figure is wall time for the whole ``merge(out, [a, b])``: checking both inputs,
creating and migrating the output, ATTACHing each input read-only, classifying its runs and
copying them (one transaction per input). The baseline is a fresh output with the schema
already made and, per input, ATTACH + one ``INSERT INTO main.T SELECT ... FROM src.T`` per
table in one transaction: no checks, no classification. Repetitions alternate (raw, soakd,
raw, soakd...) so that a noisy neighbour hurts both; medians are reported.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench._common import BenchResult, Target, bench_main
from bench.dbsize import make_frames, make_samples
from soakd.records import FrameRecord, Sample
from soakd.store import db as store
from soakd.store.merge import CHILD_TABLES, merge
from soakd.store.runs import NewRun, close_run, open_run, set_verdict
from soakd.store.schema import FRAME_COLUMNS, SAMPLE_COLUMNS

RUNS_PER_DB = 4
TABLES = ("runs", *CHILD_TABLES, "baselines")


def _insert(conn: sqlite3.Connection, table: str, cols: tuple[str, ...], rows: list[tuple]) -> None:
    marks = ", ".join("?" * len(cols))
    conn.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})", rows)


def make_input(
    path: Path, host: str, frames: list[FrameRecord], samples: list[Sample]
) -> list[str]:
    """A run database from ``host``: ``RUNS_PER_DB`` closed, judged, labelled runs sharing
    ``frames`` and ``samples`` between them, each with a few events and verdict rows."""
    conn = store.connect(path)
    per_f, per_s = len(frames) // RUNS_PER_DB, len(samples) // RUNS_PER_DB
    ids = [f"20261203T12{k:02d}00-{host}" for k in range(RUNS_PER_DB)]
    with store.atomic(conn):
        for k, rid in enumerate(ids):
            mine = frames[k * per_f : (k + 1) * per_f], samples[k * per_s : (k + 1) * per_s]
            _add_run(conn, rid, host, float(k), *mine)
    conn.close()
    return ids


def _add_run(
    conn: sqlite3.Connection,
    rid: str,
    host: str,
    started: float,
    frames: list[FrameRecord],
    samples: list[Sample],
) -> None:
    labels = {"release": "1.4.0", "cell": f"c{int(started)}"}
    open_run(conn, NewRun(rid, None, "soak", "synthetic", 30.0, {}, "b", {}, {}, labels), started)
    conn.execute("UPDATE runs SET host = ? WHERE id = ?", (host, rid))
    _insert(conn, "frames", FRAME_COLUMNS, [store.frame_row(rid, f) for f in frames])
    _insert(conn, "samples", SAMPLE_COLUMNS, [store.sample_row(rid, s) for s in samples])
    conn.executemany(
        "INSERT INTO events (run_id, t, wall, kind, message) VALUES (?, ?, ?, ?, ?)",
        [(rid, float(i), 0.0, kind, kind) for i, kind in enumerate(("start", "end"))],
    )
    conn.executemany(
        "INSERT INTO verdicts (run_id, criterion, status) VALUES (?, ?, 'pass')",
        [(rid, f"criterion_{i}") for i in range(8)],
    )
    end = started + 60.0
    close_run(conn, rid, status="completed", reason=None, ended_unix=end, duration_s=60.0,
              summary={})  # fmt: skip
    set_verdict(conn, rid, "PASS", 0)


def time_soakd(out: Path, inputs: list[Path]) -> float:
    """Seconds for ``merge(out, inputs)`` into a new file, checks and migration included."""
    t0 = time.perf_counter()
    results = list(merge(out, inputs))
    dt = time.perf_counter() - t0
    if sum(len(r.runs["added"]) for r in results) != RUNS_PER_DB * len(inputs):
        raise RuntimeError("soakd merge did not add every run")
    return dt


def time_raw(out: Path, inputs: list[Path]) -> float:
    """Seconds for ATTACH + one ``INSERT ... SELECT`` per table per input, into a fresh
    output whose schema is made beforehand (not timed)."""
    store.connect(out).close()
    conn = sqlite3.connect(f"file:{out}", uri=True, isolation_level=None)
    conn.execute("PRAGMA synchronous=NORMAL")
    cols = {t: [str(r[1]) for r in conn.execute(f"PRAGMA table_info({t})")] for t in TABLES}
    cols["events"].remove("id")
    t0 = time.perf_counter()
    for path in inputs:
        conn.execute("ATTACH DATABASE ? AS src", (f"file:{path}?mode=ro",))
        conn.execute("BEGIN IMMEDIATE")
        for t in TABLES:
            names = ", ".join(cols[t])
            conn.execute(f"INSERT INTO main.{t} ({names}) SELECT {names} FROM src.{t}")
        conn.execute("COMMIT")
        conn.execute("DETACH DATABASE src")
    dt = time.perf_counter() - t0
    conn.close()
    return dt


def counts(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        return {t: int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in TABLES}
    finally:
        conn.close()


def run(quick: bool, workdir: Path) -> BenchResult:
    n_frames, n_samples = (5_000, 1_500) if quick else (100_000, 30_000)
    reps = 1 if quick else 3
    res = BenchResult(
        "merge",
        quick,
        params={
            "databases": 2,
            "runs_per_db": RUNS_PER_DB,
            "frames_per_db": n_frames,
            "samples_per_db": n_samples,
            "repetitions": reps,
        },
    )
    rng = np.random.default_rng(13)
    frames, samples = make_frames(n_frames, rng), make_samples(n_samples, rng, gpu=True)
    inputs = [workdir / f"node{i}.db" for i in (1, 2)]
    for i, path in enumerate(inputs, 1):
        make_input(path, f"node{i}", frames, samples)
    want = {t: sum(counts(p)[t] for p in inputs) for t in TABLES}
    times: dict[str, list[float]] = {"raw": [], "soakd": []}
    for rep in range(reps):
        for kind in ("raw", "soakd"):
            out = workdir / f"merged-{kind}-{rep}.db"
            dt = time_raw(out, inputs) if kind == "raw" else time_soakd(out, inputs)
            if counts(out) != want:
                raise RuntimeError(f"{kind}: {out} holds {counts(out)}, not {want}")
            times[kind].append(dt)
            rows = sum(want.values())
            res.rows.append({"rep": rep, "copy": kind, "seconds": dt, "rows_per_s": rows / dt})
    raw_med, soakd_med = (sorted(v)[len(v) // 2] for v in (times["raw"], times["soakd"]))
    ratio = raw_med / soakd_med  # soakd speed / raw speed
    res.metrics.update(rows=sum(want.values()), raw_s=raw_med, soakd_s=soakd_med,
                       speed_ratio=ratio)  # fmt: skip
    res.targets.append(Target("merge speed, soakd / raw INSERT ... SELECT", ratio, 0.8, ">=", "x"))
    return res


def main(argv: list[str] | None = None) -> int:
    return bench_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
