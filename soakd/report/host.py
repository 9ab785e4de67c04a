"""The host beside a run: how much of the host's CPUs other processes kept busy while it ran
(``host_cpu_pct`` less soakd's own ``cpu_pct``) and the 1-minute load average, from the
run's telemetry samples. A run, profile or sweep point measured while other processes held
half the CPUs or more (``HOST_BUSY_SHARE_PCT``, the diagnosis's own bar) is marked as
measured under contention: its times are the host's as much as the model's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from soakd.analysis.diagnosis import HOST_BUSY_SHARE_PCT
from soakd.analysis.model import RunData, Verdict


@dataclass(frozen=True, slots=True)
class HostLoad:
    """Medians over the run's samples: other processes' share of the host's CPUs (%), the
    1-minute load average (None where not sampled) and the host's CPU count."""

    others_pct: float
    load1: float | None
    cpus: int

    @property
    def contended(self) -> bool:
        """Other processes held half the host's CPUs or more."""
        return self.others_pct >= HOST_BUSY_SHARE_PCT

    def words(self) -> str:
        """``other processes kept 93 % of the host's 2 CPUs busy (load average 12.1)``."""
        load = f" (load average {self.load1:.3g})" if self.load1 is not None else ""
        share = f"{self.others_pct:.0f} % of the host's {self.cpus} CPUs"
        return f"other processes kept {share} busy{load}"

    def to_dict(self) -> dict[str, float | int | bool | None]:
        return {
            "others_cpu_pct": round(self.others_pct, 1),
            "load1": None if self.load1 is None else round(self.load1, 2),
            "cpus": self.cpus,
            "contended": self.contended,
        }


def host_load(samples: Mapping[str, np.ndarray], cpus: float | None) -> HostLoad | None:
    """The host's load over ``samples`` (the samples table's columns; ``cpus``: the host's
    CPU count, from the run's environment); None when the host was not sampled (a run made
    before soakd sampled it, or shorter than one tick)."""
    host = np.asarray(samples.get("host_cpu_pct", np.empty(0)), dtype=np.float64)
    ok = np.isfinite(host)
    if not ok.any():
        return None
    n = max(1, int(cpus or 1))
    own = np.asarray(samples.get("cpu_pct", np.zeros(host.size)), dtype=np.float64)
    own = np.nan_to_num(own[: host.size]) / n  # soakd's share of every CPU
    others = np.clip(host[ok] - own[ok], 0.0, 100.0)
    load = np.asarray(samples.get("host_load1", np.empty(0)), dtype=np.float64)
    load = load[np.isfinite(load)]
    return HostLoad(
        others_pct=float(np.median(others)),
        load1=float(np.median(load)) if load.size else None,
        cpus=n,
    )


def host_warning(host: HostLoad | None, what: str = "run") -> str | None:
    """The warning every report of a run measured under contention carries (None on a
    quiet or unsampled host): a PASS there is the host's as much as the model's."""
    if host is None or not host.contended:
        return None
    return (
        f"host busy: {host.words()} during the {what}: its timings are the host's as much as "
        "the model's; soak on a quiet host to be sure of them"
    )


def with_host_warning(data: RunData, verdict: Verdict) -> Verdict:
    """``verdict`` with the host-load warning of ``data``'s samples added to its warnings
    (the same verdict when the host was quiet or not sampled)."""
    return add_warning(verdict, host_warning(host_load(data.samples, data.meta.fact("cpu_count"))))


def add_warning(verdict: Verdict, warn: str | None) -> Verdict:
    """``verdict`` with ``warn`` added to its warnings (once; unchanged for None)."""
    if warn is None or warn in verdict.warnings:
        return verdict
    return replace(verdict, warnings=[*verdict.warnings, warn])
