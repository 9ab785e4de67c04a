"""The numbers every report carries: per-stage percentiles over the measured window, the
first frame apart, frame age, achieved fps, the run's counters, its environment and config.

Pure: a RunData and its Verdict in, a ``RunSummary`` out. The measured window is the
verdict's (``RunData.measured``: post-warm-up, dispatched; the first frame is a warm-up
frame), from ``verdict.window["t0"]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from soakd.analysis import chunks
from soakd.analysis.model import RunData, Verdict
from soakd.records import STAGE_COLUMNS

#: environment keys the reports show, in order, with their labels
ENV_KEYS: tuple[tuple[str, str], ...] = (
    ("gpu_name", "GPU"),
    ("driver", "driver"),
    ("cuda_driver", "CUDA"),
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("python", "python"),
    ("cpu", "CPU"),
    ("host", "host"),
)
#: the counters, from ``runs.summary`` (frames_captured, frames_done, drops, stale, errors)
COUNT_KEYS: tuple[str, ...] = ("captured", "done", "drops", "stale", "errors")


@dataclass(frozen=True, slots=True)
class Dist:
    """Percentiles of one series over the measured frames (None when it has no values)."""

    n: int
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None
    mean: float | None = None

    @classmethod
    def of(cls, values: np.ndarray) -> Dist:
        v = np.asarray(values, dtype=np.float64)
        v = v[np.isfinite(v)]
        if not v.size:
            return cls(0)
        p50, p95, p99 = (float(x) for x in np.percentile(v, [50, 95, 99]))
        return cls(int(v.size), p50, p95, p99, float(v.max()), float(v.mean()))

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("n", "p50", "p95", "p99", "max", "mean")}


@dataclass(frozen=True, slots=True)
class RunSummary:
    """``stages``: stage name (grab, pre, ...) -> Dist in ms; ``first_ms``: the first
    frame's stage times; ``fps``: achieved (measured frames / measured seconds) and
    target; ``environment``: ``runs.environment`` (host from the run row when absent)."""

    stages: dict[str, Dist]
    first_ms: dict[str, float | None]
    frame_age: Dist
    fps: dict[str, float | None]
    counts: dict[str, float | None]
    environment: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    # session runs: "next output" (push -> next output), "consume" (push -> the model took
    # the frame), "consume to output" (take -> its first output after); empty otherwise
    session: dict[str, Dist] = field(default_factory=dict)
    questions: list[dict[str, Any]] = field(default_factory=list)  # session_questions
    # generator runs: "first_output_ms", "interval" (a Dist of the per-frame average
    # intervals), "presentation" (a Dist of the presentation intervals: frames as they
    # become visible), "judged_on" (the one content_fps and jitter judged), "tail" (where
    # the per-frame intervals at or above their p95 fall, by emit position and chunk) and a
    # rollout's "episodes"; empty otherwise
    generator: dict[str, Any] = field(default_factory=dict)
    chunk_stages: dict[str, Dist] = field(default_factory=dict)  # a rollout's named stages
    # streamed served models (kind = "openai"), per request: "time to first token" (the infer
    # stage), "inter-token latency" (decode time / (tokens - 1), as AIPerf and guidellm
    # define it) and the gaps between the stream's content chunks ("chunk gap p50/p95/max
    # (per request)": over requests, each request's p50, p95 and max; a server that sends
    # several tokens a chunk has gaps longer than its inter-token latency); empty otherwise
    served: dict[str, Dist] = field(default_factory=dict)
    # served models: "output_tokens" and "output_tokens_per_s" over the measured window, and
    # "errors_by_kind" (the whole run: "timeout", "http 503", ...); empty otherwise
    served_run: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The JSON report's ``summary`` object (environment and config stand apart)."""
        return {
            "stages": {
                k: {**d.as_dict(), "first": self.first_ms.get(k)} for k, d in self.stages.items()
            },
            "session": {k: d.as_dict() for k, d in self.session.items()},
            "generator": {
                k: v.as_dict() if isinstance(v, Dist) else v for k, v in self.generator.items()
            },
            "chunk_stages": {k: d.as_dict() for k, d in self.chunk_stages.items()},
            "served": {k: d.as_dict() for k, d in self.served.items()},
            "served_run": dict(self.served_run),
            "frame_age": self.frame_age.as_dict(),
            "fps": dict(self.fps),
            "counts": dict(self.counts),
        }

    def environment_line(self) -> str:
        """``GPU NVIDIA H200, driver 550.54, ..., host gpu-07`` (only the known facts)."""
        parts = [
            f"{label} {self.environment[k]}" for k, label in ENV_KEYS if self.environment.get(k)
        ]
        return ", ".join(parts) or "unknown"


def _first_ms(data: RunData) -> dict[str, float | None]:
    """The first dispatched frame's stage times (it is excluded from the percentiles)."""
    done = np.flatnonzero(data.frames["skipped"] == 0) if data.n_frames else np.empty(0, int)
    out: dict[str, float | None] = {}
    for col in STAGE_COLUMNS:
        v = float(data.frame(col)[done[0]]) if done.size else float("nan")
        out[col.removesuffix("_ms")] = v if np.isfinite(v) else None
    return out


def _fps(data: RunData, verdict: Verdict, n: int) -> dict[str, float | None]:
    t0 = float(verdict.window.get("t0", 0.0))
    t1 = float(verdict.window.get("t1", t0))
    span = t1 - t0
    return {
        "achieved": n / span if span > 0 else None,
        "target": data.meta.fps,
        "measured_s": span,
    }


def _counts(data: RunData, n: int) -> dict[str, float | None]:
    """The runner's counters (None: unknown for this run) and the measured frames."""
    m = data.meta
    keys = {"captured": "frames_captured", "done": "frames_done"}
    out = {k: m.counter(keys.get(k, k)) for k in COUNT_KEYS}
    out["measured"] = float(n)
    if out["errors"] is None:  # an older run: count the rows that raised
        out["errors"] = float((data.frame("has_error") > 0).sum())
    return out


def _streamed(data: RunData, verdict: Verdict, fs: dict[str, Any]) -> RunSummary:
    """The summary of a run judged on the bounded path: its numbers from the verdict's
    ``frame_summary`` (the frames were never loaded)."""
    stages = {c.removesuffix("_ms"): Dist(**fs["stages"][c]) for c in STAGE_COLUMNS}
    n = int(verdict.window.get("measured_frames", 0))
    counts = _counts(data, n)
    if data.meta.counter("errors") is None:  # an older run: the rows that raised
        counts["errors"] = fs["errors"]
    env = dict(data.meta.environment)
    env["host"] = env.get("host") or data.meta.host
    return RunSummary(
        stages=stages,
        first_ms=dict(fs["first_ms"]),
        frame_age=Dist(**fs["frame_age"]),
        fps=_fps(data, verdict, n),
        counts=counts,
        environment=env,
        config=dict(data.meta.config),
    )


def _session(data: RunData, measured: np.ndarray) -> dict[str, Dist]:
    """A session run's latencies over the measured frames: what "next output after the push"
    times apart from when the model took the frame and answered it."""
    if data.meta.shape != "session":
        return {}
    nxt = data.frame("output_latency_ms") - data.frame("frame_age_ms")  # push -> next output
    out = {
        "next output": Dist.of(nxt[measured]),
        "consume": Dist.of(data.frame("consume_ms")[measured]),
        "consume to output": Dist.of(data.frame("consume_output_ms")[measured]),
    }
    return {k: d for k, d in out.items() if d.n}


#: the served-model rows of the numbers table: label -> frame column (ms)
SERVED_ROWS: tuple[tuple[str, str], ...] = (
    ("time to first token", "infer_ms"),
    ("chunk gap p50 (per request)", "itl_p50_ms"),
    ("chunk gap p95 (per request)", "itl_p95_ms"),
    ("chunk gap max (per request)", "itl_max_ms"),
)
#: the row of each request's inter-token latency: decode time / (output tokens - 1)
ITL_ROW = "inter-token latency (decode / (tokens - 1))"


def _served(data: RunData, measured: np.ndarray) -> dict[str, Dist]:
    """A served model's time to first token, inter-token latency and chunk gaps; none for a
    run that did not stream (``workload.stream = false``): its infer stage is the whole
    answer, not a first token (the stage table shows it)."""
    if data.meta.workload_kind != "openai" or data.meta.setting("workload", "stream") is False:
        return {}
    tokens = data.frame("out_tokens")
    with np.errstate(invalid="ignore", divide="ignore"):
        itl = np.where(tokens > 1, data.frame("decode_ms") / (tokens - 1), np.nan)
    (ttft_label, ttft), *gaps = SERVED_ROWS
    out = {ttft_label: Dist.of(data.frame(ttft)[measured]), ITL_ROW: Dist.of(itl[measured])}
    out |= {label: Dist.of(data.frame(col)[measured]) for label, col in gaps}
    return {k: d for k, d in out.items() if d.n}


def _served_run(data: RunData, measured: np.ndarray, span_s: float | None) -> dict[str, Any]:
    """A served model's output tokens and tokens per second over the measured window, and
    its errors by kind over the whole run."""
    if data.meta.workload_kind != "openai":
        return {}
    tokens = data.frame("out_tokens")[measured]
    total = int(np.nansum(tokens)) if tokens.size else 0
    rate = total / span_s if span_s else None
    return {"output_tokens": total, "output_tokens_per_s": rate,
            "errors_by_kind": dict(data.error_kinds)}  # fmt: skip


def _generator(data: RunData, verdict: Verdict) -> dict[str, Any]:
    """A generator run's first output, output intervals (the per-frame average and the
    presentation interval), which of them content_fps and jitter judged, the tail, and a
    rollout's episode count (see chunks.py)."""
    if not data.meta.generates:
        return {}
    t0 = float(verdict.window.get("t0", 0.0))
    iv = chunks.output_intervals(data, t0)
    d = Dist.of(iv.ms)
    out: dict[str, Any] = {"first_output_ms": chunks.first_output_ms(data), "interval": d}
    out["presentation"] = Dist.of(chunks.presentation_intervals(data, t0).ms)
    cf = verdict.get("content_fps")
    out["judged_on"] = (cf.evidence or {}).get("basis") if cf is not None else None
    if d.p95 is not None:
        out["tail"] = chunks.interval_tail(iv, d.p95)
    episodes = data.meta.counter("rollout_episodes")
    if episodes is not None:
        out["episodes"] = int(episodes)
    return out


def summarize(data: RunData, verdict: Verdict) -> RunSummary:
    """The run's numbers over the verdict's measured window."""
    if verdict.frame_summary is not None:
        return _streamed(data, verdict, verdict.frame_summary)
    measured = data.measured(float(verdict.window.get("t0", data.warmup_end())))
    stages = {col.removesuffix("_ms"): Dist.of(data.frame(col)[measured]) for col in STAGE_COLUMNS}
    env = dict(data.meta.environment)
    env["host"] = env.get("host") or data.meta.host
    n = int(measured.sum())
    return RunSummary(
        stages=stages,
        first_ms=_first_ms(data),
        frame_age=Dist.of(data.frame("frame_age_ms")[measured]),
        fps=_fps(data, verdict, n),
        counts=_counts(data, n),
        environment=env,
        config=dict(data.meta.config),
        session=_session(data, measured),
        questions=list(data.meta.summary.get("session_questions") or []),
        generator=_generator(data, verdict),
        chunk_stages={name: Dist.of(col[measured]) for name, col in data.stages.items()},
        served=_served(data, measured),
        served_run=_served_run(data, measured, _fps(data, verdict, n)["measured_s"]),
    )
