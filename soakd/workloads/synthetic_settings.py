"""``[workload]`` of ``kind = "synthetic"`` (the workload: synthetic.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from soakd.sections import _Section


class SyntheticWorkload(_Section):
    """A torch-free workload with planted behaviour: verdicts are tested against it."""

    kind: Literal["synthetic"] = "synthetic"
    pre_ms: float = Field(2.0, ge=0)
    infer_ms: float = Field(20.0, ge=0)
    decode_ms: float = Field(2.0, ge=0)
    jitter: float = Field(0.05, ge=0, le=5)
    cpu_bound: bool = False  # stage times spun as this thread's CPU time instead of slept
    spike_every: int = Field(0, ge=0)
    spike_ms: float = Field(0.0, ge=0)
    drift_ms_per_min: float = 0.0
    leak_mb_per_min: float = Field(0.0, ge=0)
    leak_after_s: float = Field(0.0, ge=0)  # the leak starts once the workload is this old
    # bounded growth: plateau_mb allocated evenly over the first plateau_s, then nothing
    plateau_mb: float = Field(0.0, ge=0)
    plateau_s: float = Field(20.0, gt=0)
    sawtooth_mb: float = Field(0.0, ge=0)
    sawtooth_period_s: float = Field(10.0, gt=0)
    error_every: int = Field(0, ge=0)
    error_stream: int | None = Field(None, ge=0)  # every frame of this stream raises in infer
    stall_after_s: float = Field(0.0, ge=0)
    seed: int = 0
