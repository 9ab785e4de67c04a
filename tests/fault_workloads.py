"""Workloads used by tests/test_faults.py through ``kind = "python"`` factories."""

from __future__ import annotations

import time
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

    def setup(self) -> None:
        # import torch while loading, as a real model does: importing it in the first frame
        # took longer than a short run on a busy machine (the test was flaky)
        import torch

        self.oom = torch.OutOfMemoryError

    def preprocess(self, frame: Frame) -> Any:
        return frame.id

    def infer(self, inputs: Any) -> Any:
        self.n += 1
        if self.n % self.every == 0:
            raise self.oom("CUDA out of memory. Tried to allocate 2.00 GiB")
        return inputs

    def decode(self, outputs: Any) -> StageOutput:
        return StageOutput(text="ok", tokens=1)

    def sync(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        return {"kind": "oom-every", "every": self.every}

    def close(self) -> None: ...


def oom_every(options: dict[str, Any], ctx: WorkloadContext) -> OomEvery:
    return OomEvery(int(options.get("every", 5)))


class SlowingGenerator:
    """A generator whose gap between chunks grows with elapsed time (a streaming model that
    slows down): 4 chunks of 2 frames per request, gap = base + slope * elapsed."""

    shape: Literal["generator"] = "generator"

    def __init__(self, base_ms: float, slope_ms_per_s: float) -> None:
        self.base_ms = base_ms
        self.slope = slope_ms_per_s
        self.t0: float | None = None

    def setup(self) -> None:
        import time

        self.t0 = time.perf_counter()

    def generate(self, frame: Frame, emit: Any) -> Any:
        import time

        from soakd.workloads.base import GeneratorTimings

        assert self.t0 is not None
        for _ in range(4):
            gap = self.base_ms + self.slope * (time.perf_counter() - self.t0)
            time.sleep(gap / 1000)
            emit(2)
        return GeneratorTimings(infer_ms=None)

    def describe(self) -> dict[str, Any]:
        return {"kind": "slowing-generator", "base_ms": self.base_ms, "slope": self.slope}

    def close(self) -> None: ...


def slowing_generator(options: dict[str, Any], ctx: WorkloadContext) -> SlowingGenerator:
    return SlowingGenerator(float(options.get("base_ms", 5)), float(options.get("slope", 0)))


class Lifecycle:
    """A staged workload that fails where ``options`` say: ``fail = "setup" | "close" |
    "exit" | "memory"`` (setup raises, close raises, setup calls sys.exit(0), or every 3rd
    infer raises MemoryError as a host out of memory would)."""

    shape: Literal["staged"] = "staged"

    def __init__(self, fail: str, first_s: float = 0.0, concurrent: bool = False) -> None:
        self.fail = fail
        self.first_s = first_s  # the first infer takes this long (a compile, a cache fill)
        self.concurrent = concurrent  # one frame in flight per stream (drivers/concurrent.py)
        self.n = 0

    def setup(self) -> None:
        if self.fail == "setup":
            raise RuntimeError("weights are corrupt")
        if self.fail == "exit":
            import sys

            sys.exit(0)

    def preprocess(self, frame: Frame) -> Any:
        return frame.id

    def infer(self, inputs: Any) -> Any:
        self.n += 1
        if self.n == 1 and self.first_s:
            time.sleep(self.first_s)
        if self.fail == "memory" and self.n % 3 == 0:
            raise MemoryError("cannot allocate 64 MiB")
        return inputs

    def decode(self, outputs: Any) -> StageOutput:
        return StageOutput(text="ok", tokens=1)

    def sync(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        return {"kind": "lifecycle", "fail": self.fail}

    def close(self) -> None:
        if self.fail == "close":
            raise RuntimeError("generation thread died: CUDA error: device-side assert")


def lifecycle(options: dict[str, Any], ctx: WorkloadContext) -> Lifecycle:
    return Lifecycle(
        str(options["fail"]),
        float(options.get("first_s", 0.0)),
        bool(options.get("concurrent", False)),
    )
