"""A deterministic moving test pattern: no files, no devices, no randomness between runs.

Frame ``n`` depends only on ``(seed, n, pattern, width, height)``. The pattern is rendered
once into a strip one period wider than the frame; frame ``n`` is the window at offset
``n * step`` (mod the period), copied out, with ``n`` stamped as 32 black/white blocks in
the top rows (``frame_index`` reads it back). A read costs one memcpy of the frame, so a
no-op workload at hundreds of fps is never capture-bound.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from soakd.config import SourceSettings

STAMP_BITS = 32
STAMP_ROWS = 4

# BGR: white, yellow, cyan, green, magenta, red, blue, black (the classic colour bars)
_BARS = np.array(
    [
        [255, 255, 255],
        [0, 255, 255],
        [255, 255, 0],
        [0, 255, 0],
        [255, 0, 255],
        [0, 0, 255],
        [255, 0, 0],
        [0, 0, 0],
    ],
    dtype=np.uint8,
)


def _tile(pattern: str, width: int, height: int, seed: int) -> np.ndarray:
    """One horizontal period of the pattern, HxPx3 uint8 (P is the period in pixels)."""
    rng = np.random.default_rng(seed)
    if pattern == "bars":
        bar_w = max(1, width // len(_BARS))
        colours = _BARS[rng.permutation(len(_BARS))]
        row = np.repeat(colours, bar_w, axis=0)  # (8*bar_w, 3)
        tile = np.broadcast_to(row, (height, *row.shape)).copy()
        # a darker lower third keeps frames from being vertically uniform
        tile[2 * height // 3 :] //= 2
        return tile
    if pattern == "gradient":
        x = np.arange(width, dtype=np.float64) / width
        y = np.arange(height, dtype=np.float64)[:, None] / max(height - 1, 1)
        phase = rng.uniform(0, 2 * np.pi, size=3)
        chans = [
            0.5 + 0.5 * np.sin(2 * np.pi * x[None, :] + phase[c]) * (0.5 + 0.5 * y)
            for c in range(3)
        ]
        return np.clip(np.stack(chans, axis=-1) * 255, 0, 255).astype(np.uint8)
    if pattern == "noise":
        return rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    raise ValueError(f"source.pattern: unknown pattern {pattern!r}")


def frame_index(image: np.ndarray) -> int | None:
    """The frame number stamped into a synthetic frame, or None when the frame is too small
    to carry the stamp (narrower than 32 px) or was resized."""
    width = image.shape[1]
    bw = width // STAMP_BITS
    if bw < 1:
        return None
    centres = image[0, bw // 2 : STAMP_BITS * bw : bw, 0][:STAMP_BITS]
    bits = (centres > 127).astype(np.int64)
    return int((bits << np.arange(STAMP_BITS, dtype=np.int64)).sum())


class SyntheticSource:
    """A moving bars / gradient / noise pattern at ``width`` x ``height``."""

    def __init__(self, settings: SourceSettings, *, fps: float, seed: int = 0) -> None:
        self.settings = settings
        self.fps = fps
        self.seed = seed
        self.width, self.height = settings.width, settings.height
        self.step = max(1, self.width // 80)
        self._strip: np.ndarray | None = None
        self._period = 0
        self._n = 0
        bw = self.width // STAMP_BITS
        self._stamp_cols = STAMP_BITS * bw
        self._stamp_rows = min(STAMP_ROWS, self.height)
        self._bit_of_col = np.repeat(np.arange(STAMP_BITS, dtype=np.int64), bw)
        self._min_gap_s = 1.0 / settings.max_fps if settings.max_fps > 0 else 0.0
        self._next_s = 0.0

    def open(self) -> None:
        if self._strip is not None:
            return
        tile = _tile(self.settings.pattern, self.width, self.height, self.seed)
        self._period = tile.shape[1]
        reps = -(-(self.width + self._period) // self._period)
        self._strip = np.ascontiguousarray(
            np.tile(tile, (1, reps, 1))[:, : self.width + self._period]
        )

    def render(self, n: int) -> np.ndarray:
        """Frame ``n`` (a fresh array the caller owns)."""
        if self._strip is None:
            self.open()
        assert self._strip is not None
        off = (n * self.step) % self._period
        out = self._strip[:, off : off + self.width].copy()
        if self._stamp_cols:
            bits = ((n >> self._bit_of_col) & 1).astype(np.uint8) * 255
            out[: self._stamp_rows, : self._stamp_cols] = bits[None, :, None]
        return out

    def read(self) -> tuple[np.ndarray, float | None]:
        if self._min_gap_s:  # a source slower than the rate: block until it has a frame
            now = time.perf_counter()
            if now < self._next_s:
                time.sleep(self._next_s - now)
            self._next_s = max(now, self._next_s) + self._min_gap_s
        n = self._n
        self._n = n + 1
        return self.render(n), n / self.fps

    def close(self) -> None:
        self._strip = None

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "synthetic",
            "pattern": self.settings.pattern,
            "width": self.width,
            "height": self.height,
            "seed": self.seed,
            "step_px": self.step,
            "fps": self.fps,
            "max_fps": self.settings.max_fps,
        }
