"""Exact order statistics of a float32 series too long to hold, in two streamed passes.

The judge reads millisecond columns as float32 (``soakd.store.rundata``), and a float32 maps
to a 32-bit key that sorts as the value does. Pass 1 (``add``) counts the keys' top
``TOP_BITS`` (a histogram of 2^18 bins, 2 MB) besides n, sum, min and max; ``want`` then
names the ranks needed, and pass 2 (``refine``) counts the low bits of the keys in just the
bins holding those ranks (it may be fed only the values within ``bounds``: SQLite picks
them). ``order_stat`` / ``percentile`` / ``median`` are then exact (the same order
statistics as numpy on the whole array; numpy's linear interpolation is redone in float64).
Memory is fixed whatever the run's length.

Between the passes only the bins are known: a value is placed within a relative
``BIN_RELATIVE`` (2^-9 = 0.2 %), which is what ``approx_mad`` gives (used only for evidence,
and said so there).
"""

from __future__ import annotations

import math

import numpy as np

TOP_BITS = 18
LOW_BITS = 32 - TOP_BITS
BIN_RELATIVE = 2.0 ** -(TOP_BITS - 9)  # 8 exponent bits + sign: the rest is the mantissa

_SIGN = np.uint32(0x80000000)


def ordered_keys(values: np.ndarray) -> np.ndarray:
    """uint32 keys of float32 values that sort as the values do (NaN excluded by callers)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return np.where(bits & _SIGN, ~bits, bits | _SIGN)


def key_values(keys: np.ndarray) -> np.ndarray:
    """The float32 values of keys (inverse of ``ordered_keys``), as float64."""
    k = np.asarray(keys, dtype=np.uint32)
    bits = np.where(k & _SIGN, k & ~_SIGN, ~k).astype(np.uint32)
    return bits.view(np.float32).astype(np.float64)


def key_value(key: int) -> float:
    return float(key_values(np.array([key]))[0])


class StreamQuantiles:
    """n, sum, min, max and exact order statistics of the finite values fed to it (see the
    module docstring for the two passes)."""

    def __init__(self) -> None:
        self.n = 0
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.top = np.zeros(1 << TOP_BITS, dtype=np.int64)
        self._low: dict[int, np.ndarray] = {}  # top bin -> histogram of its low bits
        self._ranks: set[int] = set()

    def add(self, values: np.ndarray) -> None:
        """Pass 1: fold a chunk of values in (NaN ignored)."""
        v = values[np.isfinite(values)]
        if not v.size:
            return
        self.n += int(v.size)
        self.sum += float(np.sum(v, dtype=np.float64))
        self.min = min(self.min, float(v.min()))
        self.max = max(self.max, float(v.max()))
        self.top += np.bincount(ordered_keys(v) >> LOW_BITS, minlength=1 << TOP_BITS)

    @property
    def mean(self) -> float:
        return self.sum / self.n if self.n else math.nan

    def want(self, ranks: set[int]) -> None:
        """Ranks (0-based, ascending) the second pass must resolve."""
        cum = np.cumsum(self.top)
        for r in ranks:
            if 0 <= r < self.n:
                self._ranks.add(r)
                b = int(np.searchsorted(cum, r, side="right"))
                self._low.setdefault(b, np.zeros(1 << LOW_BITS, dtype=np.int64))

    def want_percentiles(self, qs: tuple[float, ...]) -> None:
        self.want({r for q in qs for r in _percentile_ranks(self.n, q)})

    def refine(self, values: np.ndarray) -> None:
        """Pass 2: the same values again (same chunks or not, any order)."""
        if not self._low:
            return
        keys = ordered_keys(values[np.isfinite(values)])
        top = keys >> LOW_BITS
        for b, low in self._low.items():
            low += np.bincount(keys[top == b] & ((1 << LOW_BITS) - 1), minlength=1 << LOW_BITS)

    def bins(self) -> list[tuple[int, float, float]]:
        """The bins holding a wanted rank as (bin, lowest value, step): inside a bin the
        exponent is fixed, so its 2^LOW_BITS float32 values are ``lowest + step * i``."""
        out = []
        for b in self._low:
            lo = key_value(b << LOW_BITS)
            out.append((b, lo, key_value((b << LOW_BITS) + 1) - lo))
        return out

    def bounds(self) -> list[tuple[float, float]]:
        """Per bin holding a wanted rank, a range (inclusive) of float64 values that holds
        every value whose float32 falls in the bin (its ends' float32 neighbours; -inf /
        inf past the finite ones): what pass 2 asks SQLite for (``rundata.measured_matching``)."""
        out = []
        for b in self._low:
            lo_key, hi_key = (b << LOW_BITS) - 1, (b + 1) << LOW_BITS
            lo = key_value(lo_key) if lo_key >= 0 else -math.inf
            hi = key_value(hi_key) if hi_key < 1 << 32 else math.inf
            out.append((-math.inf if math.isnan(lo) else lo, math.inf if math.isnan(hi) else hi))
        return out

    def order_stat(self, r: int) -> float:
        """The value of rank ``r`` (0-based ascending); ``want`` must have named it."""
        cum = np.cumsum(self.top)
        b = int(np.searchsorted(cum, r, side="right"))
        low = self._low.get(b)
        if low is None:
            raise KeyError(f"rank {r} was not requested before the second pass")
        within = r - (int(cum[b - 1]) if b else 0)
        lo = int(np.searchsorted(np.cumsum(low), within, side="right"))
        return key_value((b << LOW_BITS) | lo)

    def percentile(self, q: float) -> float:
        """numpy's default (linear) percentile ``q`` of the values."""
        lo, hi = _percentile_ranks(self.n, q)
        h = (self.n - 1) * q / 100.0
        a, b = self.order_stat(lo), self.order_stat(hi)
        return a + (h - lo) * (b - a)

    def median(self) -> float:
        return self.percentile(50.0)

    def bin_range(self, r: int) -> tuple[float, float]:
        """The values the bin of rank ``r`` spans (known after pass 1 alone)."""
        b = int(np.searchsorted(np.cumsum(self.top), r, side="right"))
        return key_value(b << LOW_BITS), key_value(((b + 1) << LOW_BITS) - 1)

    def resolved(self, q: float) -> bool:
        """Whether percentile ``q`` is exact (its ranks were refined)."""
        return all(r in self._ranks for r in _percentile_ranks(self.n, q))

    def approx_percentile(self, q: float) -> float:
        """Percentile ``q``: exact when refined, else from the pass-1 bins (the middle of
        the bin of each rank, within BIN_RELATIVE), clamped to [min, max]."""
        if self.resolved(q):
            return self.percentile(q)
        lo, hi = _percentile_ranks(self.n, q)
        h = (self.n - 1) * q / 100.0
        a, b = (sum(self.bin_range(r)) / 2 for r in (lo, hi))
        return min(max(a + (h - lo) * (b - a), self.min), self.max)

    def approx_mad(self, med: float) -> float:
        """The median absolute deviation from ``med``, from the pass-1 bins (each bin read as
        its middle value): within about BIN_RELATIVE of the values near ``med``."""
        has = np.flatnonzero(self.top).astype(np.uint32)
        mids = (key_values(has << LOW_BITS) + key_values(((has + 1) << LOW_BITS) - 1)) / 2
        dev = np.abs(mids - med)
        order = np.argsort(dev, kind="stable")
        cum = np.cumsum(self.top[has][order])
        return float(dev[order][int(np.searchsorted(cum, (self.n - 1) // 2, side="right"))])


def _percentile_ranks(n: int, q: float) -> tuple[int, int]:
    """The two ranks numpy's linear percentile interpolates between."""
    h = (n - 1) * q / 100.0
    lo = math.floor(h)
    return lo, min(lo + 1, n - 1)
