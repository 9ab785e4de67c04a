"""Host contention, from soakd's own telemetry: how much of the host's CPUs other processes
held at each sampler tick, and which frames, windows or ticks were **contended** (the one
definition every criterion that excuses the host reads: jitter, drops, frame_age,
stage_trend, server_queue, and the running looks of those five: ``withholds_looks``).

"Other processes" are the host's busy CPU (``host_cpu_pct``: every CPU, % of all of them)
less soakd's own process (``cpu_pct``, % of one core: the in-process model included) and,
for a served model, the server's process tree (``server_cpu_pct``): what is left is CPU the
model under test did not use. A tick covers the time since the tick before it, so a frame
ran under the ticks from the one at or after its start to the one at or after its end. An
interval is contended when other processes held ``criteria.contended_cpu_pct`` % of the
CPUs or more over it (the mean of its ticks); 100 turns the rule off. A frame's wait is
contended too when it queued behind a contended one (``behind``): a backlog built while the
host was contended drains after it went quiet, and those frames' age is the host's. The
ticks the pacer missed because soakd's process did not run on time (a ``pause`` event) are
the host's when the pause itself was contended (``pauses``); a SIGSTOP on a quiet host is
not. The frames a model lost while it could not run in a contended spell are the host's
though the frame that counts them came after it (``accrued``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from soakd.analysis.model import RunData

#: ``criteria.contended_cpu_pct`` at this value turns the rule off: every frame is the model's
OFF_PCT = 100.0

#: an older soakd's ``pause`` event, without its ticks in its data: "2 tick(s) missed (~100
#: ms): ..." (soakd/run/runner.py)
_PAUSE = re.compile(r"^(\d+) tick\(s\) missed \(~(\d+(?:\.\d+)?) ms\)")


def others_pct(
    host: np.ndarray | float, own: np.ndarray | float, server: np.ndarray | float, ncpu: float
) -> np.ndarray:
    """% of the host's CPUs busy with processes other than soakd's and the served model's,
    from the host's busy share (% of all CPUs) and soakd's and the server's CPU (% of one
    core each; NaN read as 0); NaN where the host was not sampled. Scalars or arrays."""
    own_cores = np.nan_to_num(own) + np.nan_to_num(server)
    return np.clip(np.asarray(host, dtype=np.float64) - own_cores / ncpu, 0.0, 100.0)


def other_cpu_pct(data: RunData) -> np.ndarray:
    """Per telemetry sample: ``others_pct`` of the run's ticks."""
    ncpu = data.meta.fact("cpu_count") or 1.0
    return others_pct(
        data.sample("host_cpu_pct"), data.sample("cpu_pct"), data.sample("server_cpu_pct"), ncpu
    )


def outpaced(data: RunData, measured: np.ndarray) -> bool:
    """Whether the model's median frame (``total_ms`` of the ``measured`` rows) does not fit
    the frame period (1000 / fps): then the rate, not the host, loses and ages the frames,
    on any host, and contention excuses neither (False without a rate or a total)."""
    total = data.frame("total_ms")[measured]
    fps = data.meta.fps
    if not fps or not np.isfinite(total).any():
        return False
    return bool(np.nanmedian(total) >= 1000.0 / fps)


def contended(others: np.ndarray | float, pct: float) -> np.ndarray:
    """Which shares ``others`` (% of the CPUs other processes held) are contended: ``pct``
    or more, with the rule on (``pct`` under ``OFF_PCT``); NaN (no tick) never is."""
    o = np.asarray(others, dtype=np.float64)
    if pct >= OFF_PCT:
        return np.zeros(o.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        return np.isfinite(o) & (o >= pct)


def withholds_looks(contended_ticks: int) -> bool:
    """Whether the running look (``run.stop_on_fail``) of a criterion the host can fail
    (jitter, drops, frame_age, stage_trend, server_queue) must stop nothing: once one
    telemetry tick since the warm-up was contended (``contended_ticks``, counted by
    soakd/run/early_stop.py with ``contended``). The verdict sets the contended frames,
    windows, ticks or scrapes aside; a look
    cannot, so the run goes on and the verdict decides: an early FAIL is a claim about the
    model, never about the other processes on the host."""
    return contended_ticks > 0


class Contention(NamedTuple):
    """Intervals (frames, windows or ticks) against the host: others' share over each
    (``others``, NaN where no tick covers it) and which were contended (``busy``)."""

    pct: float
    others: np.ndarray
    busy: np.ndarray

    @property
    def quiet(self) -> np.ndarray:
        """The intervals judged as the model's: not contended (NaN ones included)."""
        return ~self.busy

    def share(self) -> float:
        """The contended intervals' share of those the host telemetry covers."""
        seen = np.isfinite(self.others)
        return float(self.busy[seen].mean()) if seen.any() else 0.0

    def median(self, mask: np.ndarray) -> float | None:
        """Others' median share over the intervals of ``mask`` (None: none covered)."""
        v = self.others[mask & np.isfinite(self.others)]
        return float(np.median(v)) if v.size else None


def _judged(pct: float, others: np.ndarray) -> Contention | None:
    """``others`` against ``pct`` (None: the rule off, or no share known)."""
    if pct >= OFF_PCT or not np.isfinite(others).any():
        return None
    return Contention(pct, others, contended(others, pct))


def during(data: RunData, start: np.ndarray, end: np.ndarray, pct: float) -> Contention | None:
    """The intervals ``start`` .. ``end`` (seconds since the run's start) against the host
    (``others_during``). None when the rule is off or no tick covers any of them (a run of
    an older soakd, which did not sample the host)."""
    return _judged(pct, others_during(data, start, end))


def ticks(data: RunData, t0: float, t1: float, pct: float) -> Contention | None:
    """The telemetry ticks of the window ``t0`` .. ``t1`` against the host (None: the rule
    off, or no host sample in it)."""
    t, others = data.samples["t"], other_cpu_pct(data)
    return _judged(pct, others[(t >= t0) & (t <= t1) & np.isfinite(others)])


def waited(
    data: RunData, capture: np.ndarray, dispatch: np.ndarray, stream: np.ndarray, pct: float
) -> Contention | None:
    """Frames' waits (``capture`` .. ``dispatch``, seconds since the run's start, in
    capture order) against the host: contended when the wait itself was (``during``) or
    when the frame queued behind a frame whose wait was (``behind``): a backlog that
    contention built and that drains after the host went quiet is the host's. None as for
    ``during``."""
    h = during(data, capture, dispatch, pct)
    if h is None:
        return None
    return h._replace(busy=behind(h.busy, capture, dispatch, stream))


def behind(
    busy: np.ndarray, capture: np.ndarray, dispatch: np.ndarray, stream: np.ndarray
) -> np.ndarray:
    """``busy`` (frames whose own wait was contended, in capture order) and every frame that
    queued behind one: captured while the frame before it in its ``stream``'s queue had
    not been dispatched yet, that one contended or queued behind one itself. Such a frame
    waits out the backlog the contention built, however quiet the host is while it waits;
    the chain ends at the first frame captured after the one before it was dispatched (the
    queue had drained to it). A queue that keeps only the latest frame never chains (a
    frame still queued when the next came was dropped, not dispatched)."""
    out = busy.copy()
    key = np.nan_to_num(np.asarray(stream, dtype=np.float64), nan=-1.0)
    for s in np.unique(key):
        idx = np.flatnonzero(key == s)
        b = busy[idx].astype(np.int64)
        link = np.zeros(idx.size, dtype=bool)
        link[1:] = dispatch[idx[:-1]] > capture[idx[1:]]  # still queued when the next came
        chain = np.cumsum(~link) - 1  # each chain of frames queued behind each other
        seen = np.cumsum(b)
        before = (seen - b)[~link]  # the contended frames before each chain's first
        out[idx] = seen - before[chain] > 0
    return out


def accrued(data: RunData, rows: np.ndarray, pct: float) -> np.ndarray | None:
    """Which of the frames ``rows`` (a mask, in row order) carry losses that accrued while
    the host was contended: a row's running loss counters hold the frames lost up to its
    dispatch (a latest-frame queue replaced them, a stale frame was skipped), so the losses
    it adds accrued since the row before it was dispatched, and are the host's when that
    span was contended (``during``). A model that could not run in a contended spell loses
    frames all through it and counts them on the first row it dispatches after it, a row
    captured once the host went quiet. None as for ``during``."""
    disp = data.frame("t_dispatch")[rows]
    disp = np.where(np.isfinite(disp), disp, data.frames["t_capture"][rows])
    prev = np.concatenate([disp[:1], disp[:-1]])
    h = during(data, prev, disp, pct)
    return None if h is None else h.busy


def others_during(data: RunData, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each interval ``start`` .. ``end`` (seconds since the run's start): the mean share
    of the host's CPUs other processes held over the ticks covering it (NaN when no tick
    covers it or the host was not sampled). The mean, not the max: a long frame covers more
    ticks and would otherwise more often meet a busy one than a short frame does."""
    out = np.full(np.shape(start), np.nan)
    others = other_cpu_pct(data)
    ok = np.isfinite(others)
    if not ok.any() or out.size == 0:
        return out
    t, o = data.samples["t"][ok], others[ok]
    lo = np.searchsorted(t, start)
    hi = np.maximum(np.minimum(np.searchsorted(t, end), t.size - 1), lo)
    covered = lo < t.size
    csum = np.concatenate([[0.0], np.cumsum(o)])
    lo, hi = lo[covered], hi[covered]
    out[covered] = (csum[hi + 1] - csum[lo]) / (hi - lo + 1)
    return out


class Pauses(NamedTuple):
    """The pacer's pauses (``pause`` events: ticks missed because soakd's process did not
    run on time) against the host: the ticks missed in contended pauses (``contended``: the
    host's) and in quiet ones (``quiet``), the events read and how many of them were
    contended, the events the run stored that were not read (``unread``: none once
    ``RunData.pauses`` is loaded, which holds every one; their ticks would be in neither
    count) and others' share over each contended pause (``others``)."""

    contended: float
    quiet: float
    events: int
    events_contended: int
    unread: int
    others: np.ndarray


def _pause_ticks(data: RunData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t, ticks, ms) of every pause event read (``RunData.pauses``): the ticks missed and
    their ms from the event's data, or from its message for an older soakd's event."""
    p = data.pauses
    if not p:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    t, n, ms = (np.array(p[k], dtype=np.float64) for k in ("t", "ticks", "ms"))
    for i in np.flatnonzero(~np.isfinite(n) | ~np.isfinite(ms)):
        m = _PAUSE.match(str(p["message"][i] or ""))
        n[i], ms[i] = (float(m.group(1)), float(m.group(2))) if m else (np.nan, np.nan)
    ok = np.isfinite(t) & np.isfinite(n) & np.isfinite(ms)
    return t[ok], n[ok], ms[ok]


def pauses(data: RunData, pct: float) -> Pauses | None:
    """The run's ``pause`` events against the host: each covers the time it says the pacer
    missed (``n`` ticks, ``~ms``) up to the event, and is contended as any interval is
    (``during``: the mean of others' share over the ticks covering it). A SIGSTOP stops the
    sampler too: the tick after it covers the stop, quiet unless other processes held the
    CPUs meanwhile. None when the rule is off or no tick covers a pause."""
    end, ticks, ms = _pause_ticks(data)
    unread = max(int(data.event_counts.get("pause", 0)) - end.size, 0)
    if not end.size:
        return Pauses(0.0, 0.0, 0, 0, unread, np.zeros(0))
    h = during(data, end - ms / 1e3, end, pct)
    if h is None:
        return None
    return Pauses(
        contended=float(ticks[h.busy].sum()),
        quiet=float(ticks[h.quiet].sum()),
        events=int(end.size),
        events_contended=int(h.busy.sum()),
        unread=unread,
        others=h.others[h.busy],
    )
