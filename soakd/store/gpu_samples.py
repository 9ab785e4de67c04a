"""The ``gpu_samples`` table: one row per GPU per telemetry tick of a run that uses several
GPUs (``run.gpus``), keyed ``(run_id, gpu, seq)``; ``seq`` joins with ``samples.seq``.

``gpu`` is the NVML index and ``uuid`` the GPU's UUID, as nvidia-smi and dcgm-exporter
name them, so rows join with a fleet's DCGM data. The ``samples`` table keeps the run's
primary GPU in its ``gpu_*`` columns as before. Rows are written by the run's one writer
(``soakd.store.db.StoreWriter``), batched with the rest; ``load_gpu_columns`` reads them
back as numpy columns per GPU for the analysis.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import numpy as np

from soakd.records import DeviceSample

TABLE = "gpu_samples"

#: the values of one GPU at one tick, in table order after the key
GPU_SAMPLE_FIELDS: tuple[str, ...] = (
    "mem_used_bytes",
    "mem_total_bytes",
    "util_pct",
    "proc_mem_bytes",
    "temp_c",
    "power_w",
)
GPU_SAMPLE_COLUMNS: tuple[str, ...] = ("run_id", "seq", "t", "gpu", "uuid", *GPU_SAMPLE_FIELDS)


def gpu_sample_values(d: DeviceSample) -> tuple[Any, ...]:
    """A GPU sample's values in the table's column order after ``run_id``."""
    return (
        d.seq,
        d.t,
        d.gpu,
        d.uuid,
        d.mem_used_bytes,
        d.mem_total_bytes,
        d.util_pct,
        d.proc_mem_bytes,
        d.temp_c,
        d.power_w,
    )


def gpu_uuids(conn: sqlite3.Connection, run_id: str) -> dict[int, str]:
    """The run's GPUs sampled apart: NVML index -> UUID (empty for a one-GPU run)."""
    rows = conn.execute(
        "SELECT gpu, min(uuid) FROM gpu_samples WHERE run_id = ? GROUP BY gpu ORDER BY gpu",
        (run_id,),
    )
    return {int(g): str(u) for g, u in rows}


#: what the analysis reads per GPU (memory_gpu[i]), besides ``t``: 16 bytes a tick in memory
GPU_METRICS: tuple[str, ...] = ("mem_used_bytes",)
CHUNK_ROWS = 100_000


def load_gpu_columns(conn: sqlite3.Connection, run_id: str) -> dict[int, dict[str, np.ndarray]]:
    """Per GPU (NVML index): ``t`` and GPU_METRICS as float64 arrays ordered by seq (NaN
    where NULL), fetched CHUNK_ROWS rows at a time straight into preallocated arrays (peak:
    the result plus one chunk); empty when the run sampled one GPU only."""
    return {gpu: _gpu_columns(conn, run_id, gpu) for gpu in gpu_uuids(conn, run_id)}


def _gpu_columns(conn: sqlite3.Connection, run_id: str, gpu: int) -> dict[str, np.ndarray]:
    names = ("t", *GPU_METRICS)
    (n,) = conn.execute(
        "SELECT count(*) FROM gpu_samples WHERE run_id = ? AND gpu = ?", (run_id, gpu)
    ).fetchone()
    out = {name: np.empty(int(n), dtype=np.float64) for name in names}
    cur = conn.cursor()
    cur.row_factory = None
    cur.execute(
        f"SELECT {', '.join(names)} FROM gpu_samples WHERE run_id = ? AND gpu = ? ORDER BY seq",
        (run_id, gpu),
    )
    pos = 0
    while pos < n and (rows := cur.fetchmany(min(CHUNK_ROWS, n - pos))):
        block = np.array(rows, dtype=np.float64).reshape(len(rows), len(names))
        for i, name in enumerate(names):
            out[name][pos : pos + len(rows)] = block[:, i]
        pos += len(rows)
    cur.close()
    return {name: a[:pos] for name, a in out.items()}
