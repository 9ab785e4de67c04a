"""Host contention, from soakd's own telemetry: how much of the host's CPUs other processes
held at each sampler tick, and which frames ran while they held most of them.

"Other processes" are the host's busy CPU (``host_cpu_pct``: every CPU, % of all of them)
less soakd's own process (``cpu_pct``, % of one core: the in-process model included) and,
for a served model, the server's process tree (``server_cpu_pct``): what is left is CPU the
model under test did not use. A tick covers the time since the tick before it, so a frame
ran under the ticks from the one at or after its start to the one at or after its end.
"""

from __future__ import annotations

import numpy as np

from soakd.analysis.model import RunData


def other_cpu_pct(data: RunData) -> np.ndarray:
    """Per telemetry sample: % of the host's CPUs busy with processes other than soakd's and
    the served model's (NaN where the host was not sampled)."""
    ncpu = data.meta.fact("cpu_count") or 1.0
    own = np.nan_to_num(data.sample("cpu_pct")) + np.nan_to_num(data.sample("server_cpu_pct"))
    return np.clip(data.sample("host_cpu_pct") - own / ncpu, 0.0, 100.0)


def others_during(data: RunData, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each interval ``start`` .. ``end`` (seconds since the run's start): the mean share
    of the host's CPUs other processes held over the ticks covering it (NaN when no tick
    covers it or the host was not sampled). The mean, not the max: a long frame covers more
    ticks and would otherwise more often meet a busy one than a short frame does."""
    out = np.full(np.shape(start), np.nan)
    others = other_cpu_pct(data)
    ok = np.isfinite(others)
    if not ok.any() or out.size == 0:
        return out
    t, o = data.samples["t"][ok], others[ok]
    lo = np.searchsorted(t, start)
    hi = np.maximum(np.minimum(np.searchsorted(t, end), t.size - 1), lo)
    covered = lo < t.size
    csum = np.concatenate([[0.0], np.cumsum(o)])
    lo, hi = lo[covered], hi[covered]
    out[covered] = (csum[hi + 1] - csum[lo]) / (hi - lo + 1)
    return out
