"""Runs written through the store, row by row, for tests that pin a verdict rule at its
boundary: ``healthy`` lays out a staged run's columns (numpy arrays named as FrameRecord's
fields), a test plants its values, and ``store_run`` writes the frames, samples, emissions
and events with ``soakd.store.db.insert_rows`` into a real SQLite run database, with the
``runs`` row (config, summary) written by ``conftest.make_run``. The tests then judge what
``soakd.analysis`` loads back, on the exact path or the bounded one."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from soakd.analysis import criteria_of, evaluate, judge
from soakd.analysis.data import load_run_data
from soakd.analysis.model import RunData, Verdict
from soakd.records import Emission, Event, FrameRecord, Sample
from soakd.store import db as store

from .conftest import make_run

MIB = float(1 << 20)
_REQUIRED = ("t_sched", "t_capture", "t_dispatch", "t_done", "lateness_ms", "grab_ms")


def healthy(dur: float = 120.0, fps: float = 10.0, warm: float = 5.0, seed: int = 0) -> dict:
    """A healthy staged run's frame columns: ``dur`` s at ``fps``, the first frame and those
    captured in the first ``warm`` s flagged warm-up, 20 ms infer with 5 % jitter, a few ms
    of frame age, no drops."""
    rng = np.random.default_rng(seed)
    t = np.arange(0, dur, 1 / fps)
    n = t.size
    infer = 20 * np.exp(rng.normal(0, 0.05, n))
    age = 3 + rng.gamma(2, 0.5, n)
    cols: dict[str, Any] = {
        "frame_id": np.arange(n),
        "t_sched": t,
        "t_capture": t + 0.001,
        "lateness_ms": np.full(n, 0.5),
        "grab_ms": np.full(n, 0.5),
        "pre_ms": np.full(n, 1.0),
        "infer_ms": infer,
        "decode_ms": np.full(n, 1.0),
        "frame_age_ms": age,
        "queue_len": np.zeros(n, dtype=int),
        "drop_count": np.zeros(n, dtype=int),
        "stale_count": np.zeros(n, dtype=int),
        "warmup": (t < warm) | (np.arange(n) == 0),
        "first": np.arange(n) == 0,
        "skipped": np.zeros(n, dtype=bool),
        "error": np.full(n, None, dtype=object),
    }
    cols["total_ms"] = cols["grab_ms"] + cols["pre_ms"] + infer + cols["decode_ms"]
    return cols


def _value(v: Any) -> Any:
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return None if np.isnan(v) else float(v)
    return v


def frame_records(cols: dict[str, Any]) -> list[FrameRecord]:
    """FrameRecords from ``healthy``-style columns; dispatch and done times follow from
    the frame age and the stage times (none for a skipped frame)."""
    n = len(cols["t_capture"])
    cols = dict(cols)
    if "t_dispatch" not in cols:
        disp = cols["t_capture"] + cols["frame_age_ms"] / 1e3
        cols["t_dispatch"] = np.where(cols["skipped"], np.nan, disp)
        cols["t_done"] = np.where(cols["skipped"], np.nan, disp + cols["total_ms"] / 1e3)
    names = [f for f in FrameRecord._fields if f in cols]
    return [FrameRecord(**{k: _value(cols[k][i]) for k in names}) for i in range(n)]


def flat_samples(dur: float, seed: int = 0, every: float = 0.5) -> list[Sample]:
    """Telemetry every ``every`` s: RSS flat at 400 MB with 0.2 MB of noise."""
    rng = np.random.default_rng(seed + 1)
    st = np.arange(0, dur, every)
    rss = 400 * MIB + rng.normal(0, 0.2 * MIB, st.size)
    return [
        Sample(i, float(t), 0.0, 0.0, 0.1, {"rss_bytes": int(r), "cpu_pct": 50.0})
        for i, (t, r) in enumerate(zip(st, rss, strict=True))
    ]


#: a tick of the host telemetry: (host_cpu_pct, soakd's cpu_pct, server_cpu_pct) on 1 CPU
HostTick = tuple[float, float, float]


def host_samples(
    dur: float, tick: float, busy: Callable[[np.ndarray], np.ndarray], in_busy: HostTick,
    rest: HostTick,
) -> list[Sample]:  # fmt: skip
    """Ticks every ``tick`` s, each covering the ``tick`` before it: ``in_busy`` where
    ``busy(t)`` holds at the tick's middle, ``rest`` elsewhere; RSS flat."""
    out = []
    for i, t in enumerate(np.arange(tick, dur + tick, tick)):
        host, own, server = in_busy if busy(np.asarray(t - tick / 2)) else rest
        values = {"rss_bytes": 400 << 20, "host_cpu_pct": host, "cpu_pct": own,
                  "server_cpu_pct": server}  # fmt: skip
        out.append(Sample(i, float(t), 0.0, 0.0, 0.1, values))
    return out


def criteria(**over: Any) -> dict[str, Any]:
    """``[criteria]`` for these runs: short-run validity, memory far from deciding."""
    return {"min_duration_s": 10, "min_frames": 10, "max_memory_growth_mb_per_min": 1000.0,
            **over}  # fmt: skip


def store_run(
    conn: sqlite3.Connection,
    rid: str,
    cols: dict[str, Any],
    *,
    crit: dict[str, Any] | None = None,
    run: dict[str, Any] | None = None,
    dur: float = 120.0,
    fps: float = 10.0,
    samples: Sequence[Sample] | None = None,
    events: Sequence[Event] = (),
    emissions: Sequence[Emission] = (),
    **meta: Any,
) -> str:
    """Write one completed run: its ``runs`` row (``run``: the ``[run]`` table, default
    warm-up 5 s; ``meta``: other make_run fields), frames from ``cols``, samples (default
    ``flat_samples``), events (default a ``warmup_end`` at the configured warm-up, when it
    is over 0, as the runner logs it) and emissions."""
    run = {"warmup_s": 5.0, "fps": fps, **(run or {})}
    warm = float(run["warmup_s"])
    if not events and warm > 0:
        events = [Event("warmup_end", warm, 0.0, f"warm-up of {warm:g} s ended")]
    config = {"run": run, "criteria": criteria(**(crit or {})), "workload": {"kind": "synthetic"}}
    make_run(conn, id=rid, fps=fps, duration_s=dur, config=config, **meta)
    with store.atomic(conn):
        store.insert_rows(conn, FrameRecord, rid, [store.frame_values(r) for r in
                                                   frame_records(cols)])  # fmt: skip
        smp = flat_samples(dur) if samples is None else samples
        store.insert_rows(conn, Sample, rid, [store.sample_values(s) for s in smp])
        store.insert_rows(conn, Event, rid, [store.event_values(e) for e in events])
        store.insert_rows(conn, Emission, rid, [store.emission_values(e) for e in emissions])
    return rid


def judged(conn: sqlite3.Connection, rid: str, bounded: bool = False) -> Verdict:
    """The stored run judged by its own criteria: as ``soakd gate`` does (``evaluate``), or
    forced onto the bounded path (its rows streamed from the store)."""
    if not bounded:
        return evaluate(conn, rid)[1]
    data: RunData = load_run_data(conn, rid, bounded=True)
    return judge(data, criteria_of(data)[0])


def status(v: Verdict, criterion: str) -> str:
    c = v.get(criterion)
    assert c is not None, f"no criterion {criterion}: {[x.criterion for x in v.criteria]}"
    return c.status
