"""Store: frame-row insert throughput of ``StoreWriter`` against raw ``sqlite3.executemany``.

Target (issue 2): soakd's writer inserts frame rows at >= 0.8x the rate of a raw
``executemany`` of the same rows into the same schema in WAL mode, measured in the same run.

soakd's figure is wall time from the first ``put`` to ``close()`` returning (the rows are
converted, queued, batched and committed by the writer thread); the baseline is one
``executemany`` of the already-built row tuples in a single transaction (the fastest a
hand-rolled logger could go). Repetitions alternate (raw, soakd, raw, soakd...) so that a
noisy neighbour hurts both; medians are reported.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BenchResult, Target, bench_main
from soakd.records import FrameRecord
from soakd.store import db as store
from soakd.store.runs import NewRun, open_run
from soakd.store.schema import FRAME_COLUMNS

RUN_ID = "bench-store"


def make_records(n: int, fps: float = 30.0) -> list[FrameRecord]:
    """``n`` realistic frame records (every timing column filled, as a staged run makes)."""
    period = 1.0 / fps
    out = []
    for i in range(n):
        t = i * period
        out.append(
            FrameRecord(
                frame_id=i,
                t_sched=t,
                t_capture=t + 0.0004,
                t_dispatch=t + 0.0005,
                t_done=t + 0.0255,
                lateness_ms=0.05 + (i % 7) * 0.01,
                grab_ms=0.35,
                pre_ms=2.0 + (i % 5) * 0.1,
                infer_ms=20.0 + (i % 11) * 0.3,
                decode_ms=2.0,
                total_ms=24.35,
                queue_len=1,
                frame_age_ms=0.1,
                e2e_ms=25.5,
                drop_count=i // 1000,
                stale_count=0,
                out_tokens=8,
                first=i == 0,
                warmup=i < 150,
            )
        )
    return out


def fresh_db(path: Path) -> None:
    """A run database with soakd's schema and one ``runs`` row."""
    conn = store.connect(path)
    run = NewRun(RUN_ID, None, "soak", "synthetic", None, {}, "bench", {}, {})
    open_run(conn, run, time.time())
    conn.close()


def time_soakd(path: Path, records: list[FrameRecord]) -> float:
    """Seconds from the first ``put`` to ``close()`` returning."""
    writer = store.StoreWriter(path, RUN_ID)
    writer.start()
    t0 = time.perf_counter()
    put = writer.put
    for r in records:
        put(r)
    writer.close(timeout=600)
    dt = time.perf_counter() - t0
    if writer.error is not None:
        raise RuntimeError(f"store writer failed: {writer.error}")
    if writer.rows_written != len(records):
        raise RuntimeError(f"writer wrote {writer.rows_written} of {len(records)} rows")
    return dt


def time_raw(path: Path, rows: list[tuple[object, ...]]) -> float:
    """Seconds for one ``executemany`` of prebuilt tuples in one transaction (WAL, NORMAL)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    sql = (
        f"INSERT INTO frames ({', '.join(FRAME_COLUMNS)}) "
        f"VALUES ({', '.join('?' * len(FRAME_COLUMNS))})"
    )
    t0 = time.perf_counter()
    conn.execute("BEGIN")
    conn.executemany(sql, rows)
    conn.execute("COMMIT")
    dt = time.perf_counter() - t0
    conn.close()
    return dt


def count_rows(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT count(*) FROM frames").fetchone()[0])
    finally:
        conn.close()


def run(quick: bool, workdir: Path) -> BenchResult:
    n = 5_000 if quick else 200_000
    reps = 1 if quick else 3
    res = BenchResult("store", quick, params={"rows": n, "repetitions": reps})
    records = make_records(n)
    rows = [store.frame_row(RUN_ID, r) for r in records]
    raw_s: list[float] = []
    soakd_s: list[float] = []
    for rep in range(reps):
        for kind in ("raw", "soakd"):
            path = workdir / f"store-{kind}-{rep}.db"
            fresh_db(path)
            dt = time_raw(path, rows) if kind == "raw" else time_soakd(path, records)
            if count_rows(path) != n:
                raise RuntimeError(f"{kind}: {path} holds the wrong number of rows")
            (raw_s if kind == "raw" else soakd_s).append(dt)
            res.rows.append({"rep": rep, "writer": kind, "seconds": dt, "rows_per_s": n / dt})
    raw_med = sorted(raw_s)[len(raw_s) // 2]
    soakd_med = sorted(soakd_s)[len(soakd_s) // 2]
    ratio = raw_med / soakd_med  # soakd throughput / raw throughput
    res.metrics.update(
        raw_rows_per_s=n / raw_med,
        soakd_rows_per_s=n / soakd_med,
        raw_us_per_row=raw_med / n * 1e6,
        soakd_us_per_row=soakd_med / n * 1e6,
        throughput_ratio=ratio,
    )
    res.targets.append(
        Target("frame-row throughput, soakd / raw executemany", ratio, 0.8, ">=", "x")
    )
    return res


def main(argv: list[str] | None = None) -> int:
    return bench_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
