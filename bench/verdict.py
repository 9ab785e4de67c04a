"""Verdict and report: how long judging and reporting a run takes, and how it scales.

Targets (issue 3): evaluating and reporting a ten-minute run at 30 fps finishes in about a
second here; a synthetic 24-hour run at 30 fps (2.6 M frames, 864 k samples at 100 ms)
within 15 s, in bounded memory; time grows linearly with the run's length (the two are
compared in one benchmark).

Run databases are generated directly (numpy + ``executemany``, not timed) with every column
a staged run fills: frames at 30 fps (infer ~20 ms with lognormal jitter, small frame age,
a few drops), samples at 100 ms (a flat RSS with a 20 MB sawtooth and noise), warm-up and
end events. Each measurement runs in a fresh child process that imports soakd, then times
one pass of evaluating and reporting, step by step: ``soakd.analysis.load_run_data``,
``judge``, ``store`` (the verdict rows) and ``soakd.report.render`` to md, json, junit and
html; and reports its peak RSS (``VmHWM``) and the part of it above the imports. Linearity is the
long/short time ratio divided by the length ratio (1.0 = linear; above 1 = super-linear).
"""

from __future__ import annotations

import argparse
import json
import resource
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench._common import FRAME_SQL, SAMPLE_SQL, BenchResult, Target, bench_main

if TYPE_CHECKING:
    from soakd.config import Settings

FPS = 30.0
SAMPLE_S = 0.1
ROOT = Path(__file__).resolve().parent.parent
RUN_ID = "bench-verdict"
MB = 1e6


def settings_for(duration_s: float, db: Path) -> Settings:
    from soakd.config import load_settings

    return load_settings(
        overrides=[
            f"run.db={json.dumps(str(db))}",
            f"run.fps={FPS}",
            f"run.duration={duration_s}",
            "run.warmup_s=5",
            "run.sample_interval_ms=100",
            "workload.kind=synthetic",
            "source.kind=synthetic",
        ]
    )


def _frame_rows(lo: int, n: int, rng: np.random.Generator) -> list[tuple[object, ...]]:
    """Frames ``lo`` .. ``lo + n - 1`` as ``FRAME_SQL`` rows."""
    period = 1.0 / FPS
    fid = np.arange(lo, lo + n)
    t_sched = fid * period
    late = rng.exponential(0.1, n)  # ms
    grab = 0.3 + rng.exponential(0.05, n)
    t_capture = t_sched + (late + grab) / 1e3
    t_dispatch = t_capture + rng.exponential(0.05, n) / 1e3
    pre = 2.0 * rng.lognormal(-0.00125, 0.05, n)
    infer = 20.0 * rng.lognormal(-0.00125, 0.05, n)
    dec = 2.0 * rng.lognormal(-0.00125, 0.05, n)
    total = grab + pre + infer + dec
    t_done = t_dispatch + (pre + infer + dec) / 1e3
    age = (t_dispatch - t_capture) * 1e3
    e2e = (t_done - t_sched) * 1e3
    drops = np.cumsum(rng.random(n) < 1e-4)
    warm = (t_capture < 5.0).astype(int)
    first = (fid == 0).astype(int)
    cols = [
        np.full(n, RUN_ID, dtype=object),
        fid,
        t_sched,
        t_capture,
        t_dispatch,
        t_done,
        late,
        grab,
        pre,
        infer,
        dec,
        total,
        np.ones(n, dtype=int),
        age,
        e2e,
        drops,
        np.zeros(n, dtype=int),
        np.full(n, 8),
        first,
        warm,
        np.zeros(n, dtype=int),
    ]
    return list(zip(*(c.tolist() for c in cols), strict=True))


def _sample_rows(m: int, rng: np.random.Generator, t0_wall: float) -> list[tuple[object, ...]]:
    seq = np.arange(m)
    t = seq * SAMPLE_S + rng.exponential(0.0002, m)
    # allocator sawtooth, no growth: a 3 s period, under the default 4 s floor window (a
    # slower one reads as growth, docs/verdict.md)
    saw = 20 * MB * ((t % 3.0) / 3.0)
    rss = (300 * MB + saw + rng.normal(0, 0.2 * MB, m)).astype(np.int64)
    cols = [
        np.full(m, RUN_ID, dtype=object),
        seq,
        t,
        t0_wall + t,
        rng.exponential(0.2, m),
        0.3 + rng.exponential(0.05, m),
        rss,
        50 + rng.normal(0, 2, m),
        np.full(m, 4_000_000_000),
        np.full(m, 8_000_000_000),
    ]
    return list(zip(*(c.tolist() for c in cols), strict=True))


def make_run_db(path: Path, duration_s: float, seed: int = 0) -> None:
    """A run database holding one completed synthetic run of ``duration_s`` at 30 fps."""
    from soakd.store import db as store
    from soakd.store.runs import NewRun, close_run, open_run

    settings = settings_for(duration_s, path)
    conn = store.connect(path)
    t0_wall = 1_790_000_000.0
    run = NewRun(
        id=RUN_ID,
        name="bench",
        mode="soak",
        workload_kind="synthetic",
        fps=FPS,
        config=settings.to_dict(),
        config_hash=settings.config_hash(),
        workload={},
        environment={},
    )
    with store.atomic(conn):
        open_run(conn, run, t0_wall)
        close_run(
            conn,
            RUN_ID,
            status="completed",
            reason=None,
            ended_unix=t0_wall + duration_s,
            duration_s=duration_s,
            summary={},
        )
    rng = np.random.default_rng(seed)
    n = int(duration_s * FPS)
    m = int(duration_s / SAMPLE_S)
    chunk = 500_000
    for lo in range(0, n, chunk):
        rows = _frame_rows(lo, min(chunk, n - lo), rng)
        conn.execute("BEGIN")
        conn.executemany(FRAME_SQL, rows)
        conn.execute("COMMIT")
    conn.execute("BEGIN")
    conn.executemany(SAMPLE_SQL, _sample_rows(m, rng, t0_wall))
    conn.executemany(
        "INSERT INTO events (run_id, t, wall, kind, message) VALUES (?, ?, ?, ?, ?)",
        [
            (RUN_ID, 5.0, t0_wall + 5.0, "warmup_end", "warm-up of 5 s ended"),
            (RUN_ID, duration_s, t0_wall + duration_s, "end", "completed"),
        ],
    )
    conn.execute("COMMIT")
    conn.close()


def _maxrss_bytes() -> int:
    """This process's peak RSS. ``VmHWM`` where /proc has it: ``ru_maxrss`` survives
    ``fork`` + ``exec`` on Linux, so a child would report its parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def child(db: Path, duration_s: float) -> dict[str, float | str]:
    """In a fresh process, one pass as ``soakd report`` needs it: load the run, judge it,
    store the verdict, render every report format; each step timed."""
    import soakd.analysis as analysis
    from soakd.report import FORMATS, render

    settings = settings_for(duration_s, db)
    rss0 = _maxrss_bytes()
    conn = sqlite3.connect(db, isolation_level=None)
    t0 = time.perf_counter()
    data = analysis.load_run_data(conn, RUN_ID)
    t1 = time.perf_counter()
    verdict = analysis.judge(data, settings.criteria, [])
    t2 = time.perf_counter()
    analysis.store(conn, verdict)
    t3 = time.perf_counter()
    sizes = {fmt: len(render(fmt, data, verdict)) for fmt in FORMATS}
    t4 = time.perf_counter()
    conn.close()
    return {
        "load_s": t1 - t0,
        "judge_s": t2 - t1,
        "store_s": t3 - t2,
        "render_s": t4 - t3,
        "total_s": t4 - t0,
        "verdict": str(verdict.status),
        "peak_rss_bytes": float(_maxrss_bytes()),
        "peak_rss_above_imports_bytes": float(_maxrss_bytes() - rss0),
        "html_bytes": float(sizes.get("html", 0)),
    }


def measure(db: Path, duration_s: float) -> dict[str, float | str]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.verdict", "--child", str(db), str(duration_s)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"verdict child failed ({out.returncode}): {tail[0]}")
    result: dict[str, float | str] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run(quick: bool, workdir: Path) -> BenchResult:
    short_s, long_s = (120.0, 1200.0) if quick else (600.0, 86400.0)
    res = BenchResult(
        "verdict",
        quick,
        params={"fps": FPS, "sample_interval_s": SAMPLE_S, "short_s": short_s, "long_s": long_s},
    )
    figures = {}
    for label, dur in (("short", short_s), ("long", long_s)):
        db = workdir / f"verdict-{int(dur)}s.db"
        if not db.exists():  # generated once per workdir (the 24-hour one takes a while)
            t = time.perf_counter()
            make_run_db(db, dur)
            res.notes.append(f"generated {db.name} in {time.perf_counter() - t:.1f} s")
        f = measure(db, dur)
        figures[label] = f
        res.rows.append(
            {
                "run": label,
                "length_s": dur,
                "frames": int(dur * FPS),
                "samples": int(dur / SAMPLE_S),
                "load_s": f["load_s"],
                "judge_s": f["judge_s"],
                "store_s": f["store_s"],
                "render_s": f["render_s"],
                "total_s": f["total_s"],
                "peak_rss_mb": float(f["peak_rss_bytes"]) / MB,
                "verdict": f["verdict"],
            }
        )
    s, lg = figures["short"], figures["long"]
    length_ratio = long_s / short_s
    time_ratio = float(lg["total_s"]) / float(s["total_s"])
    res.metrics.update(
        **{f"short_{k}": float(s[k]) for k in ("total_s", "load_s", "judge_s", "render_s")},
        **{f"long_{k}": float(lg[k]) for k in ("total_s", "load_s", "judge_s", "render_s")},
        length_ratio=length_ratio,
        time_ratio=time_ratio,
        linearity=time_ratio / length_ratio,
        short_peak_rss_bytes=float(s["peak_rss_bytes"]),
        long_peak_rss_bytes=float(lg["peak_rss_bytes"]),
        long_peak_rss_above_imports_bytes=float(lg["peak_rss_above_imports_bytes"]),
        long_bytes_per_frame=float(lg["peak_rss_above_imports_bytes"]) / (long_s * FPS),
    )
    tag = "" if not quick else " (quick: 2 min / 20 min)"
    res.targets += [
        Target(f"judge + report, 10-min run{tag}", float(s["total_s"]), 1.0, "<=", "s"),
        Target(f"judge + report, 24-hour run{tag}", float(lg["total_s"]), 15.0, "<=", "s"),
        Target(
            "time ratio / length ratio (linear = 1)",
            time_ratio / length_ratio,
            1.25,
            "<=",
            "x",
            note="above 1.25 would be super-linear",
        ),
        Target(
            "peak RSS, 24-hour run",
            float(lg["peak_rss_bytes"]),
            1 << 30,
            "<=",
            "bytes",
            note="'bounded memory' read as: fits 1 GiB (our reading, not the issue's number)",
        ),
    ]
    return res


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        p = argparse.ArgumentParser()
        p.add_argument("--child", type=Path)
        p.add_argument("duration", type=float)
        a = p.parse_args(argv)
        sys.stdout.write(json.dumps(child(a.child, a.duration)) + "\n")
        return 0
    return bench_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
