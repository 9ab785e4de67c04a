"""Telemetry on vs off: does sampling change what the workload measures?

Target (issue 2): the median ``infer_ms`` of the synthetic workload differs by under 2 %
with telemetry on and off.

Both arms are real paced soakd runs of the synthetic workload at its defaults (pre 2 ms,
infer 20 ms, decode 2 ms, lognormal jitter 5 %, fixed seed) at 30 fps. "On" is the run as
shipped with the sampler at 100 ms (the most frequent recommended rate); "off" replaces
the sampler with one that never starts (there is no setting for that: the benchmark swaps
``soakd.telemetry.sampler.Sampler``), so no probe runs and no sample is stored. Arms
alternate (off, on, off, on...) so drift on the machine hits both; the figure is the
relative difference of the medians over all frames of each arm after warm-up.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from unittest import mock

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench._common import BenchResult, Target, bench_main, frame_columns, pct

FPS = 30.0


class NullSampler:
    """A sampler that samples nothing: telemetry off."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.samples = 0
        self.skipped = 0
        self.cpu_ns = 0
        self.error = None
        self.disabled: dict[str, str] = {}

    def start(self) -> None:
        return None

    def stop(self, timeout: float = 5.0) -> None:
        return None

    @property
    def running(self) -> bool:
        return False


def one_run(db: Path, duration_s: float, telemetry: bool) -> tuple[np.ndarray, int]:
    """``infer_ms`` of the measured frames of one run, and how many samples it stored."""
    import sqlite3

    from soakd.config import load_settings
    from soakd.run.runner import run_soak

    settings = load_settings(
        overrides=[
            f"run.db={json.dumps(str(db))}",
            f"run.fps={FPS}",
            f"run.duration={duration_s}",
            "run.warmup_s=1",
            "run.log_every=0",
            "run.sample_interval_ms=100",
            "workload.kind=synthetic",
            "source.kind=synthetic",
        ]
    )
    if telemetry:
        res = run_soak(settings, judge=False)
    else:
        with mock.patch("soakd.run.runner.Sampler", NullSampler):
            res = run_soak(settings, judge=False)
    if res.status != "completed":
        raise RuntimeError(f"run ended {res.status}: {res.reason}")
    c = frame_columns(db, res.run_id, ["infer_ms", "warmup"])
    conn = sqlite3.connect(db)
    try:
        n_samples = conn.execute(
            "SELECT count(*) FROM samples WHERE run_id = ?", (res.run_id,)
        ).fetchone()[0]
    finally:
        conn.close()
    return c["infer_ms"][c["warmup"] == 0], int(n_samples)


def run(quick: bool, workdir: Path) -> BenchResult:
    duration = 2.0 if quick else 30.0
    reps = 1 if quick else 4
    res = BenchResult(
        "telemetry_overhead",
        quick,
        params={"fps": FPS, "duration_s": duration, "repetitions": reps, "sample_interval_ms": 100},
    )
    arms: dict[str, list[np.ndarray]] = {"off": [], "on": []}
    for rep in range(reps):
        for arm in ("off", "on"):
            infer, n_samples = one_run(workdir / f"tel-{arm}-{rep}.db", duration, arm == "on")
            if (arm == "on") != (n_samples > 0):
                raise RuntimeError(f"telemetry {arm} stored {n_samples} samples")
            arms[arm].append(infer)
            res.rows.append(
                {
                    "rep": rep,
                    "telemetry": arm,
                    "frames": int(infer.size),
                    "samples": n_samples,
                    "infer_p50_ms": pct(infer, 50),
                    "infer_p99_ms": pct(infer, 99),
                }
            )
    on = np.concatenate(arms["on"])
    off = np.concatenate(arms["off"])
    med_on, med_off = pct(on, 50), pct(off, 50)
    diff_pct = abs(med_on / med_off - 1.0) * 100
    res.metrics.update(
        infer_p50_on_ms=med_on,
        infer_p50_off_ms=med_off,
        infer_p99_on_ms=pct(on, 99),
        infer_p99_off_ms=pct(off, 99),
        median_diff_pct=diff_pct,
        frames_on=int(on.size),
        frames_off=int(off.size),
    )
    res.targets.append(Target("median infer_ms, telemetry on vs off", diff_pct, 2.0, "<=", "%"))
    return res


def main(argv: list[str] | None = None) -> int:
    return bench_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
