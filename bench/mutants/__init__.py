"""Every mutant bench/mutate.py runs, one module per area of the code:

- ``verdict``: the verdict and the exit-code path (issues 20-31);
- ``memory``: the memory floors, headroom and the stage-time trend (issue 35);
- ``frames``: the per-frame criteria: frame age, jitter, drops, errors, OOM, validity,
  thresholds, a generator's intervals (issue 35);
- ``contention``: which frames a contended host excuses, never blamed on the model (issue 31);
- ``early_auto``: stopping a run early and ``duration = "auto"`` (issue 35);
- ``server``: the served model's process tree and the server criteria (issue 35);
- ``served``: what the openai workload times (issue 35).
"""

from __future__ import annotations

from bench.mutants import contention, early_auto, frames, memory, served, server, verdict
from bench.mutants.base import Mutant

ALL: tuple[Mutant, ...] = (
    *verdict.MUTANTS,
    *memory.MUTANTS,
    *frames.MUTANTS,
    *contention.MUTANTS,
    *early_auto.MUTANTS,
    *server.MUTANTS,
    *served.MUTANTS,
)

__all__ = ["ALL", "Mutant"]
