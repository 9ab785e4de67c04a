"""The records that flow through a run: captured frames, per-frame results, telemetry
samples and events.

Times inside a run are nanoseconds on the monotonic clock (``Clock.now_ns``); the store
turns them into seconds since the run's start (``t_*`` columns) so that rows from
``frames``, ``samples`` and ``events`` line up on one time axis. Durations are stored in
milliseconds (``*_ms``), memory in bytes (``*_bytes``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

#: The per-frame stages, in order: the one place that names them. ``total`` is their sum.
STAGES: tuple[str, ...] = ("grab", "pre", "infer", "decode", "total")
#: Their columns in the ``frames`` table (milliseconds).
STAGE_COLUMNS: tuple[str, ...] = tuple(f"{s}_ms" for s in STAGES)


@dataclass(slots=True)
class Frame:
    """A frame as the pacer captured it.

    ``t_sched_ns`` is the absolute deadline the pacer aimed at, ``t_capture_ns`` when the
    source returned the image, ``grab_ns`` how long the source call took. ``audio`` is the
    chunk of audio that arrived with this frame (AV workloads), or None. ``stream_ns`` is
    the frame's position on the stream's clock; ``stream`` which of the run's paced sources
    (``run.streams``) captured it, 0 for the first or only one.
    """

    id: int
    t_sched_ns: int
    t_capture_ns: int
    grab_ns: int
    image: np.ndarray
    audio: np.ndarray | None = None
    source_ts: float | None = None  # position in the source (s), e.g. the video timestamp
    # the stream's own clock (ns since the run's start): the deadline in a paced run; in an
    # unpaced profile, k / fps, so windows over stream time see the stream at the target rate
    stream_ns: int = 0
    stream: int = 0


@dataclass(slots=True)
class StageOutput:
    """What a workload's ``decode`` returns: the text (if any), the number of generated
    tokens, and kind-specific extras (media token counts, sample output...)."""

    text: str | None = None
    tokens: int | None = None
    vision_tokens: int | None = None
    audio_tokens: int | None = None
    extra: dict[str, Any] | None = None


class FrameRecord(NamedTuple):
    """One row of the ``frames`` table, its fields in the table's column order (after
    ``run_id``). ``None`` means unknown (never invented).

    A tuple, so that its row is bound to SQLite as it is (``extra`` aside, stored as JSON);
    drivers that fill a record in steps (sessions) build a new one with ``_replace``. The
    staged driver's records are built a batch at a time, positionally in this order
    (run/sink.py: ``staged_records``; tests/test_sink.py pins them against keyword-built
    ones)."""

    frame_id: int
    t_sched: float  # seconds since run start
    t_capture: float
    t_dispatch: float | None
    t_done: float | None
    lateness_ms: float
    grab_ms: float
    pre_ms: float | None = None
    infer_ms: float | None = None
    decode_ms: float | None = None
    total_ms: float | None = None  # grab + pre + infer + decode
    queue_len: int = 0
    frame_age_ms: float | None = None  # dispatch - capture
    e2e_ms: float | None = None  # done - scheduled capture
    drop_count: int = 0  # cumulative frames dropped by the queue
    stale_count: int = 0  # cumulative frames skipped as older than max_age_ms
    out_tokens: int | None = None
    vision_tokens: int | None = None
    audio_tokens: int | None = None
    error: str | None = None
    first: bool = False
    warmup: bool = False
    skipped: bool = False  # True for a stale frame that was never dispatched
    session_dropped: int | None = None  # cumulative drops reported by a session model
    pending: int | None = None  # frames pending inside a session model
    output_kind: str | None = None  # session: "text" | "silence" | None
    output_latency_ms: float | None = None  # capture -> next output (session models)
    first_emit_ms: float | None = None  # generator: request -> first emitted frame
    emitted: int | None = None  # generator: frames emitted for this request
    extra: dict[str, Any] | None = None  # stored as JSON text
    # which paced source captured the frame (run.streams); drop_count and stale_count are
    # cumulative per stream
    stream: int = 0
    t_consumed: float | None = None  # session: the model took the frame (s since run start)
    consume_ms: float | None = None  # session: push -> taken by the model
    consume_output_ms: float | None = None  # session: taken -> the model's next output


@dataclass(slots=True)
class Emission:
    """One emitted output frame of a generator workload (``emissions`` table)."""

    frame_id: int  # the request (frames.frame_id) it belongs to
    idx: int  # index of the emitted frame within the request
    t_emit: float  # seconds since run start
    interval_ms: float | None  # since the previous emission of the run (None for the first)
    chunk: int  # chunk number within the request
    chunk_frames: int  # frames delivered together in that chunk
    chunk_ms: float  # time the chunk took


#: what a rollout's named stage may be called (``run.stage(name)``, ``chunk_stages.name``)
STAGE_NAME = re.compile(r"[a-z0-9_]{1,64}")


@dataclass(slots=True)
class ChunkStage:
    """One named stage of one rollout chunk (``chunk_stages`` table): ``frame_id`` is the
    chunk's ``frames`` row, ``ms`` the stage's total time in it (a name that repeats inside
    a chunk adds up)."""

    frame_id: int
    name: str
    ms: float


@dataclass(slots=True)
class Sample:
    """One telemetry tick (``samples`` table). Every probe value may be None."""

    seq: int
    t: float  # seconds since run start (actual, not the deadline)
    wall: float  # unix time, to join with outside logs
    lag_ms: float  # how late the tick started after its deadline
    tick_ms: float  # how long the tick itself took
    values: dict[str, float | int | None] = field(default_factory=dict)
    # one reading per GPU the run uses (run.gpus), when it uses several; else empty
    devices: tuple[DeviceSample, ...] = ()
    # the model server's Prometheus gauges and counters read at this tick (served models)
    server: tuple[ServerMetric, ...] = ()


@dataclass(slots=True)
class DeviceSample:
    """One GPU's reading at one telemetry tick (``gpu_samples`` table). ``gpu`` is the NVML
    index (as nvidia-smi and dcgm-exporter number GPUs, whatever CUDA_VISIBLE_DEVICES says);
    ``seq`` and ``t`` are those of the tick's ``Sample``. Every value may be None."""

    seq: int
    t: float
    gpu: int
    uuid: str
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    util_pct: float | None = None
    proc_mem_bytes: int | None = None  # this process's memory on the device
    temp_c: float | None = None
    power_w: float | None = None


@dataclass(slots=True)
class ServerMetric:
    """One series of the model server's own Prometheus metrics at one telemetry tick
    (``server_metrics`` table): ``name`` as exported (``vllm:num_requests_waiting``),
    ``labels`` its label set as ``k="v",...`` sorted by key ("" for none); ``seq`` and ``t``
    are those of the tick's ``Sample``."""

    seq: int
    t: float
    name: str
    labels: str
    value: float


@dataclass(slots=True)
class Event:
    """Something that happened once (``events`` table): warm-up end, error, OOM, signal,
    source end, stall, abort..."""

    kind: str
    t: float
    wall: float
    message: str = ""
    frame_id: int | None = None
    data: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.message = safe_text(self.message)


def safe_text(text: str) -> str:
    """``text`` as it can be stored and printed: a lone surrogate (an undecodable byte
    Python kept as ``\\udcff``, from a model's or a server's text) written as that escape,
    not an encoding error that would abort the run. Everything else unchanged."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def error_text(exc: BaseException, limit: int = 2000) -> str:
    """The one line an exception is stored as (a frame's ``error``, an ``error`` event):
    ``TypeName: message``, at most ``limit`` characters, safe to store (``safe_text``)."""
    return safe_text(f"{type(exc).__name__}: {exc}")[:limit]


#: the event a run stores when an observer raised and was dropped (its data: ``observer``,
#: ``hook``, ``error`` and ``decides``: the early decision its loss switched off, or None)
OBSERVER_FAILED_EVENT = "observer_failed"

#: the event a ``run.duration = "auto"`` run stores at each look: where every criterion
#: stands (its data: ``{"criteria": [[criterion, state, detectable, tolerance, unit, why],
#: ...]}``)
LOOK_EVENT = "look"
DECIDED, UNDECIDED, FAILING = "decided", "undecided", "failing"


@dataclass(frozen=True, slots=True)
class Standing:
    """Where one criterion stands at a look of a ``duration = "auto"`` run: ``state`` is
    decided (PASS or n/a), failing (FAIL so far, which a longer run may still pass: a
    certain FAIL stops the run) or undecided; a trend's smallest detectable slope so far
    (``detectable``, None for other criteria) beside its ``tolerance``; ``why`` a criterion
    is not decided, in a few words ("too short to judge", "undecided", "rising ...")."""

    criterion: str
    state: str
    detectable: float | None = None
    tolerance: float | None = None
    unit: str | None = None
    why: str = ""

    def as_row(self) -> list[Any]:
        return [self.criterion, self.state, self.detectable, self.tolerance, self.unit, self.why]

    def sees(self) -> str:
        """``0.42 MB/min (tolerance 1.5)``: the smallest slope the run could see so far, ""
        for a criterion that is not a trend or has no estimate yet."""
        if self.detectable is None:
            return ""
        tol = "" if self.tolerance is None else f" (tolerance {self.tolerance:g})"
        return f"{self.detectable:.3g} {self.unit or ''}".rstrip() + tol


def standings(data: dict[str, Any] | None) -> list[Standing]:
    """The standings of a ``look`` event's data (none for anything else)."""
    rows = (data or {}).get("criteria") or []
    return [
        Standing(str(name), str(state), _num(seen), _num(tol), unit, str(why))
        for name, state, seen, tol, unit, why in (
            r for r in rows if isinstance(r, list) and len(r) == 6
        )
    ]


def waiting_on(stands: list[Standing]) -> list[str]:
    """The criteria a look still waits on: every one not decided."""
    return [st.criterion for st in stands if st.state != DECIDED]


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


# Telemetry columns of the samples table, in order. Probes fill a subset; the rest are NULL.
SAMPLE_FIELDS: tuple[str, ...] = (
    "rss_bytes",
    "cpu_pct",
    "sys_mem_used_bytes",
    "sys_mem_total_bytes",
    "gpu_mem_used_bytes",
    "gpu_mem_total_bytes",
    "gpu_util_pct",
    "gpu_mem_util_pct",
    "gpu_proc_mem_bytes",
    "gpu_temp_c",
    "gpu_power_w",
    "gpu_sm_clock_mhz",
    "torch_allocated_bytes",
    "torch_reserved_bytes",
    "torch_max_allocated_bytes",
    "torch_max_reserved_bytes",
    "torch_alloc_retries",
    "torch_ooms",
    # a served model's server (kind = "openai"): its process and children, found by
    # telemetry.server_pid / server_unit / the endpoint's port (soakd.telemetry.server)
    "server_rss_bytes",
    "server_cpu_pct",
    "server_cgroup_mem_bytes",  # the unit's cgroup memory.current (telemetry.server_unit)
    "server_gpu_mem_bytes",  # NVML: GPU memory of the server's processes
    # the host, every process on it (soakd.telemetry.probes.ProcessProbe): CPU busy and
    # stolen (% of all CPUs since the previous tick), the 1-minute load average and the
    # run queue (Linux /proc/stat procs_running, the sampler's own thread included)
    "host_cpu_pct",
    "host_steal_pct",
    "host_load1",
    "host_run_queue",
)


#: the telemetry sample columns the analysis reads (RunData.samples, besides ``t``)
SAMPLE_METRICS: tuple[str, ...] = (
    "rss_bytes",
    "cpu_pct",
    "gpu_mem_used_bytes",
    "gpu_mem_total_bytes",
    "gpu_util_pct",
    "gpu_proc_mem_bytes",
    "torch_allocated_bytes",
    "torch_reserved_bytes",
    "torch_ooms",
    "server_rss_bytes",
    "server_cpu_pct",
    "server_cgroup_mem_bytes",
    "server_gpu_mem_bytes",
    "host_cpu_pct",
    "host_steal_pct",
    "host_load1",
    "host_run_queue",
)
