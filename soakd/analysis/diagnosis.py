"""Plain-language hints from the data, printed beside the verdict.

Each rule looks at window medians of the stage times, the memory series and the
utilisation samples and says what it sees: which stage grew, whether the frame rate is too
high for the machine (with a recommended rate), whether infer spikes look like memory
pressure, contention or periodic work, and whether memory shows an allocator sawtooth or a
lifted floor. Hints describe; the criteria decide.
"""

from __future__ import annotations

import math

import numpy as np

from soakd.analysis import chunks, stats
from soakd.analysis.contention import other_cpu_pct
from soakd.analysis.model import FAIL, INVALID, MIB, PASS, RunData, Verdict, age_window_s
from soakd.config import CriteriaSettings
from soakd.records import STAGE_COLUMNS

_NAMES = {
    "grab_ms": "grab (capture)",
    "pre_ms": "preprocess",
    "infer_ms": "infer",
    "decode_ms": "decode",
    "total_ms": "total",
}


def stage_growth(
    data: RunData, measured: np.ndarray, t0: float, t1: float, window_s: float, alpha: float
) -> dict[str, tuple[bool, float, float]]:
    """For each stage: (grew, slope in ms/min, median ms). A stage "grew" when its window
    medians trend up significantly and the fitted rise over the run exceeds both 1 ms and
    10 % of its median."""
    out: dict[str, tuple[bool, float, float]] = {}
    t = data.frames["t_capture"][measured]
    for col in (*STAGE_COLUMNS, "queue_len", "frame_age_ms"):
        got = series_growth(t, data.frame(col)[measured], (t0, t1, window_s), alpha, col)
        if got is not None:
            out[col] = got
    return out


def series_growth(
    t: np.ndarray, y: np.ndarray, win_of: tuple[float, float, float], alpha: float, col: str
) -> tuple[bool, float, float] | None:
    """(grew, slope in ms/min, median) of one series over ``win_of`` = (t0, t1, window s),
    by stage_growth's rule; None with fewer than 3 values."""
    t0, t1, window_s = win_of
    ok = np.isfinite(y)
    if ok.sum() < 3:
        return None
    win = stats.window_reduce(t[ok], y[ok], window_s, t0=t0, t1=t1)
    has = win.nonempty()
    tr = stats.trend(win.t[has], win.median[has], alpha)
    med = float(np.median(y[ok]))
    slope = tr.slope * 60
    rise = slope * max(t1 - t0, 0.0) / 60
    floor = 0.5 if col == "queue_len" else max(1.0, 0.1 * med)
    return tr.p < alpha and tr.z > 0 and rise > floor, slope, med


def _named_stage_hints(
    data: RunData,
    verdict: Verdict,
    measured: np.ndarray,
    win_of: tuple[float, float, float],
    alpha: float,
) -> list[str]:
    """A rollout's named stages: each one that grew over the run, and the one that takes
    most of a chunk (named as where to look when playback or the first output failed)."""
    hints = []
    t = data.frames["t_capture"][measured]
    for name, col in data.stages.items():
        got = series_growth(t, col[measured], win_of, alpha, name)
        if got is not None and got[0]:
            hints.append(
                f"stage {name} rose {got[1]:.3g} ms/min (median {got[2]:.3g} ms per chunk): "
                "it grows with the rollout (a growing memory bank, KV window or cache)"
            )
    top = chunks.dominant_stage(data, measured)
    if top is not None:
        name, share, med = top
        chunk = float(np.nanmedian(data.frame("total_ms")[measured]))
        failed = [
            c.criterion
            for c in verdict.criteria
            if c.criterion in ("content_fps", "first_output", "jitter") and c.status == FAIL
        ]
        why = f"; {', '.join(failed)} failed: shorten {name} first" if failed else ""
        hints.append(
            f"stage {name} dominates the chunk: {share:.0%} of it (median {med:.3g} ms of "
            f"{chunk:.3g} ms){why}"
        )
    return hints


def recommended_fps(median_total_ms: float) -> tuple[float, float] | None:
    """1000 / median total x (0.5, 0.7): the rate range to soak at."""
    if not (median_total_ms > 0 and math.isfinite(median_total_ms)):
        return None
    base = 1000.0 / median_total_ms
    return 0.5 * base, 0.7 * base


def diagnose(data: RunData, verdict: Verdict, crit: CriteriaSettings) -> list[str]:
    """Hints for a judged run."""
    hints: list[str] = []
    t0, t1 = float(verdict.window["t0"]), float(verdict.window["t1"])
    warm = data.frames["warmup"] > 0
    measured = ~warm & (data.frames["skipped"] == 0) & (data.frames["t_capture"] >= t0)
    hints += _loss_hints(data, verdict)
    if measured.sum() < 3:
        return hints
    w = age_window_s(t1 - t0, data.meta.fps)
    g = stage_growth(data, measured, t0, t1, w, crit.alpha)
    hints += _stage_hints(
        g, served=data.meta.workload_kind == "openai", host=host_rise(data, t0, t1)
    )
    hints += _named_stage_hints(data, verdict, measured, (t0, t1, w), crit.alpha)
    hints += _rate_hints(data, g, verdict)
    hints += _jitter_hints(data, verdict, g, crit.alpha)
    hints += _memory_hints(data, verdict, g)
    hints += pacing_hints(data, measured)
    return hints


#: the pacer is flagged late when its lateness p95 exceeds both this many times the
#: baseline's p95 and the baseline's p95 plus PACING_MARGIN_MS
PACING_FACTOR = 2.0
PACING_MARGIN_MS = 1.0


def pacing_hints(data: RunData, measured: np.ndarray) -> list[str]:
    """A session run whose pacer woke later than this machine did before the model thread
    started (``summary.pacing_baseline``, measured by the session driver with the pacer's
    own wait): the model's thread takes the GIL or the CPU from soakd's threads."""
    base = data.meta.summary.get("pacing_baseline")
    base = base if isinstance(base, dict) else {}
    b95 = base.get("p95_ms")
    late = data.frame("lateness_ms")[measured]
    late = late[np.isfinite(late)]
    if not isinstance(b95, int | float) or late.size < 10:
        return []
    p95 = float(np.percentile(late, 95))
    if p95 <= max(PACING_FACTOR * b95, b95 + PACING_MARGIN_MS):
        return []
    return [
        f"soakd's pacer woke late while the model ran: lateness p95 {p95:.3g} ms (max "
        f"{late.max():.3g} ms) against p95 {b95:.3g} ms on this machine before the model "
        f"thread started ({base['ticks']} ticks): the model's thread holds the GIL (e.g. "
        "busy-waiting for input) or the CPU, so soakd's own threads run late; frames are "
        "captured and stamped that much late"
    ]


_MODEL_LOSSES = ("dropped", "stale", "session_dropped", "queued_at_end", "in_flight_at_end")


def _loss_hints(data: RunData, verdict: Verdict) -> list[str]:
    """Which side lost the ticks, named only for a kind of loss that is there (at least 1 %
    of the ticks, or any when the drops criterion failed): the source (reads slower than
    the period), the machine (the pacer woke a period late: a pause, an overloaded host) or
    the model (frames captured but not finished)."""
    c = verdict.get("drops")
    ev = c.evidence if c is not None else {}
    ticks = float(ev.get("ticks") or 0)
    if not ticks or c is None:
        return []
    floor = 1 if c.status == FAIL else max(1.0, 0.01 * ticks)
    fps = data.meta.fps
    hints = []
    src, pause = ev.get("missed_ticks_source"), ev.get("missed_ticks_pause")
    missed = float(ev.get("missed_ticks") or 0)
    if src is not None and src >= floor:
        rate = f" (captured {fps * (1 - src / ticks):.3g} of {fps:g} fps)" if fps else ""
        hints.append(
            f"the source is the bottleneck: {src:.0f} of {ticks:.0f} ticks missed because a "
            f"read took a whole frame period or longer{rate}"
        )
    if pause is not None and pause >= floor:
        hints.append(
            f"the machine is the bottleneck: for {pause:.0f} of {ticks:.0f} ticks soakd did "
            "not run on time (the process was paused, e.g. SIGSTOP, or the host overloaded), "
            "so those frames were never captured"
        )
    if src is None and missed >= floor:
        hints.append(
            f"{missed:.0f} ticks missed (this run did not record whether by source or pause)"
        )
    model = sum(float(ev.get(k) or 0) for k in _MODEL_LOSSES)
    cn = ev.get("contention") if c.status == INVALID else None
    if model >= floor and cn:
        hints.append(
            f"the host is the bottleneck for {cn['lost_contended']:.0f} of {ticks:.0f} ticks: "
            f"captured but not finished while other processes held >= "
            f"{cn['contended_cpu_pct']:g} % of the host's CPUs (see drops), not the model"
        )
    elif model >= floor:
        hints.append(
            f"the {'model server' if data.meta.workload_kind == 'openai' else 'model'} is the "
            f"bottleneck for {model:.0f} of {ticks:.0f} ticks: captured but "
            "not finished (dropped, stale, queued or in flight at the end)"
        )
    return hints


def frame_bytes(data: RunData) -> float | None:
    """Bytes one queued frame holds (width x height x 3), when the config fixes the size
    (a synthetic source, or resize = true) or the summary records it."""
    known = data.meta.counter("frame_bytes")
    if known:
        return known
    src = data.meta.config.get("source")
    if not isinstance(src, dict) or not (src.get("kind") == "synthetic" or src.get("resize")):
        return None
    w, h = src.get("width"), src.get("height")
    return float(w * h * 3) if isinstance(w, int) and isinstance(h, int) else None


def _backlog_share(
    data: RunData, g: dict[str, tuple[bool, float, float]], slope: float, tol: float
) -> str | None:
    """When the frame queue grows, how much of the RSS floor's growth (``slope`` MB/min) it
    holds (queue slope x frame bytes), in words: the backlog explains growth away only up
    to that amount, and growth beyond it by more than the tolerance ``tol`` is still named a
    leak. None when the queue holds too little of it to mention."""
    fb = frame_bytes(data)
    if fb is None or not _grew(g, "queue_len") or slope <= 0:
        return None
    q_per_min = g["queue_len"][1]
    held = q_per_min * fb / MIB
    backlog = (
        f"the floor rises {slope:.3g} MB/min while the frame queue grows {q_per_min:.3g} "
        f"frames/min x {fb / MIB:.3g} MB per frame = {held:.3g} MB/min"
    )
    if slope - held > tol:
        return (
            f"{backlog}: the backlog accounts for {held:.3g} MB/min of it, the other "
            f"{slope - held:.3g} MB/min is a leak"
        )
    if held < 0.5 * slope:
        return None
    return f"{backlog}: the growth is the backlog the queue holds, not a leak"


def _grew(g: dict[str, tuple[bool, float, float]], col: str) -> bool:
    return col in g and g[col][0]


#: other processes' share of the host's CPUs rising by this many points from the first to
#: the last third of the measured window can explain a stage that slows down
HOST_RISE_POINTS = 20.0


def host_rise(data: RunData, t0: float, t1: float) -> tuple[float, float] | None:
    """Other processes' mean share of the host's CPUs (%) in the first and the last third
    of the measured window, when it rose by ``HOST_RISE_POINTS`` or more; else None."""
    t, others = data.samples["t"], other_cpu_pct(data)
    third = (t1 - t0) / 3
    ok = np.isfinite(others)
    first = ok & (t >= t0) & (t < t0 + third)
    last = ok & (t > t1 - third) & (t <= t1)
    if third <= 0 or not first.any() or not last.any():
        return None
    a, b = float(np.mean(others[first])), float(np.mean(others[last]))
    return (a, b) if b - a >= HOST_RISE_POINTS else None


def _stage_hints(
    g: dict[str, tuple[bool, float, float]],
    served: bool = False,
    host: tuple[float, float] | None = None,
) -> list[str]:
    """Which stage grew; the model is said to slow down only when host load cannot explain
    it (``host``: other processes' CPU share rising, first and last third of the run)."""
    hints = []
    if _grew(g, "grab_ms"):
        hints.append(
            f"grab time rose {g['grab_ms'][1]:.3g} ms/min: the run is capture-bound "
            "(the source or its decoder slows down)"
        )
    if _grew(g, "total_ms") and not _grew(g, "infer_ms"):
        culprits = [_NAMES[c] for c in ("pre_ms", "decode_ms") if _grew(g, c)]
        where = " and ".join(culprits) if culprits else "preprocess or decode"
        hints.append(
            f"total time rose {g['total_ms'][1]:.3g} ms/min with infer flat: look at {where}"
        )
    elif _grew(g, "infer_ms") and served:
        hints.append(
            f"time to first token rose {g['infer_ms'][1]:.3g} ms/min: the model server slows "
            "down (its queue, KV cache or batch grows; see server_queue and memory_server_rss)"
        )
    elif _grew(g, "infer_ms") and host is not None:
        hints.append(
            f"infer time rose {g['infer_ms'][1]:.3g} ms/min while other processes' share of "
            f"the host's CPUs rose from {host[0]:.0f} % to {host[1]:.0f} %: host load can "
            "explain it; soak on a quiet host to tell whether the model slows down"
        )
    elif _grew(g, "infer_ms"):
        hints.append(
            f"infer time rose {g['infer_ms'][1]:.3g} ms/min: the model itself slows "
            "down (growing caches, throttling, fragmentation)"
        )
    return hints


def _rate_hints(
    data: RunData, g: dict[str, tuple[bool, float, float]], verdict: Verdict
) -> list[str]:
    if "total_ms" not in g:
        return []
    med_total = g["total_ms"][2]
    rec = recommended_fps(med_total)
    fps = data.meta.fps
    queue_or_age = _grew(g, "queue_len") or _grew(g, "frame_age_ms")
    drops = verdict.get("drops")
    too_fast = fps is not None and fps > 0 and med_total > 1000.0 / fps
    above_band = fps is not None and rec is not None and fps > rec[1]
    drops_failed = drops is not None and drops.status == FAIL
    if rec and (
        (queue_or_age and not _grew(g, "total_ms")) or too_fast or (drops_failed and above_band)
    ):
        who = "the model server" if data.meta.workload_kind == "openai" else "this machine"
        return [
            f"the frame rate exceeds what {who} sustains (median total "
            f"{med_total:.3g} ms per frame{f' at {fps:g} fps' if fps else ''}): soak at "
            f"{rec[0]:.3g}-{rec[1]:.3g} fps (1000 / median total x 0.5-0.7)"
        ]
    if rec and drops_failed:
        # the median frame fits the period with margin: the drops come from the long tail
        return [
            f"frames were dropped although the median total ({med_total:.3g} ms) fits the "
            f"frame period{f' at {fps:g} fps' if fps else ''}: the drops come from long-tail "
            "frames (see the jitter criterion), not from the rate itself"
        ]
    return []


def _near(ts: np.ndarray, events: np.ndarray, tol: float) -> float:
    """Fraction of ``ts`` within ``tol`` seconds of one of ``events`` (sorted)."""
    if ts.size == 0 or events.size == 0:
        return 0.0
    i = np.clip(np.searchsorted(events, ts), 1, events.size - 1) if events.size > 1 else None
    if i is None:
        return float(np.mean(np.abs(ts - events[0]) <= tol))
    d = np.minimum(np.abs(ts - events[i - 1]), np.abs(ts - events[i]))
    return float(np.mean(d <= tol))


def time_period(ts: np.ndarray, *, min_count: int = 8, min_score: float = 0.8) -> float | None:
    """The period (s) at which events at times ``ts`` recur, when at least ``min_score`` of
    them fall within a tenth of a period of their beat (the beats: whole numbers of median
    gaps from the first, missed ones fine; the period fitted through them); None otherwise
    or with fewer than ``min_count`` (random times pass in 0.8 % of sets of 8, 29 % of 4)."""
    ts = np.unique(ts[np.isfinite(ts)])
    if ts.size < min_count:
        return None
    gap = float(np.median(np.diff(ts)))
    if gap <= 0:
        return None
    beat = np.round((ts - ts[0]) / gap)  # which beat each event is on, then the fitted period
    if np.ptp(beat) == 0:
        return None
    period, offset = np.polyfit(beat, ts, 1)
    on_beat = np.abs(ts - (offset + period * beat)) <= 0.1 * period
    return float(period) if float(np.mean(on_beat)) >= min_score else None


def _jitter_hints(
    data: RunData, verdict: Verdict, g: dict[str, tuple[bool, float, float]], alpha: float
) -> list[str]:
    j = verdict.get("jitter")
    if j is None or j.status not in (FAIL, PASS):
        return []
    ev = j.evidence
    hints = []
    every_s = _tail_time_period(data, ev) if ev.get("tail_frames") else None
    if ev.get("tail_frames") and ev.get("tail_periodic"):
        hints.append(
            f"long-tail {ev['source'].removesuffix('_ms')} frames recur every "
            f"{ev['tail_period']} frames: periodic work (cache flush, garbage "
            "collection, logging, a scheduled job)"
        )
    elif every_s is not None:
        hints.append(
            f"long-tail {ev['source'].removesuffix('_ms')} frames recur every "
            f"{every_s:.3g} s: periodic work (cache flush, garbage collection, logging, a "
            "scheduled job)"
        )
    elif (ev.get("tail_frames") or 0) >= 4:
        hints.append(
            f"{ev['tail_frames']} long-tail frames fall at irregular positions: not periodic work"
        )
    if j.status == FAIL:
        hints += _jitter_cause(data, verdict, g, ev, alpha)
    return hints


def _tail_time_period(data: RunData, ev: dict) -> float | None:
    """The period in time of the jitter column's long-tail frames (capture times), if any."""
    y = data.frame(str(ev.get("source")))
    cut = ev.get("tail_cut_ms")
    if cut is None or not np.isfinite(y).any():
        return None
    return time_period(data.frames["t_capture"][np.isfinite(y) & (y > float(cut))])


def _jitter_cause(
    data: RunData,
    verdict: Verdict,
    g: dict[str, tuple[bool, float, float]],
    ev: dict,
    alpha: float,
) -> list[str]:
    """What the failing frames (over k x median, the rule's own) coincide with: host load,
    else (with the other stages flat and no periodic tail) memory pressure or nothing the
    telemetry shows."""
    k, med = ev.get("k"), ev.get("median_ms")
    judged = float(k) * float(med) if k is not None and med is not None else math.inf
    host = host_load_hint(data, _spike_ends(data, str(ev["source"]), judged))
    out = [host[0]] if host else []
    others_flat = not any(_grew(g, c) for c in ("grab_ms", "pre_ms", "decode_ms"))
    # a host-load hint named a cause (or one that may add to the spikes): nothing more to say
    cause_open = not host and others_flat and not ev.get("tail_periodic")
    if ev.get("tail_frames") and cause_open:
        out.append(_pressure_or_contention(data, verdict, float(ev["tail_cut_ms"]), alpha))
    return out


#: other processes busy on this share of the host's CPUs, or the hypervisor stealing this
#: much, at half the spikes or more: the diagnosis names host load
HOST_BUSY_SHARE_PCT = 50.0
HOST_STEAL_PCT = 5.0
#: host load is the spikes' cause when the host is busy at this much larger a share of the
#: spikes than of the rest of the run's ticks; otherwise it was there throughout
HOST_SPECIFIC_MARGIN = 0.25


def _spike_ends(data: RunData, source: str, cut: float) -> np.ndarray:
    """When each frame over ``cut`` in the jitter criterion's column ended (capture time
    plus its total), sorted: the telemetry tick at or after it covers the spike."""
    y = data.frame(source)
    end = data.frames["t_capture"] + np.nan_to_num(data.frame("total_ms")) / 1e3
    return np.sort(end[np.isfinite(y) & (y > cut)])


def host_load_hint(data: RunData, spikes: np.ndarray) -> tuple[str, bool] | None:
    """Name host load when other processes kept the host's CPUs busy (or the hypervisor
    stole them) at half the spikes or more, with the figures, and whether the load was
    particular to the spikes (True: more often busy at them than in the rest of the run by
    ``HOST_SPECIFIC_MARGIN``: the cause) or there throughout (False: it may add to them).
    None when the host was quiet at them or was not sampled (a run made before soakd
    sampled the host)."""
    t, host = data.samples["t"], data.sample("host_cpu_pct")
    ok = np.isfinite(host)
    if spikes.size == 0 or not ok.any():
        return None
    ncpu = data.meta.fact("cpu_count") or 1.0
    others = other_cpu_pct(data)[ok]
    at = np.clip(np.searchsorted(t[ok], spikes), 0, int(ok.sum()) - 1)
    rest = np.ones(others.size, dtype=bool)
    rest[at] = False
    loaded = others >= HOST_BUSY_SHARE_PCT
    busy = float(np.mean(loaded[at]))
    if busy >= 0.5:
        specific = not rest.any() or busy >= float(np.mean(loaded[rest])) + HOST_SPECIFIC_MARGIN
        figures = (
            f"other processes kept {np.nanmedian(others[at]):.0f} % of the host's {ncpu:.0f} "
            f"CPUs busy at {busy:.0%} of the {spikes.size} spike(s) "
            f"({np.nanmedian(others[rest] if rest.any() else others):.0f} % the rest of the "
            f"run{_run_queue(data, at, ok, ncpu)})"
        )
        if specific:
            return f"spikes coincide with host load: {figures}; soak on a quiet host", True
        return (
            f"host load throughout the run: {figures}; contention may add to the spikes: "
            "soak on a quiet host to tell",
            False,
        )
    steal = np.nan_to_num(data.sample("host_steal_pct")[ok])
    stolen = float(np.mean(steal[at] >= HOST_STEAL_PCT))
    if stolen >= 0.5:
        return (
            f"spikes coincide with CPU steal: the hypervisor took "
            f"{np.median(steal[at]):.0f} % of the host's CPUs at {stolen:.0%} of the "
            f"{spikes.size} spike(s) (other guests on the machine): soak on a dedicated host",
            True,
        )
    return None


def _run_queue(data: RunData, at: np.ndarray, ok: np.ndarray, ncpu: float) -> str:
    rq = data.sample("host_run_queue")[ok][at]
    if not np.isfinite(rq).any():
        return ""
    return f"; run queue {np.nanmedian(rq):.0f} at the spikes on {ncpu:.0f} CPUs"


#: memory used at this share of its limit (host memory, the cgroup's memory.max, the GPU's
#: total) or more: near enough for the allocator to work hard (memory pressure)
NEAR_LIMIT_SHARE = 0.9


def near_limit(data: RunData) -> str | None:
    """The memory closest to its limit when it came within ``NEAR_LIMIT_SHARE`` of it
    ("host memory 93 % used"), else None: without it, no hint says memory pressure."""
    pairs = [
        ("host memory", data.sample("sys_mem_used_bytes"), data.sample("sys_mem_total_bytes")),
        ("GPU memory", data.sample("gpu_mem_used_bytes"), data.sample("gpu_mem_total_bytes")),
    ]
    cg = data.meta.fact("cgroup_mem_max_bytes")
    if cg:
        pairs.append(("the cgroup's memory.max", data.sample("rss_bytes"), np.full(1, cg)))
    best: tuple[float, str] | None = None
    for name, used, total in pairs:
        with np.errstate(invalid="ignore", divide="ignore"):
            share = used / total
        if np.isfinite(share).any():
            peak = float(np.nanmax(share))
            if peak >= NEAR_LIMIT_SHARE and (best is None or peak > best[0]):
                best = (peak, name)
    return f"{best[1]} {best[0]:.0%} used" if best else None


_GROWTH = ("memory_rss", "memory_gpu", "memory_gpu_proc", "memory_torch_reserved")


def _memory_words(verdict: Verdict, alpha: float) -> str:
    """How memory behaved, as the memory criteria's evidence has it: "memory steady" only
    when no floor rose significantly."""
    for c in verdict.criteria:
        ev = c.evidence
        slope, p = ev.get("slope"), ev.get("p_value")
        if not c.criterion.startswith("memory") or slope is None or p is None:
            continue
        if p < alpha and slope > 0:
            return f"{c.title} rising {slope:.3g} MB/min (p = {p:.2g})"
    return "memory steady"


def _pressure_or_contention(data: RunData, verdict: Verdict, cut: float, alpha: float) -> str:
    """Name memory pressure only when memory came near a limit and the spikes coincide
    with allocator releases (or, as a possibility, a memory criterion failed); otherwise
    say that the telemetry shows no cause, quoting the utilisation."""
    t = data.frames["t_capture"]
    y = data.frame("infer_ms")
    tail_t = t[np.isfinite(y) & (y > cut)]
    drops: list[float] = []
    for name in _GROWTH:
        c = verdict.get(name)
        if c is not None and c.evidence.get("sawtooth", {}).get("drop_t"):
            drops += c.evidence["sawtooth"]["drop_t"]
    failing = [c.title for c in verdict.criteria if c.criterion in _GROWTH and c.status == FAIL]
    near = _near(tail_t, np.sort(np.asarray(drops)), 1.0) if drops else 0.0
    limit = near_limit(data)
    if near >= 0.5 and limit:
        return (
            f"infer spikes with the other stages flat: {near:.0%} of them within 1 s of an "
            f"allocator release, with {limit}: memory pressure"
        )
    if near >= 0.5:
        return (
            f"infer spikes with the other stages flat: {near:.0%} of them within 1 s of an "
            "allocator release, memory far from its limits: the allocator's own release work"
        )
    if failing and limit:
        return (
            f"infer spikes with the other stages flat while {', '.join(failing)} rises, "
            f"with {limit}: possibly memory pressure"
        )
    cpu = data.sample("cpu_pct")
    util = data.sample("gpu_util_pct")
    seen = []
    if np.isfinite(cpu).any():
        seen.append(f"process CPU p95 {np.nanpercentile(cpu, 95):.0f} %")
    if np.isfinite(util).any():
        seen.append(f"GPU util p95 {np.nanpercentile(util, 95):.0f} %")
    quoted = f" ({', '.join(seen)})" if seen else ""
    mem = "memory not near a limit" if failing else _memory_words(verdict, alpha)
    return (
        f"infer spikes with the other stages flat, {mem} and no allocator release "
        f"near them: the telemetry shows no cause{quoted}; look for other processes "
        "competing for the CPU or GPU"
    )


def _memory_hints(
    data: RunData, verdict: Verdict, g: dict[str, tuple[bool, float, float]]
) -> list[str]:
    hints = []
    util = data.sample("gpu_util_pct")
    st = data.samples["t"]
    for c in verdict.criteria:
        if "sawtooth" not in c.evidence or c.status not in (PASS, FAIL):
            continue
        saw = c.evidence.get("sawtooth", {})
        n = int(saw.get("drops", 0))
        backlog = None
        if c.criterion == "memory_rss":
            backlog = _backlog_share(data, g, c.value or 0.0, c.threshold or 0.0)
        if backlog:
            hints.append(f"{c.title}: {backlog}")
        elif c.status == FAIL and n >= 2:
            hints.append(
                f"{c.title}: a leak under an allocator sawtooth ({n} sharp drops of "
                f"~{saw.get('drop_mb_median', 0):.0f} MB) - the floor still rises "
                f"{c.value:.3g} MB/min"
            )
        elif c.status == FAIL:
            hints.append(f"{c.title}: the floor rises {c.value:.3g} MB/min: a leak")
        elif n >= 2:
            dip = ""
            if np.isfinite(util).sum() > 10 and saw.get("drop_t"):
                at = np.asarray(saw["drop_t"])
                near = _near(
                    st[np.isfinite(util) & (util < np.nanmedian(util) * 0.5)], np.sort(at), 0.5
                )
                if near > 0:
                    dip = " while GPU utilisation dips"
            hints.append(
                f"{c.title}: allocator sawtooth ({n} sharp drops of "
                f"~{saw.get('drop_mb_median', 0):.0f} MB{dip}) returning to the "
                "same floor: not a leak"
            )
    return hints
