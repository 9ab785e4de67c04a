"""A run on several GPUs: each device's memory floor judged as the primary one's."""

from __future__ import annotations

from soakd.analysis import devices
from soakd.analysis.criteria.base import Context
from soakd.analysis.criteria.memory import judge_memory_metric
from soakd.analysis.model import CriterionResult, floor_window_s


def judge_gpu_devices(ctx: Context) -> list[CriterionResult]:
    """``memory_gpu[i]`` for each GPU sampled apart (soakd.analysis.devices): the rule of
    ``memory_gpu`` on that GPU's used memory; none for a run on one GPU."""
    w, _note = floor_window_s(ctx.span, ctx.crit.floor_window_s)
    thr = ctx.crit.max_memory_growth_mb_per_min
    return [
        judge_memory_metric(ctx, s.name, s.title, s.t, s.y, w)
        if s.y.size
        else devices.unreported(s, thr)
        for s in devices.memory_series(ctx.data, ctx.t0)
    ]


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria)."""
    return judge_gpu_devices(ctx)
