"""Workloads used by tests/test_faults.py through ``kind = "python"`` factories."""

from __future__ import annotations

from typing import Any, Literal

from soakd.records import Frame, StageOutput
from soakd.workloads.base import WorkloadContext


class OomEvery:
    """Raises torch's real ``OutOfMemoryError`` on every Nth infer, as CUDA would. It is
    raised by hand because no GPU runs here; the class is the one torch raises on CUDA."""

    shape: Literal["staged"] = "staged"

    def __init__(self, every: int) -> None:
        self.every = every
        self.n = 0

    def setup(self) -> None: ...

    def preprocess(self, frame: Frame) -> Any:
        return frame.id

    def infer(self, inputs: Any) -> Any:
        import torch

        self.n += 1
        if self.n % self.every == 0:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return inputs

    def decode(self, outputs: Any) -> StageOutput:
        return StageOutput(text="ok", tokens=1)

    def sync(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        return {"kind": "oom-every", "every": self.every}

    def close(self) -> None: ...


def oom_every(options: dict[str, Any], ctx: WorkloadContext) -> OomEvery:
    return OomEvery(int(options.get("every", 5)))
