"""Stand-in of ``diffsynth/inference/causal_schedule.py``."""

from __future__ import annotations

import torch


def prepare_causal_dmd_eval_scheduler(
    scheduler,
    denoising_step_list=(1000, 750, 500, 250),
    *,
    timestep_wrap: bool = True,
    device=None,
    model_dtype: torch.dtype,
):
    """Mirrors ``prepare_causal_dmd_eval_scheduler``: the few-step (timesteps, sigmas)."""
    timesteps = torch.tensor([float(v) for v in denoising_step_list], dtype=model_dtype)
    return timesteps, timesteps / 1000.0
