"""The analysis vocabulary: what goes in (``RunMeta``, ``RunData``), what comes out
(``CriterionResult``, ``Verdict``), the status words and the window rules.

Pure: numpy and soakd's own vocabulary only; no SQL, no rendering. ``verdict.py`` (the
criteria) and ``diagnosis.py`` (the hints) both build on this module, so neither imports
the other's types, and the reports read the same classes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from soakd.analysis.stats import Trend, Windows
from soakd.errors import ExitCode

#: Status of one criterion.
PASS, FAIL, INVALID, NA = "pass", "fail", "invalid", "n/a"
#: Overall status of a verdict (``Verdict.status``).
OVERALL_PASS, OVERALL_FAIL, OVERALL_INVALID = "PASS", "FAIL", "INVALID"

MIB = float(1 << 20)
MAX_WINDOWS = 400  # trend statistics never see more points than this
MIN_WINDOWS = 12  # fewer memory-floor windows than this: the window is shortened
#: a floor window shortened by at most this fraction still counts as ``floor_window_s`` (a
#: run that ends a few samples short of 12 whole windows is not too short to judge)
FLOOR_SLACK = 0.05
AGE_MIN_WINDOW_S = 0.5


def age_window_s(span: float, fps: float | None) -> float:
    """Window for per-window medians of frame age / stage times: at least 0.5 s and 10 frames,
    at most MAX_WINDOWS windows over the run."""
    w = max(AGE_MIN_WINDOW_S, span / MAX_WINDOWS)
    if fps and fps > 0:
        w = max(w, 10.0 / fps)
    return w


def floor_window_s(span: float, configured: float) -> tuple[float, str | None]:
    """Memory-floor window: the configured one (longer when the run would have more than
    MAX_WINDOWS), shortened to span/MIN_WINDOWS for short runs, with a warning."""
    w = max(configured, span / MAX_WINDOWS)
    if span > 0 and span / w < MIN_WINDOWS:
        short = span / MIN_WINDOWS
        return short, (
            f"floor window shortened from {configured:g} s to {short:.2g} s because the run "
            f"is short; an allocator sawtooth slower than that can read as growth"
        )
    return w, None


#: (criterion, sample column, title) of the memory-trend criteria
MEMORY_METRICS: tuple[tuple[str, str, str], ...] = (
    ("memory_rss", "rss_bytes", "Process RSS"),
    ("memory_gpu", "gpu_mem_used_bytes", "GPU memory used"),
    ("memory_gpu_proc", "gpu_proc_mem_bytes", "This process's GPU memory"),
    ("memory_torch_reserved", "torch_reserved_bytes", "Torch allocator reserved"),
)


def jitter_allowed(crit: Any, n: int) -> int:
    """Frames over k x median the jitter rule allows among ``n``: none for ``"max"``;
    ``jitter_max_exceed``, or the ``jitter_max_exceed_fraction`` share if more, for
    ``"count"``."""
    allowed = 0 if crit.jitter_rule == "max" else max(crit.jitter_max_exceed, 0)
    if crit.jitter_rule == "count":
        allowed = max(allowed, math.floor(crit.jitter_max_exceed_fraction * n))
    return int(allowed)


# --------------------------------------------------------------------------- run data

#: the workload shapes that generate frames (``emissions``): one request per paced frame,
#: or one long rollout with a chunk per paced condition
GENERATOR_SHAPES: tuple[str, ...] = ("generator", "rollout")


@dataclass(slots=True)
class RunMeta:
    """The ``runs`` row fields the verdict and the reports use."""

    run_id: str
    status: str = "completed"  # running | completed | aborted | crashed
    reason: str | None = None
    name: str | None = None
    duration_s: float | None = None
    fps: float | None = None
    workload_kind: str | None = None
    shape: str = "staged"  # staged | session | generator | rollout: the calling convention
    device: str | None = None  # workload.device from the config ("cpu", "cuda:0", ...)
    host: str | None = None
    config_hash: str = ""
    started_unix: float = 0.0
    started_at: str | None = None
    mode: str = "soak"
    warmup_s: float | None = None
    config: dict[str, Any] = field(default_factory=dict)
    #: ``runs.summary``: the runner's counters (frames_captured, drops, queued_at_end,
    #: in_flight_at_end, pacer_ticks, pacer_missed_ticks, ...); a key an older soakd did not
    #: write is absent, and absent means unknown, never zero
    summary: dict[str, Any] = field(default_factory=dict)
    #: ``runs.environment``: host facts taken at the start (host_mem_total_bytes,
    #: cgroup_mem_max_bytes, ...)
    environment: dict[str, Any] = field(default_factory=dict)

    @property
    def is_cuda(self) -> bool:
        return bool(self.device) and str(self.device).startswith("cuda")

    @property
    def generates(self) -> bool:
        """A frame generator (per request or a rollout): judged on its output intervals."""
        return self.shape in GENERATOR_SHAPES

    def counter(self, key: str) -> float | None:
        """A finite, non-negative number from the summary, or None when unknown."""
        return finite_or_none(self.summary.get(key))

    def fact(self, key: str) -> float | None:
        """A finite, positive number from the environment, or None when unknown."""
        v = finite_or_none(self.environment.get(key))
        return v if v is not None and v > 0 else None

    def setting(self, section: str, key: str) -> Any:
        """A value of the run's stored config (None when absent)."""
        table = self.config.get(section)
        return table.get(key) if isinstance(table, dict) else None


def finite_or_none(v: Any) -> float | None:
    """``v`` as a finite, non-negative float, or None (missing, text, NaN, negative)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x >= 0 else None


@dataclass(slots=True)
class RunData:
    """A run's frames (``frames[name]`` arrays named as rundata.FRAME_FIELDS, one element
    per row ordered by frame_id), telemetry (``samples``: ``t`` and SAMPLE_METRICS),
    generator emissions (``emissions``), events and error messages."""

    meta: RunMeta
    frames: dict[str, np.ndarray]
    samples: dict[str, np.ndarray]
    emissions: dict[str, np.ndarray]
    events: list[dict[str, Any]] = field(default_factory=list)
    event_counts: dict[str, int] = field(default_factory=dict)
    error_messages: list[tuple[str, int]] = field(default_factory=list)
    #: per GPU sampled apart (run.gpus, NVML index): ``t`` and gpu_samples.mem_used_bytes;
    #: empty for a run on one GPU (soakd.analysis.devices)
    gpus: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    #: a run too long to load (soakd.analysis.data.BOUNDED_ROWS): ``frames`` and ``samples``
    #: are empty and ``judge`` streams the rows from here (soakd.analysis.digest.RowSource)
    source: Any = None
    #: a rollout's named chunk stages (``chunk_stages``): name -> ms per frames row (NaN
    #: where the chunk has no such stage), in order of first appearance; empty otherwise
    stages: dict[str, np.ndarray] = field(default_factory=dict)
    #: a served model's server metrics (``server_metrics``): name -> (t, value summed over
    #: its label sets), ordered by time; empty otherwise (soakd.analysis.server)
    server: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    #: a served model's (kind = "openai") frame errors counted by kind, the whole run
    #: (soakd.store.rundata.load_error_kinds); empty otherwise
    error_kinds: dict[str, int] = field(default_factory=dict)
    #: a realtime session's answered turns (soakd.store.rundata.load_turn_columns):
    #: ``t_capture``, ``t_done``, ``warmup`` and rundata.TURN_FIELDS (``ttfd_ms``, ``done_ms``,
    #: ``delta_p95_ms``, ``audio_s``, ``audio_rtf``, ``underruns``); empty otherwise
    turns: dict[str, np.ndarray] = field(default_factory=dict)
    #: every ``pause`` event, however many (soakd.store.rundata.load_pause_columns): ``t``,
    #: ``ticks``, ``ms`` and, for an older soakd's event without them, its ``message``;
    #: empty when not loaded (soakd.analysis.contention.pauses)
    pauses: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def n_frames(self) -> int:
        return len(self.frames["t_capture"])

    def frame(self, name: str) -> np.ndarray:
        return self.frames.get(name, np.full(self.n_frames, np.nan))

    def sample(self, name: str) -> np.ndarray:
        return self.samples.get(name, np.full(len(self.samples["t"]), np.nan))

    def warmup_end(self) -> float:
        """Seconds since start at which the measured window begins."""
        for e in self.events:
            if e.get("kind") == "warmup_end" and e.get("t") is not None:
                return float(e["t"])
        t = self.frames["t_capture"]
        if t.size == 0:
            return 0.0
        warm = self.frames["warmup"] > 0
        if (~warm).any():
            return float(t[~warm].min())
        return float(t.max())  # every frame is a warm-up frame: nothing measured

    def window_end(self, t0: float) -> float:
        """Seconds since start at which the measured window ends: the last frame capture or
        telemetry sample (``t0`` when there is neither)."""
        t, st = self.frames["t_capture"], self.samples["t"]
        end = float(t.max()) if t.size else t0
        return max(end, float(st.max())) if st.size else end

    def post_warmup(self, t0: float) -> np.ndarray:
        """Mask of the rows after the warm-up (not flagged warm-up, captured at or after
        ``t0``), dispatched or skipped as stale: what losses are counted over."""
        t = self.frames["t_capture"]
        if not t.size:
            return np.zeros(0, dtype=bool)
        return (self.frames["warmup"] == 0) & (t >= t0)

    def measured(self, t0: float) -> np.ndarray:
        """Mask of the measured frames: post-warm-up and dispatched (the first frame is
        flagged warm-up too). Every timing statistic is computed over these."""
        return self.post_warmup(t0) & (self.frames["skipped"] == 0)


# --------------------------------------------------------------------------- verdict


@dataclass(slots=True, kw_only=True)
class CriterionResult:
    """One judged criterion: a ``verdicts`` row. Build it with keywords or with
    ``passed`` / ``failed`` / ``invalid`` / ``na``."""

    criterion: str
    title: str
    status: str  # pass | fail | invalid | n/a
    value: float | None
    threshold: float | None
    unit: str
    detail: str  # one line, plain language
    evidence: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def invalid(
        cls, criterion: str, title: str, *, threshold: float | None, unit: str, detail: str
    ) -> CriterionResult:
        """INVALID: the criterion has nothing to judge (no value, no evidence)."""
        return cls._valueless(INVALID, criterion, title, threshold, unit, detail)

    @classmethod
    def na(
        cls, criterion: str, title: str, *, threshold: float | None, unit: str, detail: str
    ) -> CriterionResult:
        """n/a: the criterion cannot apply here (no GPU, a session that hides its stages)."""
        return cls._valueless(NA, criterion, title, threshold, unit, detail)

    @classmethod
    def _valueless(
        cls, status: str, criterion: str, title: str, threshold: float | None, unit: str,
        detail: str,
    ) -> CriterionResult:  # fmt: skip
        return cls(criterion=criterion, title=title, status=status, value=None,
                   threshold=threshold, unit=unit, detail=detail)  # fmt: skip

    def row(self) -> dict[str, Any]:
        ev = dict(self.evidence)
        if self.warnings:
            ev["warnings"] = list(self.warnings)
        return {
            "criterion": self.criterion,
            "status": self.status,
            "value": self.value,
            "threshold": self.threshold,
            "unit": self.unit,
            "detail": self.detail,
            "evidence": ev,
        }


@dataclass(slots=True, kw_only=True)
class Verdict:
    """The judgement of one run. ``status`` is PASS, FAIL or INVALID and ``exit_code`` the
    matching ExitCode; ``series`` holds window aggregates for the plots (not stored)."""

    run_id: str
    status: str
    exit_code: ExitCode
    reason: str
    criteria: list[CriterionResult]
    hints: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    window: dict[str, Any] = field(default_factory=dict)
    series: dict[str, Windows] = field(default_factory=dict)
    trends: dict[str, Trend] = field(default_factory=dict)
    #: set on the bounded path (frames never loaded): the reports' per-stage numbers
    #: (``digest.FrameDigest.frame_summary``)
    frame_summary: dict[str, Any] | None = None

    def get(self, criterion: str) -> CriterionResult | None:
        return next((c for c in self.criteria if c.criterion == criterion), None)

    @property
    def failed(self) -> list[CriterionResult]:
        return [c for c in self.criteria if c.status == FAIL]

    @property
    def invalid(self) -> list[CriterionResult]:
        return [c for c in self.criteria if c.status == INVALID]
