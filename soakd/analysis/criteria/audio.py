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

from soakd.analysis import contention
from soakd.analysis.criteria.base import Context
from soakd.analysis.model import FAIL, INVALID, PASS, CriterionResult
from soakd.config import CriteriaSettings

CRITERION = "audio_playback"
TITLE = "Spoken answers play without a stutter"
#: answered turns with audio, after the warm-up, needed to judge playback
MIN_TURNS = 3
UNIT = "x real time"


def _audio_turns(ctx: Context) -> tuple[np.ndarray, int]:
    """The measured turns with audio (a mask over ``data.turns``), and how many turns of the
    whole run had audio."""
    t = ctx.data.turns
    audio = np.isfinite(t["audio_s"]) & (t["audio_s"] > 0)
    post = (t["warmup"] == 0) & (t["t_capture"] >= ctx.t0)
    return audio & post, int(audio.sum())


def _fails(rtf: np.ndarray, under: np.ndarray, c: CriteriaSettings) -> tuple[float, int, bool]:
    """(p5 real-time factor, underruns in all, failing) of these turns."""
    finite = rtf[np.isfinite(rtf)]
    low = float(np.percentile(finite, 5)) if finite.size else 0.0  # no wall time: not judged
    total = int(np.nansum(under))
    return low, total, low < c.min_audio_rtf or total > c.max_audio_underruns


def _host(ctx: Context, sel: np.ndarray) -> str | None:
    """Why a FAIL is the host's: every turn that stuttered or fell behind ran while other
    processes held ``contended_cpu_pct`` % of the CPUs, and the quiet turns alone pass
    (None: the model's, or the rule off). A listener's player on a starved host stutters
    too, so such a run cannot be judged."""
    t, c = ctx.data.turns, ctx.crit
    start, end = t["t_capture"][sel], np.where(np.isfinite(t["t_done"][sel]),
                                                t["t_done"][sel], t["t_capture"][sel])  # fmt: skip
    host = contention.during(ctx.data, start, end, c.contended_cpu_pct)
    if host is None:
        return None
    rtf, under = t["audio_rtf"][sel], t["underruns"][sel]
    bad = (rtf < c.min_audio_rtf) | (np.nan_to_num(under) > 0)
    quiet = host.quiet
    if not bad.any() or (bad & quiet).any() or quiet.sum() < MIN_TURNS:
        return None
    if _fails(rtf[quiet], under[quiet], c)[2]:
        return None
    return (
        f"the host was contended: the {int(bad.sum())} turn(s) that fell behind or stuttered "
        f"all ran while other processes held >= {c.contended_cpu_pct:g} % of the CPUs; the "
        f"{int(quiet.sum())} quiet turn(s) pass: soak on a quiet host or pin CPUs"
    )


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria): none for a run
    without audio out."""
    if not ctx.data.turns:
        return []
    sel, n_audio = _audio_turns(ctx)
    if not n_audio:
        return []
    c, t = ctx.crit, ctx.data.turns
    n = int(sel.sum())
    if n < MIN_TURNS:
        why = f"{n} answered turn(s) with audio after the warm-up; {MIN_TURNS} judge playback"
        return [CriterionResult.invalid(CRITERION, TITLE, threshold=c.min_audio_rtf,
                                        unit=UNIT, detail=why)]  # fmt: skip
    rtf, under = t["audio_rtf"][sel], t["underruns"][sel]
    low, total, failing = _fails(rtf, under, c)
    status = FAIL if failing else PASS
    detail = (
        f"p5 real-time factor {low:.3g} over {n} turns (at least {c.min_audio_rtf:g}), "
        f"{total} underrun(s) (at most {c.max_audio_underruns})"
    )
    if low < c.min_audio_rtf:
        detail += ": the answers' audio arrives slower than it plays"
    elif failing:
        detail += ": a listener hears the answers stutter"
    host = _host(ctx, sel) if failing else None
    if host is not None:
        status, detail = INVALID, f"{host}; {detail}"
    finite = rtf[np.isfinite(rtf)]
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
