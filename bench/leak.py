"""Leak: soakd's own RSS over a long no-op run at 60 fps.

Target (issue 2): soakd's RSS grows by less than 2 MB (2,000,000 bytes) over a 30-minute
no-op run at 60 fps.

The run happens in a child process (``run_soak`` with the no-op workload, telemetry on,
frames and samples going to SQLite as in production). Growth is measured on the run's own
``samples.rss_bytes`` (every 150 ms): the floor (minimum) of the last window minus the
floor of the first window after a warm-up, so allocator noise and SQLite's bounded page
cache filling up do not count. The parent also samples the child's RSS from outside with
psutil (a cross-check of soakd's probe), and, as the baseline measured in the same run, the
RSS of a bare paced Python loop (same interpreter, numpy and sqlite3 imported, one 64x48
frame made per tick, nothing stored) running beside it.

``--workdir DIR --reanalyse`` analyses the run kept in DIR again without running anything.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench._common import (
    BenchResult,
    Target,
    bench_main,
    noop_overrides,
    sample_columns,
)

LIMIT_BYTES = 2_000_000
REANALYSE = False
ROOT = Path(__file__).resolve().parent.parent


def _child_soakd(db: Path, fps: float, duration_s: float, out: Path) -> int:
    """Child entry point: one paced no-op soak run; writes its run id to ``out``."""
    from soakd.config import load_settings
    from soakd.run.runner import run_soak

    settings = load_settings(overrides=noop_overrides(db, fps=fps, duration_s=duration_s))
    res = run_soak(settings, judge=False)
    out.write_text(json.dumps({"run_id": res.run_id, "status": res.status, **res.summary}))
    return 0 if res.status == "completed" else 1


def _child_bare(fps: float, duration_s: float) -> int:
    """Child entry point: the baseline, a bare absolute-deadline loop making one frame a
    tick (what any Python process at 60 fps costs, without soakd)."""
    import sqlite3  # noqa: F401  (imported so the baseline carries the same libraries)

    period = 1.0 / fps
    t0 = time.perf_counter()
    k = 0
    end = t0 + duration_s
    while True:
        deadline = t0 + k * period
        now = time.perf_counter()
        if deadline > now:
            time.sleep(deadline - now)
        if time.perf_counter() >= end:
            return 0
        frame = np.zeros((48, 64, 3), dtype=np.uint8)
        frame[0, 0, 0] = k & 0xFF
        k += 1


def _floors(
    t: np.ndarray, rss: np.ndarray, warmup_s: float, window_s: float
) -> tuple[float, float]:
    """The floor (minimum) of the first window after warm-up and of the last window."""
    end = float(t.max())
    first = rss[(t >= warmup_s) & (t < warmup_s + window_s)]
    last = rss[t >= end - window_s]
    if first.size == 0 or last.size == 0:
        raise RuntimeError("too few RSS samples for the leak windows (run too short)")
    return float(first.min()), float(last.min())


def _watch(
    procs: dict[str, subprocess.Popen[bytes]], every_s: float
) -> dict[str, list[tuple[float, int]]]:
    """Sample each child's RSS from outside until all have exited."""
    import psutil

    ps = {k: psutil.Process(p.pid) for k, p in procs.items()}
    seen: dict[str, list[tuple[float, int]]] = {k: [] for k in procs}
    t0 = time.perf_counter()
    stop = threading.Event()
    while any(p.poll() is None for p in procs.values()):
        now = time.perf_counter() - t0
        for k, proc in ps.items():
            if procs[k].poll() is None:
                try:
                    seen[k].append((now, proc.memory_info().rss))
                except psutil.Error:
                    pass
        stop.wait(every_s)
    return seen


def _external_growth(
    series: list[tuple[float, int]], warmup_s: float, window_s: float
) -> float | None:
    if len(series) < 4:
        return None
    arr = np.array(series, dtype=np.float64)
    try:
        a, b = _floors(arr[:, 0], arr[:, 1], warmup_s, window_s)
    except RuntimeError:
        return None
    return b - a


def _spawn(cmd: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _run_children(
    db: Path, info: Path, fps: float, duration_s: float
) -> dict[str, list[tuple[float, int]]]:
    """Run the soakd child and the bare baseline side by side, watching their RSS."""
    me = [sys.executable, "-m", "bench.leak"]
    args = ["--fps", str(fps), "--duration", str(duration_s)]
    procs = {
        "soakd": _spawn([*me, "--child", "soakd", "--db", str(db), "--info", str(info), *args]),
        "bare": _spawn([*me, "--child", "bare", *args]),
    }
    external = _watch(procs, every_s=1.0)
    for name, p in procs.items():
        if p.returncode != 0:
            raise RuntimeError(f"leak child {name!r} exited with {p.returncode}")
    return external


FULL = {"duration_s": 1800.0, "warmup_s": 120.0, "window_s": 60.0}
QUICK = {"duration_s": 60.0, "warmup_s": 15.0, "window_s": 10.0}


def run(quick: bool, workdir: Path) -> BenchResult:
    return measure(workdir, quick=quick, **(QUICK if quick else FULL))


def measure(
    workdir: Path, *, quick: bool, duration_s: float, warmup_s: float, window_s: float
) -> BenchResult:
    """The leak figures of one no-op run of ``duration_s`` at 60 fps (floors of the first
    window after ``warmup_s`` and of the last window, each ``window_s`` long)."""
    fps = 60.0
    res = BenchResult(
        "leak",
        quick,
        params={"fps": fps, "duration_s": duration_s, "warmup_s": warmup_s, "window_s": window_s},
    )
    db = workdir / "leak.db"
    info = workdir / "leak-child.json"
    ext_path = workdir / "leak-external.json"
    if REANALYSE and ext_path.exists():
        res.notes.append(f"re-analysed the run kept in {workdir}")
        external = {k: [tuple(x) for x in v] for k, v in json.loads(ext_path.read_text()).items()}
    else:
        external = _run_children(db, info, fps, duration_s)
        ext_path.write_text(json.dumps(external))
    child = json.loads(info.read_text())
    run_id = child["run_id"]
    cols = sample_columns(db, run_id, ["t", "rss_bytes"])
    t, rss = cols["t"], cols["rss_bytes"]
    ok = np.isfinite(rss)
    t, rss = t[ok], rss[ok]
    f0, f1 = _floors(t, rss, warmup_s, window_s)
    growth = f1 - f0
    bare_growth = _external_growth(external["bare"], warmup_s, window_s)
    ext_growth = _external_growth(external["soakd"], warmup_s, window_s)
    res.metrics.update(
        samples=int(rss.size),
        frames_done=child.get("frames_done"),
        achieved_fps=child.get("achieved_fps"),
        rss_first_floor_bytes=f0,
        rss_last_floor_bytes=f1,
        rss_growth_bytes=growth,
        rss_growth_external_bytes=ext_growth,
        bare_loop_growth_bytes=bare_growth,
        rss_peak_bytes=float(rss.max()),
        growth_minus_bare_bytes=growth - bare_growth if bare_growth is not None else None,
    )
    minutes = (float(t.max()) - warmup_s) / 60.0
    res.metrics["rss_growth_bytes_per_min"] = growth / minutes if minutes > 0 else None
    res.targets.append(
        Target(
            f"RSS growth over a {duration_s / 60:g}-min no-op run at 60 fps",
            growth,
            LIMIT_BYTES,
            "<=",
            "bytes",
            note="the 30-min figure is the target; --quick runs 1 min",
        )
    )
    res.rows = _window_rows(t, rss, window_s)
    return res


def _window_rows(t: np.ndarray, rss: np.ndarray, window_s: float) -> list[dict[str, object]]:
    """RSS floor per window, at most ~10 rows (the shape of the curve for the docs)."""
    end = float(t.max())
    step = max(window_s, end / 10)
    rows: list[dict[str, object]] = []
    lo = 0.0
    while lo < end:
        sel = rss[(t >= lo) & (t < lo + step)]
        if sel.size:
            rows.append({"from_s": round(lo, 1), "rss_floor_mb": round(float(sel.min()) / 1e6, 3)})
        lo += step
    return rows


def main(argv: list[str] | None = None) -> int:
    global REANALYSE
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--reanalyse" in argv:  # analyse the run already in --workdir again, do not run
        argv.remove("--reanalyse")
        REANALYSE = True
    if "--child" in argv:
        p = argparse.ArgumentParser()
        p.add_argument("--child", choices=("soakd", "bare"))
        p.add_argument("--db", type=Path)
        p.add_argument("--info", type=Path)
        p.add_argument("--fps", type=float)
        p.add_argument("--duration", type=float)
        a = p.parse_args(argv)
        if a.child == "soakd":
            return _child_soakd(a.db, a.fps, a.duration, a.info)
        return _child_bare(a.fps, a.duration)
    return bench_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
