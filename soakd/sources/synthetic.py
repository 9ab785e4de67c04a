"""A deterministic moving test pattern: no files, no devices, no randomness between runs.

Frame ``n`` depends only on ``(seed, n, pattern, width, height)``. The pattern is rendered
once into a strip one period wider than the frame; frame ``n`` is the window at offset
``n * step`` (mod the period), copied out, with ``n`` stamped as 32 black/white blocks in
the top rows (``frame_index`` reads it back). A read joins the stamped rows and the
window's bytes (made at open when the distinct windows fit in WINDOW_CACHE_BYTES) into one new
buffer, about 1 µs at 64x48: a no-op workload at hundreds of thousands of fps is never
capture-bound.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from soakd.config import SourceSettings

STAMP_BITS = 32
STAMP_ROWS = 4
#: the pattern's distinct windows are made once, at open, when they fit in this much memory
#: (64x48 bars: 64 windows, 0.6 MB; the default 320x240: 80 windows, 18 MB, cut from the
#: strip at each read instead). At open, not on first use: memory that grows during the first
#: seconds of a run would read as a leak.
WINDOW_CACHE_BYTES = 4 << 20
_U8 = np.dtype(np.uint8)
_JOIN = bytearray().join  # one new, writable buffer from the pieces

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


class _Stamp:
    """``n`` as STAMP_BITS black/white blocks (``width // STAMP_BITS`` pixels each, bit 0
    leftmost): the bytes of one stamped row, from four looked-up strings (one per byte of
    ``n``; the upper three change every 256 frames and are kept)."""

    def __init__(self, width: int) -> None:
        bw = width // STAMP_BITS
        #: each byte value's eight blocks, as BGR bytes (none when too narrow to stamp)
        self.blocks = [
            b"".join((b"\xff" if (v >> i) & 1 else b"\x00") * (3 * bw) for i in range(8))
            for v in range(256)
        ] if bw else [b""] * 256  # fmt: skip
        self.nbytes = len(self.blocks[0]) * 4
        self._hi_of: int | None = None  # n >> 8 whose upper three bytes are in _hi
        self._hi = b""

    def row(self, n: int) -> bytes:
        if n >> 8 != self._hi_of:
            self._hi_of = n >> 8
            self._hi = b"".join(self.blocks[(n >> s) & 255] for s in (8, 16, 24))
        return self.blocks[n & 255] + self._hi


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
        self._shape = (self.height, self.width, 3)
        self._windows: list[tuple[bytes, ...] | None] = []  # by offset, made at open
        self._stamp = _Stamp(self.width)
        self._min_gap_s = 1.0 / settings.max_fps if settings.max_fps > 0 else 0.0
        self._next_s = 0.0

    def open(self) -> None:
        if self._strip is not None:
            return
        assert self.height >= STAMP_ROWS  # SourceSettings: height >= 8
        tile = _tile(self.settings.pattern, self.width, self.height, self.seed)
        self._period = tile.shape[1]
        reps = -(-(self.width + self._period) // self._period)
        self._strip = np.ascontiguousarray(
            np.tile(tile, (1, reps, 1))[:, : self.width + self._period]
        )
        self._windows = [None] * self._period
        distinct = self._period // math.gcd(self._period, self.step)
        if distinct * self.height * self.width * 3 <= WINDOW_CACHE_BYTES:
            for k in range(distinct):
                off = (k * self.step) % self._period
                self._windows[off] = self._cut(off)

    def _cut(self, off: int) -> tuple[bytes, ...]:
        """The pattern at offset ``off`` as the frame's bytes around the stamp: each stamped
        row's bytes after the stamp, then every row below."""
        assert self._strip is not None
        data = self._strip[:, off : off + self.width].tobytes()
        row, k = self.width * 3, self._stamp.nbytes
        rests = tuple(data[r * row + k : (r + 1) * row] for r in range(STAMP_ROWS))
        return (*rests, data[STAMP_ROWS * row :])

    def render(self, n: int) -> np.ndarray:
        """Frame ``n`` (a fresh, writable array the caller owns): the stamped rows and the
        window's bytes joined into one new buffer."""
        if self._strip is None:
            self.open()
        off = (n * self.step) % self._period
        r0, r1, r2, r3, below = self._windows[off] or self._cut(off)
        s = self._stamp.row(n)
        return np.ndarray(self._shape, _U8, _JOIN((s, r0, s, r1, s, r2, s, r3, below)))

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
