"""Stand-in of the ``accelerate`` package: one process on the CPU (``Accelerator`` as
Matrix-Game-3.5's ``tools/run_distilled_inference.py`` and ``causal_inference`` use it)."""

from __future__ import annotations

import torch


class DistributedDataParallelKwargs:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class Accelerator:
    """Mirrors ``accelerate.Accelerator`` (single process, no device placement)."""

    def __init__(self, **kwargs):
        self.device = torch.device("cpu")
        self.process_index = 0
        self.is_main_process = True
        self.distributed_type = "NO"

    def unwrap_model(self, model):
        return model

    def prepare(self, obj):
        return obj

    def wait_for_everyone(self):
        pass
