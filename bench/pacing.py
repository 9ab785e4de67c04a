"""Pacing: achieved frame rate and dispatch lateness of a no-op workload at 30, 60, 240 fps.

Target (issue 2): with a no-op workload at 30, 60 and 240 fps for 60 s, the achieved rate
is within 0.1 % of the target and the dispatch lateness p99 is under 5 % of the frame
period.

soakd: a paced run (pacer thread, latest-frame queue, staged driver, telemetry and store
on) per rate; from the run database, the achieved rate is ``(n - 1) / (t_capture[-1] -
t_capture[0])`` over the dispatched frames, with ``n`` counted from the first to the last
deadline (missed deadlines lower it), and the dispatch lateness is ``t_dispatch -
t_sched`` (deadline to the model being called: pacer wake-up, grab and queue hand-off).
The baseline, measured in the same run and for the same length, is the same two-thread
shape without soakd: a bare thread sleeping to the same absolute deadlines with
``time.sleep`` and handing each tick through a ``queue.SimpleQueue`` to a consumer thread;
the ratio of the two dispatch p99s says how much of the lateness is soakd's rather than
the machine's. Wake lateness (deadline to the producer running) is reported for both.
"""

from __future__ import annotations

import queue
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
    frame_columns,
    noop_overrides,
    pct,
)

RATES = (30.0, 60.0, 240.0)


def bare_pacer(fps: float, duration_s: float) -> tuple[np.ndarray, np.ndarray]:
    """The baseline: a bare producer thread sleeping to absolute deadlines with
    ``time.sleep`` and handing each tick through a ``queue.SimpleQueue`` to a consumer
    thread (the same two-thread shape as soakd's pacer and driver, nothing else).
    Returns the wake lateness and the dispatch lateness (consumer got it), in seconds."""
    period = 1.0 / fps
    n = int(duration_s * fps)
    wake = np.empty(n)
    dispatch = np.empty(n)
    q: queue.SimpleQueue[tuple[int, float] | None] = queue.SimpleQueue()
    pc = time.perf_counter
    t0 = pc() + period

    def producer() -> None:
        for k in range(n):
            deadline = t0 + k * period
            now = pc()
            if deadline > now:
                time.sleep(deadline - now)
            wake[k] = pc() - deadline
            q.put((k, deadline))
        q.put(None)

    def consumer() -> None:
        while (item := q.get()) is not None:
            dispatch[item[0]] = pc() - item[1]

    threads = [
        threading.Thread(target=producer, name="bench-bare-pacer"),
        threading.Thread(target=consumer, name="bench-bare-consumer"),
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return wake, dispatch


def soakd_pacing(fps: float, duration_s: float, db: Path) -> dict[str, float]:
    """One paced no-op run; its achieved rate and lateness figures."""
    from soakd.config import load_settings
    from soakd.run.runner import run_soak

    settings = load_settings(overrides=noop_overrides(db, fps=fps, duration_s=duration_s))
    res = run_soak(settings, judge=False)
    if res.status != "completed":
        raise RuntimeError(f"soakd run at {fps:g} fps ended {res.status}: {res.reason}")
    c = frame_columns(db, res.run_id, ["t_sched", "t_capture", "t_dispatch", "lateness_ms"])
    period = 1.0 / fps
    t_sched = c["t_sched"]
    deadlines = round(float(t_sched[-1] - t_sched[0]) / period) + 1
    span = c["t_capture"][-1] - c["t_capture"][0]
    achieved = (c["t_capture"].size - 1) / span
    dispatch_late_ms = (c["t_dispatch"] - c["t_sched"]) * 1e3
    return {
        "frames": float(c["t_sched"].size),
        "deadlines": float(deadlines),
        "missed": float(deadlines - c["t_sched"].size),
        "achieved_fps": achieved,
        "rate_error_pct": abs(achieved / fps - 1.0) * 100,
        "dispatch_late_p50_ms": pct(dispatch_late_ms, 50),
        "dispatch_late_p99_ms": pct(dispatch_late_ms, 99),
        "dispatch_late_max_ms": float(np.max(dispatch_late_ms)),
        "wake_late_p99_ms": pct(c["lateness_ms"], 99),
        "drops": float(res.summary.get("drops", 0)),
    }


def run(quick: bool, workdir: Path) -> BenchResult:
    duration = 1.0 if quick else 60.0
    res = BenchResult("pacing", quick, params={"rates_fps": list(RATES), "duration_s": duration})
    for fps in RATES:
        period_ms = 1e3 / fps
        bare_wake, bare_dispatch = bare_pacer(fps, duration)
        s = soakd_pacing(fps, duration, workdir / f"pacing-{fps:g}.db")
        bare_p99 = pct(bare_dispatch * 1e3, 99)
        bare_wake_p99 = pct(bare_wake * 1e3, 99)
        p99_pct = s["dispatch_late_p99_ms"] / period_ms * 100
        res.rows.append(
            {
                "fps": fps,
                "achieved_fps": s["achieved_fps"],
                "rate_err_%": s["rate_error_pct"],
                "missed": int(s["missed"]),
                "drops": int(s["drops"]),
                "late_p50_ms": s["dispatch_late_p50_ms"],
                "late_p99_ms": s["dispatch_late_p99_ms"],
                "p99_%period": p99_pct,
                "wake_p99_ms": s["wake_late_p99_ms"],
                "bare_wake_p99": bare_wake_p99,
                "bare_p99_ms": bare_p99,
                "p99_ratio": s["dispatch_late_p99_ms"] / bare_p99 if bare_p99 > 0 else None,
            }
        )
        key = f"{fps:g}fps"
        res.metrics.update(
            {
                f"{key}_achieved_fps": s["achieved_fps"],
                f"{key}_rate_error_pct": s["rate_error_pct"],
                f"{key}_missed_deadlines": s["missed"],
                f"{key}_dispatch_late_p99_ms": s["dispatch_late_p99_ms"],
                f"{key}_dispatch_late_p99_pct_period": p99_pct,
                f"{key}_dispatch_late_max_ms": s["dispatch_late_max_ms"],
                f"{key}_wake_late_p99_ms": s["wake_late_p99_ms"],
                f"{key}_bare_dispatch_late_p99_ms": bare_p99,
                f"{key}_bare_wake_late_p99_ms": bare_wake_p99,
            }
        )
        res.targets.append(Target(f"{key}: rate error", s["rate_error_pct"], 0.1, "<=", "%"))
        res.targets.append(
            Target(f"{key}: dispatch lateness p99 / period", p99_pct, 5.0, "<=", "%")
        )
    return res


def main(argv: list[str] | None = None) -> int:
    return bench_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
