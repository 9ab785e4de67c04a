"""``soakd profile``: N frames back to back, the stage table, and the frame rate it implies.

A profile is a run like any other (stored with ``mode = 'profile'`` in the same database, so
its frames can be queried), driven unpaced for ``frames`` frames and not judged. The first
frame (load, allocation, compilation) is reported on its own; every statistic is over the
rest. The theoretical rate is ``1000 / median total``; for a session model
(MOSS-VL-Realtime), which takes frames from its own queue at its own pace, ``1000 / median
interval between the frames it took`` (fed faster than it takes them, that interval is what
one frame costs it, its own loop included). The recommended configured rate is
``RECOMMEND_FACTOR`` (0.6) of it, rounded down to two significant digits, inside the 0.5-0.7
band that leaves the model headroom for jitter, GC and telemetry.

A profile whose run did not complete (stalled, aborted, interrupted) recommends no rate: its
frames are not what the model does when it runs, and ``soakd profile`` exits 3. The host's
load is sampled as in any run; a profile measured while other processes held the host's CPUs
says so (``host``, a note): its times are the host's as much as the model's.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import psutil

from soakd.config import Settings
from soakd.observers.base import Observer
from soakd.records import STAGES
from soakd.report.host import HostLoad, host_load
from soakd.run.runner import run_soak
from soakd.store import profiling_queries as q
from soakd.store import rundata, runs
from soakd.store.db import connect

SCHEMA = "soakd.profile/1"
RECOMMEND_FACTOR = 0.6
RECOMMEND_BAND = (0.5, 0.7)
# settings that change the output length or content: held fixed during a profile and shown
HELD_FIXED_KEYS: tuple[str, ...] = (
    "prompt",
    "max_new_tokens",
    "min_new_tokens",
    "num_beams",
    "do_sample",
    "short_side",
    "num_inference_steps",
    "frames_per_chunk",
)
#: a served model's request settings that fix its answer's length and content
OPENAI_HELD_FIXED_KEYS: tuple[str, ...] = (
    "prompt",
    "system_prompt",
    "max_tokens",
    "temperature",
    "frames_per_request",
    "short_side",
    "jpeg_quality",
)
#: a session's settings that fix its work per frame (it has no per-request prompt)
SESSION_HELD_FIXED_KEYS: tuple[str, ...] = (
    "max_tokens_per_turn",
    "max_new_tokens",
    "frame_queue_size",
    "max_pixels",
)


@dataclass(frozen=True, slots=True)
class StageStat:
    median: float | None
    max: float | None


@dataclass(frozen=True, slots=True)
class StreamStats:
    """Generator workloads: first-output latency (request -> first emitted frame) and the
    interval between later outputs, kept apart so one-time cost never enters the intervals."""

    first_output_ms: float | None  # of the profile's first request
    first_output_p50_ms: float | None  # over the later requests
    first_output_max_ms: float | None
    intervals: int
    interval_p50_ms: float | None
    interval_p95_ms: float | None
    interval_max_ms: float | None


@dataclass(frozen=True, slots=True)
class SessionStats:
    """Session workloads: the frames the model took from its queue, the interval between
    them (after the first frame's, which holds its one-time cost) and the latency from a
    frame's capture to the session's next output."""

    taken: int
    take_interval_p50_ms: float | None
    take_interval_max_ms: float | None
    output_latency_p50_ms: float | None
    output_latency_max_ms: float | None


@dataclass
class ProfileResult:
    run_id: str
    workload_kind: str | None
    status: str
    reason: str | None
    frames: int  # frames run, the first included
    measured: int  # frames after the first that finished without error
    errors: int
    first: dict[str, float | None]  # the first frame's stage times (ms)
    first_error: str | None
    stages: dict[str, StageStat]  # median and max over the rest (ms)
    peak_rss_bytes: int | None
    peak_gpu_mem_bytes: int | None
    peak_torch_reserved_bytes: int | None
    theoretical_fps: float | None
    recommended_fps: float | None
    recommended_band: tuple[float, float] | None
    out_tokens: float | None  # median tokens generated per frame
    sample_output: str | None
    held_fixed: dict[str, Any]
    load_s: float | None
    stream: StreamStats | None = None
    notes: list[str] = field(default_factory=list)
    vision_tokens: float | None = None  # median media tokens per request (they set the cost)
    audio_tokens: float | None = None
    session: SessionStats | None = None
    rate_basis: str = "median total"  # what the theoretical rate is 1000 over
    host: HostLoad | None = None  # other processes' load on the host while it ran
    # a realtime session (its frames are pushed whatever the answers take): the shortest
    # interval between questions it holds, at 1 / (0.6 x answers per second one at a time)
    question_every_s: float | None = None

    @property
    def completed(self) -> bool:
        """The profile's run ran its frames to the end (not stalled, aborted, interrupted)."""
        return self.status == "completed"

    @property
    def fps_flag(self) -> str | None:
        """The ready-to-paste flag, e.g. ``--fps 2.4``."""
        return None if self.recommended_fps is None else f"--fps {self.recommended_fps:g}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fps_flag"] = self.fps_flag
        d["host"] = self.host.to_dict() if self.host is not None else None
        return {"schema": SCHEMA, **d}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def to_markdown(self) -> str:
        return render_markdown(self)


def round_down_2sig(x: float) -> float:
    """Round a positive number down to two significant digits (25.97 -> 25, 0.357 -> 0.35)."""
    if x <= 0 or not math.isfinite(x):
        return 0.0
    mag = 10.0 ** (math.floor(math.log10(x)) - 1)
    return round(math.floor(x / mag + 1e-9) * mag, 10)


def recommend(theoretical_fps: float | None) -> tuple[float | None, tuple[float, float] | None]:
    """(recommended fps, (0.5x, 0.7x) band) from the theoretical rate."""
    if theoretical_fps is None or theoretical_fps <= 0:
        return None, None
    rec = min(round_down_2sig(RECOMMEND_FACTOR * theoretical_fps), 1000.0)
    lo, hi = (round(f * theoretical_fps, 3) for f in RECOMMEND_BAND)
    return (rec if rec > 0 else None), (lo, hi)


def question_interval(answers_per_s: float | None) -> float | None:
    """The shortest ``workload.question_every_s`` a realtime session holds: one question per
    recommended answer (0.6x the answers it gives one at a time), rounded up."""
    if answers_per_s is None or answers_per_s <= 0:
        return None
    x = 1.0 / answers_per_s
    mag = 10.0 ** (math.floor(math.log10(x)) - 1)
    return round(math.ceil(x / mag - 1e-9) * mag, 10)


def held_fixed(config: Mapping[str, Any]) -> dict[str, Any]:
    """The workload settings that fix the output (prompt, length, beams, input size...; a
    session's tokens per turn, context and queue)."""
    wl = config.get("workload", {})
    keys = {"session": SESSION_HELD_FIXED_KEYS, "openai": OPENAI_HELD_FIXED_KEYS}.get(
        wl.get("kind"), HELD_FIXED_KEYS
    )
    out = {k: wl[k] for k in keys if k in wl}
    max_new = out.get("max_new_tokens")
    if "min_new_tokens" in out and isinstance(max_new, int):  # the effective value
        min_new = out["min_new_tokens"]
        out["min_new_tokens"] = max_new if min_new is None else min(min_new, max_new)
    return out


def _stat(v: np.ndarray) -> StageStat:
    v = v[np.isfinite(v)]
    if v.size == 0:
        return StageStat(None, None)
    return StageStat(float(np.median(v)), float(v.max()))


def _pct(v: np.ndarray, p: float) -> float | None:
    return float(np.percentile(v, p)) if v.size else None


def _stream(conn: sqlite3.Connection, run_id: str, first: Mapping[str, Any]) -> StreamStats:
    fe = q.frame_values(conn, run_id, ("first_emit_ms",), profile=True)["first_emit_ms"]
    fe = fe[np.isfinite(fe)]
    iv = q.emission_intervals(conn, run_id, profile=True)
    return StreamStats(
        first_output_ms=first.get("first_emit_ms"),
        first_output_p50_ms=_pct(fe, 50),
        first_output_max_ms=_pct(fe, 100),
        intervals=int(iv.size),
        interval_p50_ms=_pct(iv, 50),
        interval_p95_ms=_pct(iv, 95),
        interval_max_ms=_pct(iv, 100),
    )


def _session(conn: sqlite3.Connection, run_id: str) -> SessionStats:
    v = q.frame_values(conn, run_id, ("t_consumed", "output_latency_ms"), profile=True)
    taken = np.sort(v["t_consumed"][np.isfinite(v["t_consumed"])])
    # the first frame is left out by frame_values: its take ends the first interval, so every
    # interval here is between two frames taken after it
    iv = np.diff(taken) * 1000.0
    lat = v["output_latency_ms"][np.isfinite(v["output_latency_ms"])]
    return SessionStats(
        taken=int(taken.size),
        take_interval_p50_ms=_pct(iv, 50),
        take_interval_max_ms=_pct(iv, 100),
        output_latency_p50_ms=_pct(lat, 50),
        output_latency_max_ms=_pct(lat, 100),
    )


def _peak_gpu(peaks: Mapping[str, int | None]) -> int | None:
    vals = [
        v
        for v in (peaks.get("gpu_proc_mem_bytes"), peaks.get("gpu_mem_used_bytes"))
        if v is not None
    ]
    return max(vals) if vals else None


def _median(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else None


def profile_from_db(conn: sqlite3.Connection, run_id: str) -> ProfileResult:
    """Build the profile of a stored run (any mode: the first frame is set apart, every
    other dispatched frame counts)."""
    run = runs.get_run(conn, run_id)
    cols = (*tuple(f"{s}_ms" for s in STAGES), "out_tokens", "vision_tokens", "audio_tokens")
    vals = q.frame_values(conn, run_id, cols, profile=True)
    stages = {s: _stat(vals[f"{s}_ms"]) for s in STAGES}
    first = q.first_frame(conn, run_id) or {}
    counts = q.frame_counts(conn, run_id)
    peaks = q.peak_memory(conn, run_id)
    total = stages["total"].median
    theo, basis = (1000.0 / total if total else None), "median total"
    session = _session(conn, run_id) if run.workload_kind == "session" else None
    if session is not None and session.take_interval_p50_ms:
        theo, basis = 1000.0 / session.take_interval_p50_ms, "median interval between frames taken"
    rec, band = recommend(theo) if run.status == "completed" else (None, None)
    ask = None
    if run.workload_kind == "realtime":  # a rate of answers, not of frames
        basis, ask = "median answer, frame pushed to done", question_interval(rec)
        rec, band = None, None
    tokens = vals["out_tokens"][np.isfinite(vals["out_tokens"])]
    result = ProfileResult(
        run_id=run_id,
        workload_kind=run.workload_kind,
        status=run.status,
        reason=run.reason,
        frames=counts["dispatched"],
        measured=int(np.isfinite(vals["total_ms"]).sum()) or (session.taken if session else 0),
        errors=counts["errors"],
        first={s: first.get(f"{s}_ms") for s in STAGES},
        first_error=first.get("error"),
        stages=stages,
        peak_rss_bytes=peaks.get("rss_bytes"),
        peak_gpu_mem_bytes=_peak_gpu(peaks),
        peak_torch_reserved_bytes=peaks.get("torch_reserved_bytes"),
        theoretical_fps=theo,
        recommended_fps=rec,
        recommended_band=band,
        out_tokens=float(np.median(tokens)) if tokens.size else None,
        sample_output=run.summary.get("sample_output"),
        held_fixed=held_fixed(run.config),
        load_s=run.summary.get("load_s", run.workload.get("load_s")),
        vision_tokens=_median(vals["vision_tokens"]),
        audio_tokens=_median(vals["audio_tokens"]),
        session=session,
        rate_basis=basis,
        question_every_s=ask,
        host=host_load(rundata.load_sample_columns(conn, run_id), _cpus(run.environment)),
    )
    if run.workload.get("shape", run.workload_kind) in ("generator", "rollout"):
        result.stream = _stream(conn, run_id, first)
    result.notes = _notes(result)
    if random_weights(run.workload, run.config):
        result.notes.append(
            "a built-in tiny model with random weights: its outputs are gibberish and its "
            "times are not a real model's"
        )
    return result


def _cpus(environment: Mapping[str, Any]) -> float | None:
    v = environment.get("cpu_count")
    return float(v) if isinstance(v, int | float) and v > 0 else None


def random_weights(workload: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    """The workload is one of soakd's built-in tiny models (random weights, built offline),
    as its ``describe()`` says (``builtin``); for a run stored before it said so, as its
    config implies."""
    if "builtin" in workload:
        return bool(workload["builtin"])
    wl = config.get("workload", {})
    kind = wl.get("kind")
    builtin = kind in ("tiny-vlm", "generator")
    return builtin or (kind in ("session", "av") and not wl.get("model_path"))


def _held(v: Any) -> str:
    """A held-fixed value as the config would spell it; an unset one (None) as 'unset'."""
    return "unset" if v is None else repr(v)


class _HostMeter:
    """The host's CPU time and this process's from its start to ``read()``: other
    processes' share of the host's CPUs over a profile too short for a telemetry sample."""

    def __init__(self) -> None:
        self.host = psutil.cpu_times()
        self.own = psutil.Process().cpu_times()
        self.cpus = psutil.cpu_count() or 1

    @staticmethod
    def _busy(t: Any) -> float:
        return float(sum(t)) - float(t.idle) - float(getattr(t, "iowait", 0.0))

    def read(self) -> HostLoad | None:
        host, own = psutil.cpu_times(), psutil.Process().cpu_times()
        total = float(sum(host)) - float(sum(self.host))
        if total <= 0:
            return None
        busy = self._busy(host) - self._busy(self.host)
        mine = (own.user + own.system) - (self.own.user + self.own.system)
        others = min(100.0, max(0.0, 100.0 * (busy - mine) / total))
        return HostLoad(others_pct=others, load1=psutil.getloadavg()[0], cpus=self.cpus)


def _host_note(r: ProfileResult) -> list[str]:
    if r.host is None or not r.host.contended:
        return []
    return [
        f"host busy: {r.host.words()} during the profile: its times are the host's as much "
        "as the model's, and its rate will not hold when the load changes; profile on a "
        "quiet host"
    ]


def _notes(r: ProfileResult) -> list[str]:
    notes = []
    if r.held_fixed:
        fixed = ", ".join(f"{k}={_held(v)}" for k, v in r.held_fixed.items())
        notes.append(f"held fixed: {fixed}")
    else:
        notes.append(
            f"held fixed: the {r.workload_kind} workload's settings (no prompt or output length)"
        )
    if r.measured < 5:
        notes.append(f"only {r.measured} frames after the first: medians are rough")
    if r.peak_rss_bytes is None:
        notes.append(
            "no telemetry sample fell inside the profile (shorter than the sample "
            "interval): peak memory unknown; run more frames"
        )
    if r.errors:
        notes.append(f"{r.errors} frame(s) raised; they are left out of the statistics")
    if not r.completed:
        notes.append(
            f"the profile run ended {r.status}: {r.reason}; no rate is recommended from a "
            "run that did not complete (exit 3)"
        )
    return notes + _host_note(r)


def profile(
    settings: Settings,
    *,
    frames: int = 20,
    observers: Sequence[Observer] = (),
    paced: bool = False,
) -> ProfileResult:
    """Run ``frames`` frames of the configured workload and source back to back (``paced``:
    at the configured rate instead) and return the profile. Raises ``UsageError`` for a
    source, database or workload that cannot be opened (exit code 2)."""
    if frames < 2:
        raise ValueError("a profile needs at least 2 frames (the first is set apart)")
    meter = _HostMeter()
    result = run_soak(
        settings, observers=observers, mode="profile", max_frames=frames, paced=paced, judge=False
    )
    conn = connect(settings.resolved_db(), mark_orphans=False)
    try:
        out = profile_from_db(conn, result.run_id)
    finally:
        conn.close()
    if out.host is None:  # shorter than one telemetry tick: the host over the whole call
        out.host = meter.read()
        out.notes = [n for n in out.notes if not n.startswith("host busy")] + _host_note(out)
    if out.sample_output is None:
        out.sample_output = result.summary.get("sample_output")
    return out


# --- rendering


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def _mb(v: int | None) -> str:
    return "–" if v is None else f"{v / (1 << 20):.0f} MB"


def _rate_lines(r: ProfileResult) -> list[str]:
    """The theoretical and recommended rates, or why there is none."""
    lines: list[str] = []
    if r.question_every_s is not None and r.theoretical_fps is not None:
        lines.append(
            f"- answers: {r.theoretical_fps:.2f} a second one at a time (1000 / {r.rate_basis})"
        )
        lines.append(
            f"- recommended: a question at most every {r.question_every_s:g} s "
            f"({RECOMMEND_FACTOR:g}x; frames go out at --fps whatever the answers take): "
            f"`--set workload.question_every_s={r.question_every_s:g}`"
        )
    elif r.theoretical_fps is not None and r.recommended_band is not None:
        lo, hi = r.recommended_band
        lines.append(f"- theoretical rate: {r.theoretical_fps:.2f} fps (1000 / {r.rate_basis})")
        lines.append(
            f"- recommended rate: {r.recommended_fps:g} fps "
            f"({RECOMMEND_FACTOR:g}x; band {lo:.3g}-{hi:.3g}): `{r.fps_flag}`"
        )
    elif r.theoretical_fps is not None:  # measured, but the run did not complete
        lines.append(
            f"- theoretical rate: {r.theoretical_fps:.2f} fps (1000 / {r.rate_basis}) over a "
            f"run that ended {r.status}"
        )
        lines.append("- recommended rate: none (the run did not complete)")
    else:
        lines.append("- theoretical rate: unknown (no frame finished after the first)")
    return lines


def render_markdown(r: ProfileResult) -> str:
    """The profile as Markdown: readable in a terminal and in a pull request."""
    lines = [f"## soakd profile `{r.run_id}` ({r.workload_kind}, {r.frames} frames unpaced)", ""]
    lines += ["| stage | first frame (ms) | median (ms) | max (ms) |", "|---|---|---|---|"]
    for s in STAGES:
        st = r.stages[s]
        lines.append(f"| {s} | {_ms(r.first.get(s))} | {_ms(st.median)} | {_ms(st.max)} |")
    lines.append("")
    lines.append(
        f"Statistics over the {r.measured} frames after the first; the first frame "
        "(load, allocation, compilation) is shown on its own."
    )
    if r.first_error:
        lines.append(f"First frame raised: {r.first_error}")
    lines.append("")
    if r.stream is not None:
        ss = r.stream
        lines += [
            "| streaming output | value (ms) |",
            "|---|---|",
            f"| first output, first request | {_ms(ss.first_output_ms)} |",
            f"| first output p50 / max (later requests) | {_ms(ss.first_output_p50_ms)}"
            f" / {_ms(ss.first_output_max_ms)} |",
            f"| inter-output interval p50 | {_ms(ss.interval_p50_ms)} |",
            f"| inter-output interval p95 | {_ms(ss.interval_p95_ms)} |",
            f"| inter-output interval max | {_ms(ss.interval_max_ms)} |",
            "",
            f"Intervals: {ss.intervals}, each request's first output (a rollout's very first"
            " output) excluded.",
            "",
        ]
    if r.session is not None:
        se = r.session
        lines += [
            "| session | value (ms) |",
            "|---|---|",
            f"| interval between frames taken p50 / max | {_ms(se.take_interval_p50_ms)}"
            f" / {_ms(se.take_interval_max_ms)} |",
            f"| capture -> next output p50 / max | {_ms(se.output_latency_p50_ms)}"
            f" / {_ms(se.output_latency_max_ms)} |",
            "",
            f"Frames the model took after the first: {se.taken}; fed faster than it takes"
            " them, the interval between two is what one frame costs the session.",
            "",
        ]
    lines.append(f"- peak process memory (RSS): {_mb(r.peak_rss_bytes)}")
    lines.append(f"- peak GPU memory: {_mb(r.peak_gpu_mem_bytes)}")
    if r.load_s is not None:
        lines.append(f"- workload load time: {r.load_s:.2f} s")
    if r.out_tokens is not None:
        lines.append(f"- output tokens per frame (median): {r.out_tokens:g}")
    if r.vision_tokens is not None or r.audio_tokens is not None:
        media = ", ".join(
            f"{name} {v:g}"
            for name, v in (("vision", r.vision_tokens), ("audio", r.audio_tokens))
            if v is not None
        )
        lines.append(f"- media tokens per request (median): {media}")
    if r.sample_output is not None:
        text = r.sample_output.replace("\n", " ")[:200]
        lines.append(f"- sample output: {text!r}")
    lines += _rate_lines(r)
    if r.host is not None:
        mark = " (contention)" if r.host.contended else ""
        lines.append(f"- host: {r.host.words()}{mark}")
    lines += ["", *(f"> {n}" for n in r.notes)]
    return "\n".join(lines) + "\n"
