"""Every frame the target rate asked for that did not finish, by kind.

The target rate is the contract: each pacer tick after the warm-up should become a finished
frame. A tick is lost when its frame was

* ``dropped``: replaced in the queue (rows carry the running ``drop_count``; the summary's
  ``drops`` also counts those dropped after the last finished frame);
* ``stale``: dispatched too old and skipped (``run.max_age_ms``);
* ``session_dropped``: dropped inside a session model's own frame queue;
* ``queued_at_end``: still in the queue when the run stopped, never dispatched;
* ``in_flight_at_end``: dispatched and never finished (a hang);
* ``missed``: never captured: the pacer skipped the tick because the source read took a
  whole period (``missed_ticks_source``) or the process did not run on time
  (``missed_ticks_pause``);
* ``unaccounted``: captured (summary ``frames_captured``) but in none of the kinds above.

Counts come from the rows where they can (post-warm-up only) and from ``runs.summary`` for
what rows cannot show. With ``run.streams = N`` each row's ``drop_count`` / ``stale_count``
counts its own stream's losses: ``running_total`` sums them into one counter for all the
streams, so one stream's lower counter after another's is never read as a reset. A summary
key an older soakd did not write is unknown (None), never zero; missed ticks are counted
over the whole run, since the summary does not say when they happened (a slow grab during
the warm-up counts too: the safe side).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from soakd.analysis.model import RunData, RunMeta

#: loss kinds in report order, with the words the report uses
KINDS: tuple[tuple[str, str], ...] = (
    ("dropped", "dropped"),
    ("stale", "stale"),
    ("session_dropped", "dropped by the session"),
    ("queued_at_end", "queued at the end"),
    ("in_flight_at_end", "in flight at the end"),
    ("missed_ticks", "missed ticks"),
    ("unaccounted", "captured, never finished"),
)


@dataclass(frozen=True, slots=True)
class Losses:
    """Post-warm-up losses by kind (None: unknown for this run) and the ticks they are out
    of: ``ticks`` = post-warm-up captures (rows + drops + queued + in flight + unaccounted)
    + missed ticks."""

    rows: int
    counts: dict[str, float | None]
    missed_source: float | None
    missed_pause: float | None
    ticks: float

    @property
    def lost(self) -> float:
        return float(sum(v for v in self.counts.values() if v))

    @property
    def fraction(self) -> float:
        return self.lost / self.ticks if self.ticks else 0.0

    def words(self) -> str:
        """``"3 dropped, 0 stale, 64 queued at the end, ..."``: every known kind; the session
        and unaccounted kinds only when there are any."""
        parts = []
        for key, label in KINDS:
            v = self.counts.get(key)
            if v is None or (not v and key in ("session_dropped", "unaccounted")):
                continue
            text = f"{v:.0f} {label}"
            if key == "missed_ticks" and v and self.missed_source is not None:
                text += f" ({self.missed_source:.0f} source, {self.missed_pause or 0:.0f} pause)"
            parts.append(text)
        return ", ".join(parts)


def running_total(stream: np.ndarray, counter: np.ndarray) -> np.ndarray:
    """All streams' losses up to each row: the sum over the streams of each one's latest
    cumulative ``counter`` at or before that row (rows in capture order; ``stream`` the
    rows' stream ids, NaN read as 0). One stream: the counter itself."""
    ids = np.nan_to_num(stream).astype(np.int64)
    c = np.nan_to_num(counter)
    if not ids.size or ids.min() == ids.max():
        return c
    total = np.zeros(c.size)
    for s in np.unique(ids):
        own = np.where(ids == s, c, np.nan)
        total += np.nan_to_num(np.fmax.accumulate(own))  # carried forward past other rows
    return total


def _row_counts(d: RunData, post: np.ndarray) -> tuple[float, float, float, float, float]:
    """(dropped, stale, session_dropped) after the warm-up from the rows' running counters
    (all streams together), and the largest drop / stale counter of any row."""
    stream = d.frame("stream")
    drop = running_total(stream, d.frame("drop_count"))
    stale = running_total(stream, d.frame("stale_count"))
    sess = np.fmax.accumulate(np.nan_to_num(d.frame("session_dropped")))
    pre = ~post
    out = []
    for a in (drop, stale, sess):
        base = float(a[pre].max()) if pre.any() else 0.0
        top = float(a[post].max()) if post.any() else base
        out.append(max(top - base, 0.0))
    top_drop = float(drop.max()) if drop.size else 0.0
    top_stale = float(stale.max()) if stale.size else 0.0
    return out[0], out[1], out[2], top_drop, top_stale


def count_losses(d: RunData, post: np.ndarray) -> Losses:
    """The losses of a run whose post-warm-up rows are ``post`` (a mask over the rows)."""
    first = float(d.frames["frame_id"][post].min()) if post.any() else None
    return tally_losses(d.meta, _row_counts(d, post), int(post.sum()), first)


def tally_losses(
    m: RunMeta,
    row_counts: tuple[float, float, float, float, float],
    rows: int,
    first_post: float | None,
) -> Losses:
    """The losses from the rows' counts (``_row_counts``: dropped, stale, session_dropped
    after the warm-up, the largest drop / stale counter), the post-warm-up rows and the
    first of their frame ids (the capture index), with the summary's counters."""
    dropped, stale, sess, top_drop, top_stale = row_counts
    # frames dropped or skipped after the last row: the summary's totals know them
    dropped += max((m.counter("drops") or 0.0) - top_drop, 0.0)
    stale += max((m.counter("stale") or 0.0) - top_stale, 0.0)
    queued, in_flight = m.counter("queued_at_end"), m.counter("in_flight_at_end")
    missed = m.counter("pacer_missed_ticks")
    captured = rows + dropped + (queued or 0.0) + (in_flight or 0.0)
    unaccounted = None
    total = m.counter("frames_captured")
    if total is not None and first_post is not None:
        unaccounted = max(total - first_post - captured, 0.0)
    counts: dict[str, float | None] = {
        "dropped": dropped,
        "stale": stale,
        "session_dropped": sess,
        "queued_at_end": queued,
        "in_flight_at_end": in_flight,
        "missed_ticks": missed,
        "unaccounted": unaccounted,
    }
    ticks = captured + (unaccounted or 0.0) + (missed or 0.0)
    return Losses(
        rows=rows,
        counts=counts,
        missed_source=m.counter("missed_ticks_source"),
        missed_pause=m.counter("missed_ticks_pause"),
        ticks=ticks,
    )
