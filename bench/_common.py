"""What every benchmark shares: the command line, the result record, percentiles, machine
facts, no-op settings and reading a run's frames back.

Every benchmark measures soakd *and* a baseline in the same process run (this machine is
shared and noisy), reports the ratio beside the absolute values, and writes one JSON
document (``BenchResult.to_json``) to ``--out``. Targets are reported as met or missed;
nothing here asserts them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA_VERSION = 1


def parse_args(description: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``--quick`` (a smoke version of a few seconds) and ``--out PATH`` (JSON results)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="a short smoke version (seconds)")
    p.add_argument("--out", type=Path, default=None, help="write the JSON results here")
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="folder for run databases (default: a temporary folder, removed afterwards)",
    )
    return p.parse_args(argv)


def machine() -> dict[str, Any]:
    """The facts that make a figure comparable: host, CPUs, load, Python, versions."""
    import psutil

    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    freq = psutil.cpu_freq()
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "processor": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_mhz": round(freq.current) if freq else None,
        "mem_total_bytes": psutil.virtual_memory().total,
        "loadavg": load,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "numpy": np.__version__,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@dataclass
class Target:
    """One target of the issue: ``value`` compared with ``limit`` by ``op``."""

    name: str
    value: float | None
    limit: float
    op: str  # "<=" or ">="
    unit: str
    note: str = ""

    @property
    def met(self) -> bool | None:
        if self.value is None or not math.isfinite(self.value):
            return None
        v = float(self.value)
        return v <= self.limit if self.op == "<=" else v >= self.limit

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "limit": self.limit,
            "op": self.op,
            "unit": self.unit,
            "met": self.met,
            "note": self.note,
        }


@dataclass
class BenchResult:
    """What one benchmark measured: flat ``metrics``, ``targets``, free-form ``rows``."""

    benchmark: str
    quick: bool
    params: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float | int | None] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    started_at: str = field(
        default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    )
    _t0: float = field(default_factory=time.perf_counter)

    def to_json(self) -> dict[str, Any]:
        return plain(
            {
                "schema": SCHEMA_VERSION,
                "benchmark": self.benchmark,
                "quick": self.quick,
                "started_at": self.started_at,
                "elapsed_s": round(time.perf_counter() - self._t0, 3),
                "machine": machine(),
                "params": self.params,
                "metrics": self.metrics,
                "targets": [t.to_dict() for t in self.targets],
                "rows": self.rows,
                "notes": self.notes,
            }
        )


def plain(v: Any) -> Any:
    """``v`` with numpy scalars as Python numbers and NaN/inf as None (valid JSON)."""
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [plain(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v == 0 or 1e-3 <= abs(v) < 1e6:
            return f"{v:.4g}"
        return f"{v:.3e}"
    return str(v)


def format_table(rows: Iterable[dict[str, Any]]) -> str:
    """A plain fixed-width table of dict rows (keys of the first row are the columns)."""
    rows = list(rows)
    if not rows:
        return ""
    cols = list(rows[0])
    cells = [[_fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(out)


def report(result: BenchResult, out: Path | None) -> dict[str, Any]:
    """Print the result as tables on stdout and write its JSON to ``out`` (if given)."""
    doc = result.to_json()
    w = sys.stdout.write
    w(f"\n== {result.benchmark}{' (quick)' if result.quick else ''} ==\n")
    if result.rows:
        w(format_table(result.rows) + "\n\n")
    w(format_table([{"metric": k, "value": v} for k, v in doc["metrics"].items()]) + "\n\n")
    if result.targets:
        trows = [
            {
                "target": t["name"],
                "value": t["value"],
                "limit": f"{t['op']} {_fmt(t['limit'])} {t['unit']}",
                "met": {True: "yes", False: "MISSED", None: "n/a"}[t["met"]],
            }
            for t in doc["targets"]
        ]
        w(format_table(trows) + "\n")
    for n in result.notes:
        w(f"note: {n}\n")
    w(f"elapsed {doc['elapsed_s']:.1f} s\n")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return doc


def pct(values: Sequence[float] | np.ndarray, q: float) -> float:
    """The ``q``-th percentile (0-100), NaN for no values."""
    a = np.asarray(values, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(np.percentile(a, q)) if a.size else math.nan


def noop_overrides(db: Path, *, fps: float, duration_s: float, warmup_s: float = 0.0) -> list[str]:
    """``--set`` overrides for a no-op run: the synthetic workload with every stage at 0 ms
    and no jitter (it still goes through the staged driver), the synthetic source at a
    small frame size (the harness, not the memcpy of a large frame, is what is measured)."""
    return [
        f"run.db={json.dumps(str(db))}",
        f"run.fps={fps}",
        f"run.duration={duration_s}",
        f"run.warmup_s={warmup_s}",
        "run.log_every=0",
        "run.stall_timeout_s=30",
        "workload.kind=synthetic",
        "workload.pre_ms=0",
        "workload.infer_ms=0",
        "workload.decode_ms=0",
        "workload.jitter=0",
        "source.kind=synthetic",
        "source.width=64",
        "source.height=48",
        "criteria.min_duration_s=0.1",
        "criteria.min_frames=1",
    ]


def frame_columns(db: Path, run_id: str, cols: Sequence[str]) -> dict[str, np.ndarray]:
    """Columns of a run's dispatched frames (ordered by frame_id) as float64 arrays."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            f"SELECT {', '.join(cols)} FROM frames WHERE run_id = ? AND skipped = 0 "
            "ORDER BY frame_id",
            (run_id,),
        ).fetchall()
    finally:
        conn.close()
    block = np.array(rows, dtype=np.float64).reshape(len(rows), len(cols))
    return {c: block[:, i] for i, c in enumerate(cols)}


def sample_columns(db: Path, run_id: str, cols: Sequence[str]) -> dict[str, np.ndarray]:
    """Columns of a run's telemetry samples (ordered by seq) as float64 arrays."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            f"SELECT {', '.join(cols)} FROM samples WHERE run_id = ? ORDER BY seq", (run_id,)
        ).fetchall()
    finally:
        conn.close()
    block = np.array(rows, dtype=np.float64).reshape(len(rows), len(cols))
    return {c: block[:, i] for i, c in enumerate(cols)}


def quiet_logs() -> None:
    """Keep soakd's structured logs to warnings, so a benchmark's table stays readable."""
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def bench_main(
    doc: str | None, run: Callable[[bool, Path], BenchResult], argv: Sequence[str] | None
) -> int:
    """The shared ``main``: parse, run in ``--workdir`` (or a temporary folder), report."""
    args = parse_args(doc or "", argv)
    quiet_logs()
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        report(run(args.quick, args.workdir), args.out)
        return 0
    with tempfile.TemporaryDirectory(prefix="soakd-bench-") as tmp:
        report(run(args.quick, Path(tmp)), args.out)
    return 0


#: bulk inserts of synthetic frames and (CPU-host) samples, the columns in this order
FRAME_SQL = (
    "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, t_dispatch, t_done, lateness_ms,"
    " grab_ms, pre_ms, infer_ms, decode_ms, total_ms, queue_len, frame_age_ms, e2e_ms,"
    " drop_count, stale_count, out_tokens, first, warmup, skipped)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
SAMPLE_SQL = (
    "INSERT INTO samples (run_id, seq, t, wall, lag_ms, tick_ms, rss_bytes, cpu_pct,"
    " sys_mem_used_bytes, sys_mem_total_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
