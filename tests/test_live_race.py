"""The early-stop observer under real threads: the sampler appends to the live series while
the monitor's look reads them. A look never raises and the observer is never dropped (a
numpy view of a growing buffer once raised ``BufferError`` in the sampler's append and
switched ``run.stop_on_fail`` off for the rest of the run)."""

from __future__ import annotations

import threading
import time

import numpy as np

from soakd.analysis.criteria.base import LiveTable
from soakd.config import load_settings
from soakd.observers.base import Observers, Progress
from soakd.records import Event, Sample
from soakd.run.early_stop import watch_early_stop


def _progress(t: float) -> Progress:
    return Progress(elapsed_s=t, remaining_s=1e6 - t, frames_done=0, frames_captured=0,
                    achieved_fps=10.0, drops=0, stale=0, errors=0, age_p50_ms=None)  # fmt: skip


def test_a_look_under_heavy_concurrent_appends_never_drops_the_observer() -> None:
    """A sampler thread appending as fast as it can while 40 looks read the series: the
    early-stop observer a run builds stays among the observers, no hook raised, and every
    sample appended was kept."""
    settings = load_settings(
        overrides=["run.stop_on_fail=true", "run.duration=100000", "criteria.floor_window_s=0.25"]
    )
    failed: list[tuple[str, BaseException]] = []
    [watch] = watch_early_stop(settings, lambda e: None, lambda r: None)
    obs = Observers([watch], failed=lambda o, hook, exc: failed.append((hook, exc)))
    obs.on_event(Event("warmup_end", 0.0, 0.0))
    stop, sent = threading.Event(), [0]

    def sampler() -> None:
        while not stop.is_set():
            i = sent[0]
            obs.on_sample(Sample(i, 0.01 * i, 0.0, 0.0, 0.0, {"rss_bytes": 1e8 + i % 7}))
            sent[0] = i + 1

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        while sent[0] < 500:
            time.sleep(0.01)
        for k in range(1, 41):  # a look at each: 5 floor windows of 0.25 s apart
            obs.on_progress(_progress(10.0 + 1.25 * k))
    finally:
        stop.set()
        thread.join()
    assert failed == [] and obs.observers == [watch]
    assert watch.live.samples.appended == sent[0]  # type: ignore[attr-defined]


def test_a_full_live_table_halves_keeping_each_pair_s_floor_and_first_time() -> None:
    """Past its rows a live table merges pairs of rows (the first's time, the lower value)
    instead of growing; a table of medians keeps every other row whole."""
    floors, every = LiveTable(("t", "y"), rows=4), LiveTable(("t", "y"), rows=4, floor=False)
    for i, y in enumerate([5.0, 3.0, 4.0, 6.0, 1.0]):
        floors.append((float(i), y))
        every.append((float(i), y))
    got, kept = floors.snapshot(), every.snapshot()
    assert got["t"].tolist() == [0.0, 2.0, 4.0] and got["y"].tolist() == [3.0, 4.0, 1.0]
    assert kept["t"].tolist() == [0.0, 2.0, 4.0] and kept["y"].tolist() == [5.0, 4.0, 1.0]
    assert floors.appended == 5 and floors.merges == 1 and np.isnan(floors._buf[3:]).all()
