"""Validated, immutable settings.

The run-level sections (``[run]``, ``[source]``, ``[audio]``, ``[criteria]``,
``[telemetry]``, ``[service]``) live here; ``[workload]`` is composed of the kinds' own
settings, each beside its code (``soakd/workloads/<kind>_settings.py``); what both share
(the section base, durations, devices) is ``soakd/sections.py``.

One place merges the layers: embedded defaults < TOML file < ``--set`` overrides < flags.
Everything is checked before anything starts: unknown keys, wrong types, out-of-range
values and non-finite floats (NaN, infinity) raise ``ConfigError`` with a one-line message
naming the key path, e.g. ``run.fps: must be > 0, got -2`` (the CLI turns that into exit
code 2).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from soakd.records import SAMPLE_METRICS, STAGE_COLUMNS
from soakd.sections import (
    MAX_DURATION_S,
    MAX_STREAMS,
    Duration,
    _check_base_url,
    _Section,
    parse_duration,
)
from soakd.sections import MAX_NUMBER as MAX_NUMBER  # re-exported: `soakd runs --limit`'s bound
from soakd.workloads.av_settings import AvWorkloadSettings
from soakd.workloads.generator_settings import GeneratorWorkloadSettings
from soakd.workloads.hf_settings import HfWorkload, TinyVlmWorkload
from soakd.workloads.matrix_game_settings import MatrixGameWorkloadSettings
from soakd.workloads.openai_settings import OpenAIWorkloadSettings
from soakd.workloads.plugin_settings import PluginWorkload, PythonWorkload
from soakd.workloads.realtime.settings import RealtimeWorkloadSettings
from soakd.workloads.session_settings import SessionWorkloadSettings
from soakd.workloads.synthetic_settings import SyntheticWorkload


@cache
def entry_point_names() -> tuple[str, ...]:
    """Workload kinds that installed packages register (the ``soakd.workloads`` group)."""
    return tuple(sorted(ep.name for ep in entry_points(group="soakd.workloads")))


class ConfigError(ValueError):
    """A configuration problem; ``str(err)`` is one line naming the key path."""


def _is_auto(value: Any) -> bool:
    """``run.duration = "auto"`` (any case, spaces around)."""
    return isinstance(value, str) and value.strip().lower() == "auto"


# Label names that soakd's own Prometheus series already carry: a run label may not shadow one
RESERVED_LABELS = frozenset(
    {"run", "config", "gpu", "uuid", "stage", "criterion", "status", "kind", "stream", "job",
     "instance", "le", "quantile", "name", "workload", "hostname", "verdict", "unit",
     "UUID", "modelName"}
)  # fmt: skip


def _check_gpus(v: Any) -> Any:
    """``run.gpus``: "auto" or CUDA ordinals, each once (whether they exist is checked when
    the run starts, on the host that runs it)."""
    if v is None or v == "auto":
        return v
    if isinstance(v, str) or not isinstance(v, list | tuple) or not v:
        raise ValueError(f'must be "auto" or a list of CUDA ordinals such as [0, 1], got {v!r}')
    if any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in v):
        raise ValueError(f"CUDA ordinals are whole numbers >= 0, got {list(v)!r}")
    if len(set(v)) != len(v):
        raise ValueError(f"each GPU once, got {list(v)!r}")
    return tuple(v)


# "auto" (every GPU this process sees) | CUDA ordinals | None (where the workload runs)
Gpus = Annotated[Literal["auto"] | tuple[int, ...] | None, BeforeValidator(_check_gpus)]


def _check_labels(v: Any) -> dict[str, str]:
    """``[run.labels]``: names as Prometheus allows them (so they can be exported), values
    strings (numbers are written as text: ``fps = 2`` is the label ``"2"``)."""
    if not isinstance(v, Mapping):
        raise ValueError("must be a table of name = value")
    out: dict[str, str] = {}
    for k, val in v.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", str(k)) or str(k).startswith("__"):
            raise ValueError(f"label name {k!r}: letters, digits and _ only, not starting a digit")
        if str(k) in RESERVED_LABELS:
            raise ValueError(f"label name {k!r} is reserved (soakd's own metric label)")
        if isinstance(val, bool) or not isinstance(val, str | int | float):
            raise ValueError(f"label {k!r}: value must be a string or a number, got {val!r}")
        if len(str(val)) > 200:
            raise ValueError(f"label {k!r}: value longer than 200 characters")
        out[str(k)] = f"{val:g}" if isinstance(val, float) else str(val)
    return out


Labels = Annotated[dict[str, str], BeforeValidator(_check_labels)]


def _check_name(v: str | None) -> str | None:
    """``run.name``: printable text (a NUL, an ANSI escape or a newline would be printed by
    `soakd runs` and `show` as it is: a garbled terminal, a forged line)."""
    bad = next((c for c in v or "" if not c.isprintable()), None)
    if bad is not None:
        raise ValueError(f"must be printable text, got {bad!r} in {v!r}")
    return v


RunName = Annotated[str | None, AfterValidator(_check_name)]


class RunSettings(_Section):
    """``[run]``: pacing, queue, sampling and where the run database lives."""

    name: RunName = None  # a name stored with the run (printable text)
    # what the run belongs to (release = "1.4.0", cell = "..."): stored, shown, exported to
    # Prometheus, filtered on by `runs --label` and judged together by `gate --label`
    labels: Labels = Field(default_factory=dict)
    fps: float = Field(2.0, gt=0, le=1000)
    # paced sources feeding the one workload, each at ``fps`` (N copies of [source])
    streams: int = Field(1, ge=1, le=MAX_STREAMS)
    duration: Duration = Field(60.0, gt=0)
    warmup_s: Duration = Field(5.0, ge=0)
    max_queue: int = Field(1, ge=1, le=4096)
    consume: Literal["newest", "oldest"] = "newest"
    max_age_ms: float | None = Field(None, gt=0)
    sample_interval_ms: float = Field(150.0, ge=50, le=1000)
    gpus: Gpus = None  # the GPUs sampled apart (gpu_samples): "auto" | [0, 1] | the workload's
    db: str | None = None  # default: $STATE_DIRECTORY/soakd.db under systemd, else ./soakd.db
    log_every: int = Field(1, ge=0)  # one per-frame log line every N frames (0 = none)
    stall_timeout_s: Duration = Field(60.0, gt=0)  # no frame finishing for this long = stall
    on_oom: Literal["continue", "stop"] = "continue"
    # end the run as FAIL as soon as a criterion can no longer pass (errors past their
    # budget, an OOM, drops past the limit on the planned run, a memory floor rising at the
    # alpha spent so far); `soakd plan run` sets it unless the config says otherwise
    stop_on_fail: bool = False
    # duration = "auto": run until every criterion is decided, at most max_duration (stored
    # as duration = max_duration and auto_duration = true; stop_on_fail on unless set)
    auto_duration: bool = False
    max_duration: Duration = Field(3600.0, gt=0)
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _auto_duration(cls, data: Any) -> Any:
        """``duration = "auto"``: the planned length is ``max_duration``, the run ends once
        decided (soakd/run/auto_duration.py)."""
        if not (isinstance(data, dict) and _is_auto(data.get("duration"))):
            return data
        out = {
            **data,
            "duration": _planned(data.get("max_duration", 3600.0)),
            "auto_duration": True,
        }
        out.setdefault("stop_on_fail", True)
        return out


def _planned(max_duration: Any) -> float:
    """An auto run's planned length: ``max_duration`` when it is a usable duration, else the
    default (``max_duration``'s own check then names the bad value as run.max_duration, not
    as run.duration, which the user did not set to it)."""
    try:
        seconds = parse_duration(max_duration)
    except ValueError:
        return 3600.0
    return seconds if 0 < seconds <= MAX_DURATION_S else 3600.0


class SourceSettings(_Section):
    """``[source]``: where frames come from."""

    kind: Literal["synthetic", "video", "camera", "stream", "images"] = "synthetic"
    width: int = Field(320, ge=8, le=16384)  # synthetic size; resize target when resize=true
    height: int = Field(240, ge=8, le=16384)
    resize: bool = False  # resize captured frames to width x height
    path: str | None = None  # video file or image folder
    index: int = Field(0, ge=0)  # camera index
    url: str | None = None  # rtsp:// or http(s):// stream
    loop: bool = True  # loop a video file / image folder at its end
    pattern: Literal["bars", "noise", "gradient"] = "bars"  # synthetic pattern
    # synthetic only: deliver at most this many frames a second, like a camera slower than
    # the run's rate (a planted slow source); 0 = as fast as the pacer asks
    max_fps: float = Field(0.0, ge=0)
    open_timeout_s: Duration = Field(10.0, gt=0)
    read_timeout_s: Duration = Field(5.0, gt=0)  # a grab slower than this = source stalled

    @model_validator(mode="after")
    def _needs(self) -> SourceSettings:
        if self.kind in ("video", "images") and not self.path:
            raise ValueError(f"path: required when kind = {self.kind!r}")
        if self.kind == "stream" and not self.url:
            raise ValueError("url: required when kind = 'stream'")
        return self


class AudioSettings(_Section):
    """``[audio]``: an audio stream beside the frames (audio-visual workloads)."""

    kind: Literal["none", "tone", "noise", "wav"] = "none"
    sample_rate: int = Field(16000, ge=8000, le=192000)
    freq_hz: float = Field(440.0, gt=0)
    amplitude: float = Field(0.3, gt=0, le=1)
    path: str | None = None
    loop: bool = True

    @model_validator(mode="after")
    def _needs(self) -> AudioSettings:
        if self.kind == "wav" and not self.path:
            raise ValueError("path: required when kind = 'wav'")
        return self


# ---------------------------------------------------------------------------------------
# ``[workload]``: each kind's settings live beside its code (soakd/workloads/); a new kind
# is one member of this union (and its builder's line in soakd/workloads/registry.py)

WorkloadSettings = (
    SyntheticWorkload
    | TinyVlmWorkload
    | HfWorkload
    | SessionWorkloadSettings
    | GeneratorWorkloadSettings
    | AvWorkloadSettings
    | MatrixGameWorkloadSettings
    | OpenAIWorkloadSettings
    | RealtimeWorkloadSettings
    | PythonWorkload
    | PluginWorkload
)
#: the built-in kinds by name, in the union's order (a plugin's kind is any other name)
BUILTIN_WORKLOADS: dict[str, type[_Section]] = {
    m.model_fields["kind"].default: m for m in get_args(WorkloadSettings) if m is not PluginWorkload
}
#: the workload kinds whose calling convention takes one stream only (``run.streams = 1``)
SINGLE_STREAM_KINDS: tuple[str, ...] = tuple(
    k for k, m in BUILTIN_WORKLOADS.items() if getattr(m, "single_stream", False)
)
#: the workload kinds that drive a model behind a network endpoint: its server's process and
#: metrics are sampled and judged too (telemetry/server.py, analysis/server.py)
SERVED_KINDS: tuple[str, ...] = tuple(
    k for k, m in BUILTIN_WORKLOADS.items() if getattr(m, "served", False)
)


# ---------------------------------------------------------------------------------------
# Thresholds: ``criteria.thresholds``, k6-style ``STAT(COLUMN) OP NUMBER`` (docs/verdict.md)

#: frame columns a threshold may name (RunData's timing columns, milliseconds / frames)
THRESHOLD_FRAME_COLUMNS: tuple[str, ...] = (
    *STAGE_COLUMNS,
    "frame_age_ms",
    "queue_len",
    "first_emit_ms",
    "output_latency_ms",
)
#: telemetry sample columns a threshold may name (RunData's samples)
THRESHOLD_SAMPLE_COLUMNS: tuple[str, ...] = SAMPLE_METRICS
#: what ``rate(...)`` counts, each as a fraction of the frames captured after the warm-up
THRESHOLD_RATE_COLUMNS: tuple[str, ...] = ("drops", "stale", "errors")
THRESHOLD_STATS: tuple[str, ...] = ("avg", "mean", "med", "min", "max", "count", "rate")
THRESHOLD_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}
_THRESHOLD_RE = re.compile(r"^\s*(\w[\w.]*)\s*\(\s*(\w*)\s*\)\s*([<>=!]*)\s*(.*?)\s*$")
_PERCENTILE_RE = re.compile(r"^p(\d{1,2}(?:\.\d)?)$")


@dataclass(frozen=True, slots=True)
class Threshold:
    """One parsed threshold: ``stat(column) op limit``; ``q`` is the percentile of a pNN
    stat (None otherwise); ``source`` is "frames", "samples" or "rate"."""

    expr: str
    stat: str
    column: str
    op: str
    limit: float
    limit_text: str
    q: float | None
    source: str
    abort_on_fail: bool = False

    @property
    def id(self) -> str:
        """The criterion id: ``threshold:p95(total_ms)<80``."""
        return f"threshold:{self.stat}({self.column}){self.op}{self.limit_text}"

    @property
    def text(self) -> str:
        return f"{self.stat}({self.column}) {self.op} {self.limit_text}"

    def holds(self, value: float) -> bool:
        return THRESHOLD_OPS[self.op](value, self.limit)


def _threshold_column(stat: str, column: str) -> str:
    """The source of ``column`` ("frames", "samples", "rate"), or ValueError saying why not."""
    if column in THRESHOLD_RATE_COLUMNS:
        if stat != "rate":
            raise ValueError(f"{column!r} is counted, not measured: use rate({column})")
        return "rate"
    if stat == "rate":
        raise ValueError(f"rate() takes one of {', '.join(THRESHOLD_RATE_COLUMNS)}, got {column!r}")
    if column in THRESHOLD_FRAME_COLUMNS:
        return "frames"
    if column in THRESHOLD_SAMPLE_COLUMNS:
        return "samples"
    known = (*THRESHOLD_FRAME_COLUMNS, *THRESHOLD_SAMPLE_COLUMNS, *THRESHOLD_RATE_COLUMNS)
    close = difflib.get_close_matches(column, known, n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(close)}?)" if close else f" (known: {', '.join(known)})"
    raise ValueError(f"unknown column {column!r}{hint}")


def _threshold_stat(stat: str) -> float | None:
    """The percentile of a pNN / pNN.N stat, None for the others; ValueError if unknown."""
    m = _PERCENTILE_RE.match(stat)
    if m and 0 < float(m.group(1)) < 100:
        return float(m.group(1))
    if stat not in THRESHOLD_STATS:
        raise ValueError(
            f"unknown statistic {stat!r} (use p50..p99.9, {', '.join(THRESHOLD_STATS)})"
        )
    return None


def parse_threshold(expr: str, abort_on_fail: bool = False) -> Threshold:
    """``"p95(total_ms) < 80"`` -> Threshold; ValueError naming the expression and why."""
    try:
        m = _THRESHOLD_RE.match(expr)
        if not m:
            raise ValueError("expected STAT(COLUMN) OP NUMBER, e.g. 'p95(total_ms) < 80'")
        stat, column, op, number = m.groups()
        stat = stat.lower()
        q = _threshold_stat(stat)
        source = _threshold_column(stat, column)
        if op not in THRESHOLD_OPS:
            raise ValueError(f"bad operator {op or '(none)'!r} (use <, <=, > or >=)")
        try:
            limit = float(number)
        except ValueError:
            raise ValueError(f"expected a number after {op!r}, got {number!r}") from None
        if not math.isfinite(limit):
            raise ValueError(f"the limit must be a finite number, got {number!r}")
    except ValueError as exc:
        raise ValueError(f"{expr!r}: {exc}") from None
    return Threshold(expr, stat, column, op, limit, number, q, source, abort_on_fail)


def _threshold_item(v: Any) -> Any:
    if isinstance(v, str):
        return {"expr": v}
    if not isinstance(v, Mapping | BaseModel):
        raise ValueError(
            f"expected 'STAT(COLUMN) OP NUMBER' or {{expr = ..., abort_on_fail = ...}}, got {v!r}"
        )
    return v


class ThresholdSettings(_Section):
    """One ``criteria.thresholds`` item: ``"p95(total_ms) < 80"`` or
    ``{expr = "...", abort_on_fail = true}``."""

    expr: str
    abort_on_fail: bool = False  # end the run early once the threshold can no longer pass

    @field_validator("expr")
    @classmethod
    def _parses(cls, v: str) -> str:
        parse_threshold(v)
        return v

    def parsed(self) -> Threshold:
        return parse_threshold(self.expr, self.abort_on_fail)


class CriteriaSettings(_Section):
    """``[criteria]``: the pass criteria (see docs/verdict.md for each default and why)."""

    min_duration_s: Duration = Field(60.0, ge=0)
    min_frames: int = Field(10, ge=1)
    max_drop_fraction: float = Field(0.05, ge=0, le=1)
    max_age_slope_ms_per_min: float = Field(50.0, ge=0)
    max_age_p95_ms: float | None = Field(None, gt=0)
    max_memory_growth_mb_per_min: float = Field(1.5, ge=0)  # 2.1 GB/day (docs/verdict.md)
    floor_window_s: Duration = Field(4.0, gt=0)
    # how long the model must run between restarts: memory_headroom and stage_trend
    # project the measured growth over it (a duration: "168h", 604800)
    horizon: Duration = Field(7 * 86_400.0, gt=0)
    # memory_headroom's horizon in hours when it must differ from ``horizon`` (its older
    # name); None: ``horizon``
    min_headroom_hours: float | None = Field(None, ge=0)
    # stage_trend: a stage's window floors or medians may not rise faster than this
    max_stage_slope_ms_per_min: float = Field(5.0, ge=0)
    jitter_k: float | Literal["history"] = 5.0
    # "count": fail when more frames than allowed exceed k x median, "max": the max alone
    jitter_rule: Literal["count", "max"] = "count"
    jitter_max_exceed: int = Field(2, ge=0)  # frames over k x median allowed ("count") ...
    jitter_max_exceed_fraction: float = Field(0.001, ge=0, le=1)  # ... or this share, if more
    jitter_history_min_runs: int = Field(3, ge=1)
    # a spike must also be longer than this (ms; 0 = off): sub-millisecond stages
    jitter_min_ms: float = Field(0.0, ge=0)
    # other processes holding this share (%) of the host's CPUs make a tick contended: a
    # jitter or drops FAIL only contended frames make is INVALID (docs/verdict.md, host
    # contention); 100: off, every frame is the model's
    contended_cpu_pct: float = Field(75.0, gt=0, le=100)
    max_errors: int = Field(0, ge=0)
    # generators: the playback rate the generated frames must sustain (output interval p95
    # <= 1000 / content_fps) and the longest wait for the first output; None: not judged
    content_fps: float | None = Field(None, gt=0, le=1000)
    max_first_output_ms: float | None = Field(None, gt=0)
    # what content_fps and a generator's jitter judge: "presentation", the waits between
    # frames as they become visible (a chunk's frames out at once: one wait, the chunk gap);
    # "per_frame", the gap spread over the chunk's frames (what a player that buffers sees)
    generator_interval: Literal["presentation", "per_frame"] = "presentation"
    # served models (server_queue): the server's waiting requests may not rise faster than
    # this many a minute, its KV-cache use (0-1) not faster than this share a minute
    max_server_queue_slope_per_min: float = Field(1.0, ge=0)
    max_kv_cache_slope_per_min: float = Field(0.01, ge=0, le=1)
    # realtime sessions with audio out (audio_playback): the answered turns' real-time
    # factor (audio seconds received per wall second) may not fall under this at their p5,
    # and they may have at most this many underruns in all (a chunk that came after the
    # audio buffered before it had played out: a stutter a listener hears)
    min_audio_rtf: float = Field(1.0, ge=0)
    max_audio_underruns: int = Field(0, ge=0)
    alpha: float = Field(0.01, gt=0, lt=0.5)  # significance level of the trend tests
    # k6-style "STAT(COLUMN) OP NUMBER" checks, each its own criterion (docs/verdict.md)
    thresholds: tuple[Annotated[ThresholdSettings, BeforeValidator(_threshold_item)], ...] = ()

    @field_validator("jitter_k")
    @classmethod
    def _k(cls, v: float | str) -> float | str:
        if isinstance(v, int | float) and v < 1:
            raise ValueError(f"must be >= 1 or 'history', got {v}")
        return v


#: the server gauges and counters soakd stores when the server exports them (vLLM, SGLang)
SERVER_METRIC_PRESETS: dict[str, tuple[str, ...]] = {
    "vllm": (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",  # its name before vLLM's V1 engine
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
    ),
    "sglang": ("sglang:token_usage", "sglang:num_queue_reqs", "sglang:num_running_reqs"),
}
#: what ``server_queue`` judges: the server's waiting requests, and its KV-cache use (0-1)
SERVER_WAITING_METRICS: tuple[str, ...] = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
SERVER_KV_METRICS: tuple[str, ...] = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
)


def _check_metric_name(v: str) -> str:
    if not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", v):
        raise ValueError(f"not a Prometheus metric name: {v!r}")
    return v


class TelemetrySettings(_Section):
    """``[telemetry]``: what is sampled besides soakd's own process and GPUs: the model
    server's processes and its Prometheus metrics (``kind = "openai"`` workloads)."""

    # the server's process (with its children): by pid, by systemd unit (its cgroup), or
    # "auto": the process listening on the endpoint's port on this host; "off": a remote
    # server, whose memory is then not judged (memory_server_rss is n/a, and says why)
    server_pid: int | None = Field(None, ge=1)
    server_unit: str | None = None
    server_process: Literal["auto", "off"] = "auto"
    # the server's Prometheus endpoint; None: <scheme://host:port>/metrics when it answers
    # at setup; "off": not scraped
    server_metrics_url: str | None = None
    # how often it is scraped (at most once a tick; 0: every tick): its parse is the largest
    # part of a served run's own CPU at 150 ms ticks, and queue gauges change slower
    server_metrics_every_s: Duration = Field(1.0, ge=0, le=60)
    # the gauges and counters stored from it (server_metrics table), when it exports them
    server_metrics: tuple[Annotated[str, AfterValidator(_check_metric_name)], ...] = tuple(
        name for names in SERVER_METRIC_PRESETS.values() for name in names
    )

    @field_validator("server_unit")
    @classmethod
    def _unit(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[\w@:.\\-]+", v):
            raise ValueError(f"not a systemd unit name: {v!r}")
        return v

    @field_validator("server_metrics_url")
    @classmethod
    def _metrics_url(cls, v: str | None) -> str | None:
        if v is None or v == "off":
            return v
        return _check_base_url(v)


class ServiceSettings(_Section):
    """``[service]``: systemd notification and the Prometheus exporter."""

    metrics_addr: str | None = None  # e.g. "127.0.0.1:9464"; off by default
    # keep serving the final metrics (status, verdict per criterion) this long after the run
    # ends, so that Prometheus scrapes them once before the process exits
    metrics_linger_s: Duration = Field(0.0, ge=0, le=300)
    notify: bool = True  # talk sd_notify when $NOTIFY_SOCKET is set


class Settings(_Section):
    run: RunSettings = RunSettings()
    source: SourceSettings = SourceSettings()
    audio: AudioSettings = AudioSettings()
    workload: WorkloadSettings = Field(default_factory=lambda: TinyVlmWorkload())
    criteria: CriteriaSettings = CriteriaSettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    service: ServiceSettings = ServiceSettings()

    @model_validator(mode="before")
    @classmethod
    def _concurrency_is_streams(cls, data: Any) -> Any:
        """``workload.concurrency = N`` (openai): N requests in flight, one per stream, so
        it sets ``run.streams`` (left at 1), or must agree with it."""
        if not isinstance(data, Mapping):
            return data
        wl, run = data.get("workload"), data.get("run")
        n = wl.get("concurrency") if isinstance(wl, Mapping) else None
        if not isinstance(n, int) or isinstance(n, bool) or not isinstance(run, Mapping | None):
            return data
        if not 1 <= n <= MAX_STREAMS:
            return data  # workload.concurrency's own bounds refuse it, naming it
        streams = (run or {}).get("streams", 1)
        if streams in (1, n):
            return {**data, "run": {**(run or {}), "streams": n}}
        raise ValueError(
            f"workload.concurrency: {n} requests in flight need run.streams = {n} (one per "
            f"stream), got run.streams = {streams}: set one of them"
        )

    @field_validator("workload", mode="wrap")
    @classmethod
    def _pick_workload(cls, v: Any, handler: Any) -> Any:
        if isinstance(v, BaseModel):
            return v
        if not isinstance(v, Mapping):
            raise ValueError("must be a table")
        kind = v.get("kind", "tiny-vlm")
        if not isinstance(kind, str):
            raise ValueError(f"kind: must be a workload name such as 'synthetic', got {kind!r}")
        model = BUILTIN_WORKLOADS.get(kind)
        if model is None:
            if kind not in entry_point_names():
                known = ", ".join([*BUILTIN_WORKLOADS, *entry_point_names()])
                raise ValueError(f"kind: unknown workload {kind!r} (known: {known})")
            model = PluginWorkload
        return model.model_validate(dict(v))

    @model_validator(mode="after")
    def _streams_shape(self) -> Settings:
        """Several streams need a staged workload: a session or generator model keeps one
        stream's state between frames (a python or plugin workload is checked once built)."""
        n, kind = self.run.streams, self.workload.kind
        if n > 1 and kind in SINGLE_STREAM_KINDS:
            raise ValueError(
                f"run.streams: {n} streams need a staged workload (synthetic, tiny-vlm, hf, "
                f"av, openai) or realtime sessions; workload.kind = {kind!r} takes one stream"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def flat(self) -> dict[str, Any]:
        """Dotted keys -> values (``{"run.fps": 2.0, ...}``); see ``flatten``."""
        return flatten(self.to_dict())

    def with_value(self, path: str, value: Any) -> Settings:
        """A validated copy with the dotted key ``path`` set to ``value``, exactly as
        ``--set path=value`` sets it (a new workload ``kind`` replaces the table);
        ``ConfigError`` with the one-line message naming the key path when refused."""
        keys = _key_path(path)
        if keys is None:
            raise ConfigError(f"{path}: expected section.key")
        return _validate(_merge_value(self.to_dict(), keys, value))

    def config_hash(self) -> str:
        """A hash of everything that changes what is measured: all sections but the run's
        name, labels, duration and db, the criteria, telemetry and service settings. Runs
        with the same hash are comparable (``jitter_k = "history"`` draws on them). One
        stream hashes as it did before ``run.streams`` existed."""
        d = self.to_dict()
        for k in ("name", "duration", "db", "log_every", "labels"):
            d["run"].pop(k, None)
        if d["run"].get("streams") == 1:
            d["run"].pop("streams")
        if d["run"].get("gpus", 0) is None:
            d["run"].pop("gpus")
        d.pop("service", None)
        d.pop("criteria", None)
        d.pop("telemetry", None)  # what else is sampled, not what is measured
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def resolved_db(self) -> Path:
        if self.run.db:
            return Path(self.run.db).expanduser()
        state = os.environ.get("STATE_DIRECTORY")
        if state:
            return Path(state.split(":")[0]) / "soakd.db"
        return Path("soakd.db")


# ---------------------------------------------------------------------------------------
# Loading and merging


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> {"dotted.key": leaf}. Empty tables are kept as leaves."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def default_toml_text() -> str:
    return resources.files("soakd").joinpath("default.toml").read_text(encoding="utf-8")


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            # a workload of another kind replaces the table instead of merging into it
            if k == "workload" and "kind" in v and v["kind"] != out[k].get("kind"):
                out[k] = dict(v)
            else:
                out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


#: how deep tables and arrays may nest in a config file, a plan file or a --set value: no
#: setting nests past 4; a value nested deeper is refused as such (one line), never a
#: RecursionError (exit 4) in the TOML parser or in the checks after it
MAX_TOML_DEPTH = 32


def read_toml(text: str) -> dict[str, Any]:
    """``tomllib.loads`` for soakd's own inputs: a TOML document nested past
    ``MAX_TOML_DEPTH`` is a ConfigError saying so. Raises tomllib.TOMLDecodeError as
    ``tomllib.loads`` does."""
    try:
        doc = tomllib.loads(text)
    except RecursionError:
        doc = None
    if doc is None or _depth(doc) > MAX_TOML_DEPTH:
        raise ConfigError(f"nested too deeply (tables and arrays deeper than {MAX_TOML_DEPTH})")
    return doc


def _depth(value: Any) -> int:
    """How deep tables and arrays nest in ``value`` (a scalar: 0), without recursion."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d + 1)
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_set(expr: str) -> tuple[list[str], Any]:
    """``section.key=value`` -> (["section", "key"], value). The value is read as a TOML
    value when it parses as one (numbers, booleans, quoted strings, arrays), else taken as a
    bare string."""
    if "=" not in expr:
        raise ConfigError(f"--set {expr}: expected section.key=value")
    key, raw = expr.split("=", 1)
    path = _key_path(key)
    if path is None:
        raise ConfigError(f"--set {expr}: expected section.key=value")
    try:
        value = read_toml(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    except ConfigError as exc:
        raise ConfigError(f"--set {key.strip()}: {exc}") from None
    return path, value


def _key_path(key: str) -> list[str] | None:
    """``"section.key"`` -> ``["section", "key"]``; None unless at least two parts."""
    path = [p for p in key.strip().split(".") if p]
    return path if len(path) >= 2 else None


def _set_path(d: dict[str, Any], path: list[str], value: Any) -> None:
    cur = d
    for p in path[:-1]:
        nxt = cur.get(p)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[p] = nxt
        cur = nxt
    cur[path[-1]] = value


def _merge_value(data: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    """``data`` with the key at ``path`` set to ``value``, merged like ``--set``."""
    nested: dict[str, Any] = {}
    _set_path(nested, path, value)
    return _deep_merge(data, nested)


_PHRASES = (
    (r"^Input should be greater than or equal to ", "must be >= "),
    (r"^Input should be greater than ", "must be > "),
    (r"^Input should be less than or equal to ", "must be <= "),
    (r"^Input should be less than ", "must be < "),
    (r"^Input should be ", "must be "),
)


# a union member's tag in an error's location: float | Literal["history"] -> "float", ...
_UNION_TAG = re.compile(r"float|int|str|bool|none|literal\[.*\]")


def _key_loc(e: ErrorDetails) -> list[str]:
    """An error's location as key path parts, without pydantic's union/tag parts
    ("function-wrap[...]", model names, union members such as "float")."""
    loc = [str(p) for p in e["loc"]]
    return [
        p
        for p in loc
        if not p.startswith("function-") and not p[:1].isupper() and not _UNION_TAG.fullmatch(p)
    ]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (through unions, Annotated, containers)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


@cache
def known_keys(model: type[BaseModel] | None = None, prefix: str = "") -> frozenset[str]:
    """Every dotted key a config can set (every workload kind's keys under ``workload``)."""
    keys: set[str] = set()
    for name, field in (model or Settings).model_fields.items():
        keys.add(prefix + name)
        for sub in _models_in(field.annotation):
            keys |= known_keys(sub, f"{prefix}{name}.")
    return frozenset(keys)


def _did_you_mean(path: str) -> str:
    """`` (did you mean run.fps?)`` for an unknown key close to a known one in its section;
    for a key another kind of the section has (``workload.dtype`` on a synthetic workload),
    the kinds that have it."""
    if path in known_keys():
        kinds = _kinds_with(path)
        top = path.partition(".")[0]
        return f" (a key of {top} kinds {', '.join(kinds)}; not of this one)" if kinds else ""
    section = path.rpartition(".")[0]
    same = [k for k in known_keys() if k.rpartition(".")[0] == section]
    near = difflib.get_close_matches(path, same, n=1, cutoff=0.75)
    return f" (did you mean {near[0]}?)" if near else ""


def _kinds_with(path: str) -> list[str]:
    """The ``kind`` of each model of the section that has the key (workload kinds)."""
    top, _, rest = path.partition(".")
    field = Settings.model_fields.get(top)
    if field is None or "." in rest:
        return []
    return sorted(
        str(m.model_fields["kind"].default)
        for m in _models_in(field.annotation)
        if rest in m.model_fields and "kind" in m.model_fields
    )


def _format_error(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = _key_loc(e)
    msg = e["msg"]
    msg = re.sub(r"^(Value error|Assertion failed), ", "", msg)
    # nested "key: message" raised by our own validators
    m = re.match(r"^([\w.]+): (.*)$", msg)
    if m and e["type"] == "value_error":
        loc.append(m.group(1))
        msg = m.group(2)
    for pat, rep in _PHRASES:
        msg = re.sub(pat, rep, msg)
    if e["type"] == "extra_forbidden":
        msg = "unknown key" + _did_you_mean(".".join(loc))
    elif e["type"] == "missing":
        msg = "required key is missing"
    elif "input" in e and e["type"] not in ("value_error",) and not isinstance(e["input"], dict):
        msg = f"{msg[:1].lower()}{msg[1:]}, got {e['input']!r}"
    path = ".".join(loc) or "config"
    # the members of one union failing on one key are one problem
    more = len({tuple(_key_loc(x)) for x in err.errors()} - {tuple(_key_loc(e))})
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{path}: {msg}{suffix}"


def load_settings(
    path: str | Path | None = None,
    *,
    overrides: Iterable[str] = (),
    flags: Mapping[str, Any] | None = None,
) -> Settings:
    """Merge defaults < file < ``--set`` overrides < flags and validate.

    ``flags`` maps dotted paths to values (``{"run.fps": 2}``); None values are ignored.
    """
    data: dict[str, Any] = tomllib.loads(default_toml_text())
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: config file not found")
        try:
            file_data = read_toml(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: not valid TOML: {exc}") from None
        except ConfigError as exc:
            raise ConfigError(f"{p}: {exc}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{p}: not a UTF-8 text file") from None
        data = _deep_merge(data, file_data)
    for expr in overrides:
        keys, value = parse_set(expr)
        data = _merge_value(data, keys, value)
    for dotted, value in (flags or {}).items():
        if value is not None:
            data = _merge_value(data, dotted.split("."), value)
    return _validate(data)


def _validate(data: dict[str, Any]) -> Settings:
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc)) from None
