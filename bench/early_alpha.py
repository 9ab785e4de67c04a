"""The early looks' false FAIL rate, measured through the looks themselves: healthy memory
series (flat, with white or AR(1) noise on every sample) fed to a ``criteria.base.Live`` a
sample a second, ``memory.early_fail`` asked after each as a run asks it once a second,
and the run's verdict rule (``memory.judge_memory_metric`` at the full alpha) at the end
of the horizon. Pure and in-process (no soak): ``--series`` series of ``--minutes``
minutes of a run planned for ``--planned`` seconds. The tolerance is 1e-6 MB/min (0
divides by zero in the verdict's wording): the worst case, where only the trend test
stands between noise and a FAIL (any tolerance only lowers the rates).

    .venv/bin/python -m bench.early_alpha                       # 1-hour plan, first 15 min
    .venv/bin/python -m bench.early_alpha --spending obrien-fleming   # the old schedule
    .venv/bin/python -m bench.early_alpha --minutes 60 --series 200

Prints, per noise, the share of series stopped early (a false early FAIL) and the share that
FAIL overall (stopped early, or FAIL by the verdict's rule at the horizon: a run of that
length), against alpha. Exits 1 when the early share is over alpha.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from soakd.analysis import stats
from soakd.analysis.criteria import base
from soakd.analysis.criteria import memory as memory_criterion
from soakd.analysis.criteria.base import Context, Live, LiveTable
from soakd.analysis.data import make_run_data
from soakd.analysis.model import FAIL, RunMeta
from soakd.config import CriteriaSettings

SAMPLE_S = 1.0  # one RSS sample a second (4 to a floor window)
T0 = 5.0  # the warm-up's end


def _noise(rng: np.random.Generator, n: int, phi: float, sd: float) -> np.ndarray:
    e = rng.normal(0.0, sd, n)
    if phi == 0.0:
        return e
    x = np.empty(n)
    x[0] = e[0] / math.sqrt(1 - phi**2)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i]
    return x


def one_series(
    rng: np.random.Generator, crit: CriteriaSettings, planned: float, minutes: float, phi: float
) -> tuple[bool, bool]:
    """(stopped early, FAIL overall) of one healthy series."""
    n = int(minutes * 60 / SAMPLE_S)
    t = T0 + SAMPLE_S * np.arange(n)
    y = 500e6 + _noise(rng, n, phi, 2e6)  # 2 MB of noise a sample around 500 MB
    live = Live(planned_s=planned, fps=10.0, streams=1, t0=T0)
    live.samples = LiveTable(("t", "rss_bytes"))
    for ti, yi in zip(t, y, strict=True):
        live.samples.append((ti, yi))
        live.now = ti
        if memory_criterion.early_fail(live, crit) is not None:
            return True, True
    return False, _final(crit, t, y)


def _final(crit: CriteriaSettings, t: np.ndarray, y: np.ndarray) -> bool:
    """The verdict's rule on the whole horizon at the full alpha."""
    data = make_run_data(RunMeta("sim", fps=10.0), samples={"t": t, "rss_bytes": y})
    none = np.zeros(0, dtype=bool)
    ctx = Context(data, crit, T0, float(t[-1]), none, none, {}, {})
    res = memory_criterion.judge_memory_metric(ctx, "memory_rss", "RSS", t, y, crit.floor_window_s)
    return res.status == FAIL


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=400)
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--planned", type=float, default=3600.0)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--spending", choices=("pocock", "obrien-fleming"), default="pocock")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    if a.spending == "obrien-fleming":  # the schedule before issue 31
        base.look_alpha = stats.look_alpha  # type: ignore[assignment]
    crit = CriteriaSettings(max_memory_growth_mb_per_min=1e-6, alpha=a.alpha)
    print(f"{a.series} healthy series x {a.minutes:g} min of a {a.planned:g} s plan, "
          f"alpha {a.alpha:g}, {a.spending} spending, tolerance ~0 (1e-6) MB/min")  # fmt: skip
    worst = 0.0
    for name, phi in (("white", 0.0), ("ar1 0.5", 0.5), ("ar1 0.9", 0.9)):
        rng = np.random.default_rng(a.seed)
        t_start = time.perf_counter()
        got = [one_series(rng, crit, a.planned, a.minutes, phi) for _ in range(a.series)]
        early = sum(e for e, _ in got) / a.series
        overall = sum(f for _, f in got) / a.series
        worst = max(worst, early)
        print(f"  {name:8s} early FAIL {early:.4f}  overall FAIL {overall:.4f}  "
              f"({time.perf_counter() - t_start:.0f} s)")  # fmt: skip
    return 0 if worst <= a.alpha else 1


if __name__ == "__main__":
    sys.exit(main())
