"""The monotonic clock, injectable. Every interval in soakd is measured on it; wall-clock
time is only stored to join with outside logs."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ns(self) -> int: ...
    def wall(self) -> float: ...
    def sleep_until(self, deadline_ns: int, stop: threading.Event) -> bool:
        """Sleep until ``deadline_ns``; returns False early if ``stop`` is set."""
        ...


class MonotonicClock:
    """``perf_counter_ns`` (monotonic, highest resolution) for intervals."""

    # sleeping the last stretch in a spin loop keeps pacing error in the tens of microseconds
    SPIN_NS = 300_000

    #: ``perf_counter_ns`` itself, not a method wrapping it: the drivers read the clock five
    #: times a frame, and a Python-level call would double what each read costs
    now_ns = staticmethod(time.perf_counter_ns)
    wall = staticmethod(time.time)

    def sleep_until(self, deadline_ns: int, stop: threading.Event) -> bool:
        while True:
            remaining = deadline_ns - time.perf_counter_ns()
            if remaining <= 0:
                return not stop.is_set()
            if remaining > self.SPIN_NS:
                if stop.wait((remaining - self.SPIN_NS) / 1e9):
                    return False
            else:
                if stop.is_set():
                    return False
                time.sleep(0)


class FakeClock:
    """A clock for tests: time only moves when something sleeps or ``advance`` is called."""

    def __init__(self, start_ns: int = 0, wall0: float = 1_700_000_000.0) -> None:
        self._now = start_ns
        self._wall0 = wall0
        self._start = start_ns
        self._lock = threading.Lock()

    def now_ns(self) -> int:
        return self._now

    def wall(self) -> float:
        return self._wall0 + (self._now - self._start) / 1e9

    def advance(self, ns: int) -> None:
        with self._lock:
            self._now += ns

    def sleep_until(self, deadline_ns: int, stop: threading.Event) -> bool:
        if stop.is_set():
            return False
        with self._lock:
            if deadline_ns > self._now:
                self._now = deadline_ns
        return True
