"""The memory criteria's growth shapes on synthetic series: how often leaks that keep rising
are passed (false PASS) and how often bounded growth that stopped is failed (false FAIL),
each over many seeds, judged by the memory criterion itself (``criteria.memory.judge``).

    .venv/bin/python -m bench.memory_shape            # 200 seeds a shape, 2 and 10 minutes
    .venv/bin/python -m bench.memory_shape --seeds 50

RSS is sampled every 0.15 s with 0.5 MB of noise under a 20 MB, 3 s allocator sawtooth,
judged with the default criteria (1.5 MB/min, 4 s floor windows, alpha 0.01) after a 5 s
warm-up. Prints one row a shape and run length: PASS / INVALID / FAIL counts.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable

import numpy as np

from soakd.analysis.criteria import memory
from soakd.analysis.data import make_run_data
from soakd.analysis.model import MIB, RunMeta
from soakd.analysis.verdict import context
from soakd.config import CriteriaSettings

WARM = 5.0
Shape = Callable[[np.ndarray, float], np.ndarray]  # (t after warm-up, span) -> MB


def _ramp(t: np.ndarray, until: float, mb: float) -> np.ndarray:
    return mb * np.clip(t / until, 0, 1)


#: name -> (what it is, a leak that keeps rising?, MB over time)
SHAPES: dict[str, tuple[str, bool, Shape]] = {
    "linear-2": ("linear leak 2 MB/min", True, lambda t, s: 2 * t / 60),
    "linear-5": ("linear leak 5 MB/min", True, lambda t, s: 5 * t / 60),
    "saw-rising-3": ("sawtooth on a floor rising 3 MB/min", True, lambda t, s: 3 * t / 60),
    "late-5": (
        "5 MB/min from the half on",
        True,
        lambda t, s: 5 * np.clip(t - s / 2, 0, None) / 60,
    ),
    "late-3": (
        "3 MB/min from the half on",
        True,
        lambda t, s: 3 * np.clip(t - s / 2, 0, None) / 60,
    ),
    "warm-then-2": (
        "50 MB warm-up over the first 20 %, then 2 MB/min",
        True,
        lambda t, s: _ramp(t, 0.2 * s, 50) + 2 * np.clip(t - 0.2 * s, 0, None) / 60,
    ),
    "plateau": ("50 MB over the first third, then level", False, lambda t, s: _ramp(t, s / 3, 50)),
    "step": ("a 40 MB step at 15 %, then level", False, lambda t, s: 40.0 * (t > 0.15 * s)),
    "flat": ("nothing", False, lambda t, s: 0 * t),
}


def series(shape: Shape, span: float, seed: int, saw_mb: float) -> tuple[np.ndarray, np.ndarray]:
    """RSS samples (bytes) of ``span`` s after a 5 s warm-up."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, WARM + span, 0.15)
    after = np.clip(t - WARM, 0, None)
    saw = saw_mb * ((t + rng.uniform(0, 3)) % 3.0) / 3.0
    mb = 400 + shape(after, span) + saw + rng.normal(0, 0.5, t.size)
    return t, mb * MIB


def judge_one(t: np.ndarray, rss: np.ndarray, crit: CriteriaSettings) -> str:
    ft = np.arange(0.0, t[-1], 0.5)
    d = make_run_data(
        RunMeta("r", duration_s=float(t[-1]), fps=2),
        frames={"t_capture": ft, "warmup": (ft < WARM).astype(float), "total_ms": 20 + 0 * ft},
        samples={"t": t, "rss_bytes": rss},
        events=[{"kind": "warmup_end", "t": WARM}],
    )
    res = memory.judge(context(d, crit))
    return next(r.status for r in res if r.criterion == "memory_rss")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--spans", type=float, nargs="*", default=[120.0, 600.0])
    ap.add_argument("--saw-mb", type=float, default=20.0)
    a = ap.parse_args()
    crit = CriteriaSettings()
    print("| shape | leak? | run | PASS | INVALID | FAIL | false |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for _name, (what, leak, shape) in SHAPES.items():
        for span in a.spans:
            n = Counter(
                judge_one(*series(shape, span, seed, a.saw_mb), crit) for seed in range(a.seeds)
            )
            false = n["pass"] if leak else n["fail"]
            print(
                f"| {what} | {'yes' if leak else 'no'} | {span:.0f} s | {n['pass']} | "
                f"{n['invalid']} | {n['fail']} | {false} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
