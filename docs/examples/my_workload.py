"""A complete user's own workload for soakd: ``kind = "python"``.

Run it (from the repository root, or anywhere this file's folder is on PYTHONPATH)::

    PYTHONPATH=docs/examples soakd run --duration 60s \
        --set workload.kind=python --set workload.factory=my_workload:make \
        --set 'workload.options={kernel = 5}'

soakd imports ``my_workload``, calls ``make(options, ctx)`` once before the run starts, and
drives the object it returns through the staged protocol: ``preprocess`` -> ``infer`` ->
``decode`` per frame, each timed on the monotonic clock. Here the "model" is a box blur and a
brightness histogram in numpy, standing in for your own pipeline.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from soakd.records import Frame, StageOutput
from soakd.workloads.base import WorkloadContext, WorkloadError


class BlurAndHistogram:
    """A staged workload: the three stages soakd times, plus setup/sync/describe/close."""

    shape: Literal["staged"] = "staged"

    def __init__(self, kernel: int, bins: int) -> None:
        self.kernel = kernel
        self.bins = bins
        self.weights: np.ndarray | None = None

    def setup(self) -> None:
        """Load the model (here: build the kernel). Runs once, before the clock starts."""
        self.weights = np.full(self.kernel, 1.0 / self.kernel, dtype=np.float32)

    def preprocess(self, frame: Frame) -> np.ndarray:
        """Frames are HxWx3 uint8 BGR arrays; return whatever infer needs."""
        return frame.image.mean(axis=2, dtype=np.float32)

    def infer(self, grey: np.ndarray) -> np.ndarray:
        assert self.weights is not None, "setup() was not called"
        blur = np.apply_along_axis(np.convolve, 1, grey, self.weights, mode="same")
        return np.apply_along_axis(np.convolve, 0, blur, self.weights, mode="same")

    def decode(self, blurred: np.ndarray) -> StageOutput:
        hist, _ = np.histogram(blurred, bins=self.bins, range=(0, 255))
        return StageOutput(text=f"peak bin {int(hist.argmax())}", extra={"bins": self.bins})

    def sync(self) -> None:
        """Wait for the device (e.g. torch.cuda.synchronize()); nothing to wait for on CPU."""

    def describe(self) -> dict[str, Any]:
        """Every setting that changes timing; stored with the run."""
        return {"model": "box blur + histogram", "kernel": self.kernel, "bins": self.bins}

    def close(self) -> None:
        self.weights = None


def make(options: dict[str, Any], ctx: WorkloadContext) -> BlurAndHistogram:
    """The factory: ``options`` is the ``[workload.options]`` table, ``ctx`` the harness
    context (seed, frame size, fps...). Raise WorkloadError for bad options: soakd prints it
    as a one-line error and exits 2 before the run starts."""
    kernel = int(options.get("kernel", 5))
    if kernel < 1 or kernel % 2 == 0:
        raise WorkloadError(f"workload.options.kernel: must be a positive odd number, got {kernel}")
    return BlurAndHistogram(kernel, int(options.get("bins", 16)))
