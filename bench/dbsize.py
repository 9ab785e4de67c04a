"""Database size: bytes per frame and per sample in a real soakd database, what a run of a
given length takes on disk, and what pruning it costs.

Issue 14 asks for the figures to be documented (databases live for months) and for
``soakd prune`` with VACUUM. Method: frame and sample records with the values a synthetic
soak stores (times from nanosecond clocks, stage times with lognormal jitter, a sawtooth
RSS; samples of a CPU host with the GPU columns NULL, and of a GPU host with every column
filled) are written by soakd's own ``StoreWriter`` into a fresh database, one run of an
hour at 30 fps with a sample every 150 ms. Each table and index is measured with SQLite's
``dbstat`` (pages in use, bytes), the file with its size. Baseline, same run: the same row
tuples in plain tables without keys or indexes (what SQLite needs for the values alone).
Then a second run of the same size is deleted with ``soakd.store.prune`` and the file
VACUUMed, both timed (how long prune holds the write lock), against copying the file.
The projection to 10 minutes, 24 hours and 7 days at 30 fps and 150 ms is rows × measured
bytes per row.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench._common import BenchResult, Target, bench_main
from soakd.records import FrameRecord, Sample
from soakd.store import db as store
from soakd.store import prune
from soakd.store.runs import NewRun, close_run, open_run
from soakd.store.schema import FRAME_COLUMNS, SAMPLE_COLUMNS

FPS = 30.0
SAMPLE_S = 0.150
RUN_ID = "20261203T120000-3f2a9c"  # the shape of a real run id: it is in every row
TWIN_ID = "20261203T130000-9b1d07"
MB = 1e6
GB = 1e9
PROJECTIONS = {"10 min": 600.0, "24 h": 86_400.0, "7 days": 7 * 86_400.0}


def _ns(rng: np.random.Generator, mean_ms: float, n: int, sigma: float = 0.05) -> np.ndarray:
    """Durations in whole nanoseconds (as soakd measures them), lognormal around a mean."""
    return np.round(mean_ms * 1e6 * rng.lognormal(0.0, sigma, n)).astype(np.int64)


def make_frames(n: int, rng: np.random.Generator) -> list[FrameRecord]:
    """``n`` frames of a staged synthetic soak at 30 fps: every column such a run fills."""
    sched = np.round(np.arange(n) * 1e9 / FPS).astype(np.int64)
    late, grab = _ns(rng, 0.08, n, 0.6), _ns(rng, 0.12, n, 0.2)
    pre, infer, dec = _ns(rng, 2.1, n), _ns(rng, 20.0, n), _ns(rng, 2.2, n)
    cap = sched + late + grab
    disp = cap + _ns(rng, 0.08, n, 0.3)
    done = disp + pre + infer + dec
    drops = np.cumsum(rng.random(n) < 1e-4)
    return [
        FrameRecord(
            frame_id=i,
            t_sched=int(sched[i]) / 1e9,
            t_capture=int(cap[i]) / 1e9,
            t_dispatch=int(disp[i]) / 1e9,
            t_done=int(done[i]) / 1e9,
            lateness_ms=int(late[i]) / 1e6,
            grab_ms=int(grab[i]) / 1e6,
            pre_ms=int(pre[i]) / 1e6,
            infer_ms=int(infer[i]) / 1e6,
            decode_ms=int(dec[i]) / 1e6,
            total_ms=int(grab[i] + pre[i] + infer[i] + dec[i]) / 1e6,
            queue_len=1,
            frame_age_ms=int(disp[i] - cap[i]) / 1e6,
            e2e_ms=int(done[i] - sched[i]) / 1e6,
            drop_count=int(drops[i]),
            stale_count=0,
            out_tokens=1,
            first=i == 0,
            warmup=i < 15,
        )
        for i in range(n)
    ]


def make_samples(m: int, rng: np.random.Generator, *, gpu: bool) -> list[Sample]:
    """``m`` telemetry ticks every 150 ms: a CPU host's (GPU columns NULL) or a GPU host's
    (every column filled, as NVML and the torch allocator report them)."""
    t = np.round((np.arange(m) * SAMPLE_S + rng.exponential(2e-4, m)) * 1e9).astype(np.int64)
    saw = (20 * MB * ((t / 1e9) % 60.0) / 60.0).astype(np.int64)
    out = []
    for i in range(m):
        v: dict[str, float | int | None] = {
            "rss_bytes": 2_400_000_000 + int(saw[i]) // 4096 * 4096,
            "cpu_pct": round(float(rng.normal(95, 4)), 1),
            "sys_mem_used_bytes": 31_000_000_000 + int(rng.integers(0, 50_000_000)),
            "sys_mem_total_bytes": 270_000_000_000,
        }
        if gpu:
            v |= _gpu_values(rng, int(saw[i]))
        out.append(Sample(i, int(t[i]) / 1e9, 1_796_299_000 + int(t[i]) / 1e9, 0.2, 0.6, v))
    return out


def _gpu_values(rng: np.random.Generator, saw: int) -> dict[str, float | int | None]:
    used = 41_000_000_000 + saw // (1 << 20) * (1 << 20)
    return {
        "gpu_mem_used_bytes": used,
        "gpu_mem_total_bytes": 85_899_345_920,
        "gpu_util_pct": float(rng.integers(60, 100)),
        "gpu_mem_util_pct": float(rng.integers(20, 60)),
        "gpu_proc_mem_bytes": used - 500_000_000,
        "gpu_temp_c": float(rng.integers(55, 70)),
        "gpu_power_w": round(float(rng.normal(310, 20)), 3),
        "gpu_sm_clock_mhz": 1980,
        "torch_allocated_bytes": 38_000_000_000 + saw,
        "torch_reserved_bytes": 40_000_000_000 + saw // (1 << 21) * (1 << 21),
        "torch_max_allocated_bytes": 39_000_000_000,
        "torch_max_reserved_bytes": 40_960_000_000,
        "torch_alloc_retries": 0,
        "torch_ooms": 0,
    }


def write_run(path: Path, run_id: str, frames: list[FrameRecord], samples: list[Sample]) -> None:
    """One run's rows written the way a soak writes them: its row, StoreWriter, closed."""
    conn = store.connect(path)
    open_run(conn, NewRun(run_id, None, "soak", "synthetic", FPS, {}, "bench", {}, {}), 0.0)
    conn.close()
    writer = store.StoreWriter(path, run_id)
    writer.start()
    for frame in frames:
        writer.put(frame)
    for sample in samples:
        writer.put(sample)
    writer.close(timeout=600)
    if writer.error is not None or writer.rows_written != len(frames) + len(samples):
        raise RuntimeError(f"store writer: {writer.error or writer.rows_written}")
    conn = store.connect(path)
    with store.atomic(conn):
        close_run(conn, run_id, status="completed", reason=None, ended_unix=1.0,
                  duration_s=1.0, summary={})  # fmt: skip
    conn.close()


def dbstat(path: Path) -> dict[str, int]:
    """Bytes of the pages each table and index uses (``dbstat``), after a checkpoint."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        rows = conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall()
    finally:
        conn.close()
    return {str(name): int(size) for name, size in rows}


def raw_db(path: Path, frames: list[FrameRecord], samples: list[Sample]) -> dict[str, int]:
    """The same row tuples in plain rowid tables without keys or indexes: the baseline."""
    conn = sqlite3.connect(path, isolation_level=None)
    for table, cols, rows in (
        ("frames", FRAME_COLUMNS, [store.frame_row(RUN_ID, f) for f in frames]),
        ("samples", SAMPLE_COLUMNS, [store.sample_row(RUN_ID, s) for s in samples]),
    ):
        conn.execute(f"CREATE TABLE {table} ({', '.join(cols)})")
        conn.execute("BEGIN")
        conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(cols))})", rows)
        conn.execute("COMMIT")
    conn.close()
    return dbstat(path)


def vacuumed(path: Path, out: Path) -> dict[str, int]:
    """``dbstat`` of a VACUUMed copy: the packed size (what a pruned file holds)."""
    shutil.copyfile(path, out)
    conn = sqlite3.connect(out, isolation_level=None)
    conn.execute("VACUUM")
    conn.close()
    return dbstat(out)


def prune_cost(path: Path, frames: list[FrameRecord], samples: list[Sample]) -> dict[str, float]:
    """Delete a second run of the same size with ``soakd.store.prune`` and VACUUM, each
    timed, against copying the file (the I/O floor of a rewrite)."""
    write_run(path, TWIN_ID, frames, samples)
    size = path.stat().st_size
    t0 = time.perf_counter()
    shutil.copyfile(path, path.with_suffix(".copy"))
    copy_s = time.perf_counter() - t0
    path.with_suffix(".copy").unlink()
    conn = store.connect(path)
    todo = [r for r in prune.plan(conn, prune.Policy(keep_runs=0)).delete if r.id == TWIN_ID]
    t0 = time.perf_counter()
    prune.delete_runs(conn, todo)
    delete_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    done = prune.vacuum(conn)
    vacuum_s = time.perf_counter() - t0
    conn.close()
    if not done.done:
        raise RuntimeError(f"VACUUM skipped: {done.skipped}")
    after = path.stat().st_size
    rows = len(frames) + len(samples)
    return {
        "delete_s": delete_s,
        "delete_rows_per_s": rows / delete_s,
        "vacuum_s": vacuum_s,
        "vacuum_mb_per_s": after / MB / vacuum_s,
        "copy_mb_per_s": size / MB / copy_s,
        "file_mb_before": size / MB,
        "file_mb_after": after / MB,
    }


def measure_host(
    workdir: Path, host: str, frames: list[FrameRecord], samples: list[Sample]
) -> dict[str, dict[str, int]]:
    """``dbstat`` of soakd's database, of the plain-table baseline and of a VACUUMed copy,
    for one set of samples (``host``: cpu or gpu)."""
    soakd_db = workdir / f"dbsize-{host}.db"
    write_run(soakd_db, RUN_ID, frames, samples)
    return {
        "soakd": dbstat(soakd_db),
        "raw": raw_db(workdir / f"dbsize-{host}-raw.db", frames, samples),
        "vacuumed": vacuumed(soakd_db, workdir / f"dbsize-{host}-vacuumed.db"),
    }


def real_soak(workdir: Path, seconds: float) -> dict[str, Any]:
    """A real synthetic soak at 30 fps, 150 ms sampling, measured the same way: the check
    that the generated rows above are the ones soakd stores."""
    from soakd.config import load_settings
    from soakd.run.runner import run_soak

    db = workdir / "dbsize-real.db"
    over = [f"run.db={json.dumps(str(db))}", f"run.fps={FPS}", f"run.duration={seconds}",
            f"run.sample_interval_ms={SAMPLE_S * 1000}", "run.log_every=0",
            "workload.kind=synthetic", "source.kind=synthetic"]  # fmt: skip
    res = run_soak(load_settings(overrides=over), judge=False)
    conn = sqlite3.connect(db)
    n, m = (
        conn.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", (res.run_id,)).fetchone()[0]
        for t in ("frames", "samples")
    )
    conn.close()
    return _row("cpu", f"real soak {seconds:g} s", dbstat(db), n, m)


def run(quick: bool, workdir: Path) -> BenchResult:
    seconds = 60.0 if quick else 3600.0
    n, m = int(seconds * FPS), int(seconds / SAMPLE_S)
    params = {"frames": n, "samples": m, "fps": FPS, "sample_interval_s": SAMPLE_S}
    res = BenchResult("dbsize", quick, params=params)
    rng = np.random.default_rng(14)
    frames = make_frames(n, rng)
    samples = {h: make_samples(m, rng, gpu=h == "gpu") for h in ("cpu", "gpu")}
    per: dict[str, float] = {}
    for host in ("cpu", "gpu"):
        for kind, sizes in measure_host(workdir, host, frames, samples[host]).items():
            row = _row(host, kind, sizes, n, m)
            res.rows.append(row)
            per[f"{host}_{kind}_frame"] = row["bytes_per_frame"]
            per[f"{host}_{kind}_sample"] = row["bytes_per_sample"]
    res.rows.append(real_soak(workdir, 3.0 if quick else 60.0))
    cost = prune_cost(workdir / "dbsize-gpu.db", frames, samples["gpu"])
    _metrics(res, per, cost)
    return res


def _row(host: str, kind: str, sizes: dict[str, int], n: int, m: int) -> dict[str, Any]:
    return {
        "samples_of": host,
        "database": kind,
        "frames_mb": sizes["frames"] / MB,
        "samples_mb": sizes["samples"] / MB,
        "bytes_per_frame": sizes["frames"] / n,
        "bytes_per_sample": sizes["samples"] / m,
        "total_mb": sum(sizes.values()) / MB,
    }


def projection(seconds: float, bpf: float, bps: float) -> dict[str, Any]:
    """A run of ``seconds`` at 30 fps with a sample every 150 ms, at the measured sizes."""
    frames_b, samples_b = seconds * FPS * bpf, seconds / SAMPLE_S * bps
    return {"frames_mb": frames_b / MB, "samples_mb": samples_b / MB,
            "bytes_per_frame": bpf, "bytes_per_sample": bps,
            "total_mb": (frames_b + samples_b) / MB}  # fmt: skip


def _metrics(res: BenchResult, per: dict[str, float], cost: dict[str, float]) -> None:
    """Per-row figures, ratios to the baseline, projections, prune cost and the target."""
    bpf, bps = per["gpu_soakd_frame"], per["gpu_soakd_sample"]
    res.metrics |= {
        "bytes_per_frame": bpf,
        "bytes_per_sample_cpu": per["cpu_soakd_sample"],
        "bytes_per_sample_gpu": bps,
        "raw_bytes_per_frame": per["gpu_raw_frame"],
        "raw_bytes_per_sample_gpu": per["gpu_raw_sample"],
        "vacuumed_bytes_per_frame": per["gpu_vacuumed_frame"],
        "vacuumed_bytes_per_sample_gpu": per["gpu_vacuumed_sample"],
        "frame_ratio_to_raw": bpf / per["gpu_raw_frame"],
        "sample_ratio_to_raw_gpu": bps / per["gpu_raw_sample"],
    }
    for name, seconds in PROJECTIONS.items():
        row = projection(seconds, bpf, bps)
        res.rows.append({"samples_of": "gpu", "database": f"projected {name}", **row})
        res.metrics[f"projected_gb_{name.replace(' ', '_')}"] = row["total_mb"] * MB / GB
    res.metrics |= {f"prune_{k}": v for k, v in cost.items()}
    res.metrics["vacuum_ratio_to_copy"] = cost["vacuum_mb_per_s"] / cost["copy_mb_per_s"]
    ratio, why = res.metrics["frame_ratio_to_raw"], "clustered (run_id, frame_id) key, page fill"
    res.targets.append(Target("bytes per frame, soakd / plain table", ratio, 1.25, "<=", "x", why))


def main(argv: list[str] | None = None) -> int:
    return bench_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
