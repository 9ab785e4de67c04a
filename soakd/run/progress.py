"""The runner's rolling statistics for the once-a-second progress snapshot (bounded)."""

from __future__ import annotations

import statistics
from collections import deque

from soakd.records import STAGES, FrameRecord


class Rolling:
    """Recent per-stage values for the once-a-second progress snapshot (bounded)."""

    def __init__(self, n: int = 128) -> None:
        self.vals = {k: deque[float](maxlen=n) for k in (*STAGES, "age", "e2e")}
        self.done_times: deque[float] = deque(maxlen=4096)

    def add(self, r: FrameRecord) -> None:
        if r.skipped:
            return
        for key, value in (
            ("grab", r.grab_ms), ("pre", r.pre_ms), ("infer", r.infer_ms),
            ("decode", r.decode_ms), ("total", r.total_ms), ("age", r.frame_age_ms),
            ("e2e", r.e2e_ms),
        ):  # fmt: skip
            if value is not None:
                self.vals[key].append(value)
        if r.t_done is not None:
            self.done_times.append(r.t_done)

    def worst_ms(self) -> float | None:
        """The longest recent frame (its stages, or capture to output): what a healthy
        frame can take, for sizing the stall timeout."""
        worst = [max(self.vals[k]) for k in ("total", "e2e") if self.vals[k]]
        return max(worst) if worst else None

    def median(self, key: str) -> float | None:
        d = self.vals[key]
        return statistics.median(d) if d else None

    def fps(self, now_s: float, window_s: float = 5.0) -> float:
        times = self.done_times
        if not times:
            return 0.0
        lo = now_s - window_s
        n = sum(1 for t in reversed(times) if t >= lo)
        span = min(window_s, max(now_s, 1e-9))
        return n / span
