"""Audio playback: a realtime session's spoken answers play without a stutter.

Each answered turn with audio out carries its real-time factor (audio seconds received per
wall second, first chunk to done) and its underruns (a chunk that came after the audio
buffered before it had played out), as soakd.workloads.realtime.client measures them. The
turns after the warm-up are judged: their p5 real-time factor under ``criteria.min_audio_rtf``
or more than ``criteria.max_audio_underruns`` underruns in all is a FAIL; fewer than
MIN_TURNS turns with audio cannot be judged (INVALID, never PASS); a run with no audio out
has nothing to judge (none).
"""

from __future__ import annotations

import numpy as np

from soakd.analysis.criteria.base import Context
from soakd.analysis.model import FAIL, PASS, CriterionResult

CRITERION = "audio_playback"
TITLE = "Spoken answers play without a stutter"
#: answered turns with audio, after the warm-up, needed to judge playback
MIN_TURNS = 3
UNIT = "x real time"


def _audio_turns(ctx: Context) -> tuple[np.ndarray, np.ndarray, int]:
    """(real-time factors, underruns) of the measured turns with audio, and how many turns
    of the whole run had audio."""
    t = ctx.data.turns
    audio = np.isfinite(t["audio_s"]) & (t["audio_s"] > 0)
    post = (t["warmup"] == 0) & (t["t_capture"] >= ctx.t0)
    sel = audio & post
    return t["audio_rtf"][sel], t["underruns"][sel], int(audio.sum())


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria): none for a run
    without audio out."""
    if not ctx.data.turns:
        return []
    rtf, under, n_audio = _audio_turns(ctx)
    if not n_audio:
        return []
    c = ctx.crit
    n = int(rtf.size)
    if n < MIN_TURNS:
        why = f"{n} answered turn(s) with audio after the warm-up; {MIN_TURNS} judge playback"
        return [CriterionResult.invalid(CRITERION, TITLE, threshold=c.min_audio_rtf,
                                        unit=UNIT, detail=why)]  # fmt: skip
    finite = rtf[np.isfinite(rtf)]
    low = float(np.percentile(finite, 5)) if finite.size else 0.0  # no wall time: not judged
    total = int(np.nansum(under))
    slow, stutters = low < c.min_audio_rtf, total > c.max_audio_underruns
    status = FAIL if slow or stutters else PASS
    detail = (
        f"p5 real-time factor {low:.3g} over {n} turns (at least {c.min_audio_rtf:g}), "
        f"{total} underrun(s) (at most {c.max_audio_underruns})"
    )
    if slow:
        detail += ": the answers' audio arrives slower than it plays"
    elif stutters:
        detail += ": a listener hears the answers stutter"
    evidence = {
        "turns": n,
        "rtf_p5": low,
        "rtf_p50": float(np.percentile(finite, 50)) if finite.size else None,
        "underruns": total,
        "turns_with_underruns": int((np.nan_to_num(under) > 0).sum()),
    }
    res = CriterionResult(
        criterion=CRITERION, title=TITLE, status=status, value=low,
        threshold=c.min_audio_rtf, unit=UNIT, detail=detail, evidence=evidence,
    )  # fmt: skip
    return [res]
