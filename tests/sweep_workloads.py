"""A workload for tests/test_sweep.py through a ``kind = "python"`` factory: its cost falls
as ``options.size`` grows past 50 (60 ms a frame, then 10 ms at 56), what a sweep measured on
a host whose load fell between two points looks like, and rises again from there (20 ms at
112: two equal costs, beside CPU spinners, could read as a fall of their own)."""

from __future__ import annotations

import time
from typing import Any, Literal

from soakd.records import Frame, StageOutput
from soakd.workloads.base import WorkloadContext


class CheaperWhenLarger:
    shape: Literal["staged"] = "staged"

    def __init__(self, size: int) -> None:
        self.size = size

    def setup(self) -> None: ...

    def preprocess(self, frame: Frame) -> Any:
        return frame.id

    def infer(self, inputs: Any) -> Any:
        time.sleep(0.060 if self.size < 50 else 0.010 * self.size / 56)
        return inputs

    def decode(self, outputs: Any) -> StageOutput:
        return StageOutput(text="ok", tokens=1)

    def sync(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        return {"kind": "cheaper-when-larger", "size": self.size}

    def close(self) -> None: ...


def cheaper_when_larger(options: dict[str, Any], ctx: WorkloadContext) -> CheaperWhenLarger:
    return CheaperWhenLarger(int(options.get("size", 28)))
