"""The workload protocols: the only thing soakd needs to know about a model.

Three shapes cover the systems soakd exists for (see docs/workloads.md):

* ``StagedWorkload`` (any HF VLM, audio-visual Q&A): soakd calls ``preprocess``,
  ``infer`` and ``decode`` in turn and times each; on CUDA each stage ends after
  ``sync()``.
* ``SessionWorkload`` (MOSS-VL-Realtime ``create_realtime_session``): soakd pushes paced
  frames and polls outputs; stages the model hides are stored as NULL, never invented.
* ``GeneratorWorkload`` (Matrix-Game style frame generation): one request per tick, frames
  come back through an ``emit`` callback, singly or in chunks.
* ``RolloutWorkload`` (Matrix-Game's causal KV rollout): one long session per run; the
  workload pulls a ``Condition`` per chunk from a ``RolloutRun``, times named stages
  through ``run.stage(name)`` and reports frames through ``run.emit(n)``.

A workload is built by a factory from the validated ``[workload]`` settings and a
``WorkloadContext``. ``setup`` loads the model (and may call ``ctx.extend_timeout`` while
loading, which systemd turns into ``EXTEND_TIMEOUT_USEC``); ``describe`` returns every
setting that changes timing so it is stored with the run.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from soakd.records import Frame, StageOutput


class WorkloadError(Exception):
    """Raised at build or setup time for a problem the user can fix (bad path, missing
    trust_remote_code, unimportable factory...). The message is one line naming it."""


class RunAbort(Exception):
    """Raised by a workload's stage when the run cannot go on (a served model's server
    unreachable for longer than its budget): the frame is recorded as an error, an event of
    ``event_kind`` says why, and the run ends aborted (INVALID) with the message as reason."""

    def __init__(self, event_kind: str, message: str) -> None:
        super().__init__(message)
        self.event_kind = event_kind


@dataclass(slots=True)
class WorkloadContext:
    """What a workload may use from the harness."""

    seed: int = 0
    width: int = 640  # source frame size, for shape checks and tiny models
    height: int = 480
    fps: float = 1.0
    duration_s: float = 60.0  # run.duration: how long the soak will ask for conditions
    audio_rate: int | None = None  # Hz, when an audio source is configured
    cache_dir: str | None = None  # where built-in tiny models are saved and loaded from
    device: str = "cpu"  # where the settings say the workload runs (telemetry samples it)
    device_map: str | dict[str, Any] | None = None  # or the GPUs a sharded model spans
    extend_timeout: Callable[[float], None] = field(default=lambda seconds: None)
    phase: Callable[[str], None] = field(default=lambda name: None)  # "loading model", ...
    log: Any = None  # a structlog logger bound to the run


@runtime_checkable
class StagedWorkload(Protocol):
    shape: Literal["staged"]

    def setup(self) -> None: ...
    def preprocess(self, frame: Frame) -> Any: ...
    def infer(self, inputs: Any) -> Any: ...
    def decode(self, outputs: Any) -> StageOutput: ...
    def sync(self) -> None: ...  # wait for the device (CUDA synchronize); no-op on CPU
    def describe(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


@dataclass(slots=True)
class PushResult:
    dropped: bool  # the session dropped its oldest pending frame to take this one
    pending: int | None  # frames pending inside the session after the push


@dataclass(slots=True)
class SessionOutput:
    text: str
    kind: Literal["text", "silence", "control"]
    t_ns: int  # monotonic time the output was received by soakd
    # put by the session's own loop, not made by a model step (MOSS-VL-Realtime's
    # <|round_start|> for a question, and the <|silence|> it adds when a question and frames
    # arrive together): counted apart, never an answer to a frame
    inserted: bool = False
    # monotonic time the session put it on its output queue (its own thread), when seen:
    # what decides which pushes and takes it came after (receipt can lag behind a take)
    t_made_ns: int | None = None


@dataclass(slots=True)
class FrameStages:
    """The stages soakd timed for one frame the session model took: ``pre_ms`` the processor
    call that took it, ``infer_ms`` the model step(s) from there to the model's first output
    after it, ``decode_ms`` the detokenisation in those steps (frames taken together share
    them)."""

    frame_id: int
    pre_ms: float
    infer_ms: float
    decode_ms: float


@dataclass(slots=True)
class Consumed:
    """A pushed frame leaving the session's frame queue: taken by the model at ``t_ns``
    (monotonic), or ``dropped`` by the session to make room for a newer frame."""

    frame_id: int
    t_ns: int
    dropped: bool = False


class SessionFailed(Exception):
    """The session's generation thread died, or closing it failed; the message is one line
    naming the cause. The run ends aborted with it as the reason (never PASS)."""


@runtime_checkable
class SessionWorkload(Protocol):
    """Required methods below; optional ones the session driver uses when present:
    ``consumed() -> list[Consumed] | None`` (frames taken or dropped since the last call, for
    consume latency; None: consumes cannot be seen), ``stages() -> list[FrameStages] | None``
    (the stages of frames answered since the last call; None: stages cannot be seen),
    ``ask(text)`` (push a question) and a ``questions`` attribute (``(at_s, text)`` pairs,
    asked at ``at_s`` s into the run)."""

    shape: Literal["session"]

    def setup(self) -> None: ...
    def start(self) -> None: ...
    def push(self, frame: Frame) -> PushResult: ...
    def poll(self, timeout_s: float) -> list[SessionOutput]: ...
    def describe(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


@dataclass(slots=True)
class GeneratorTimings:
    """What a generator reports for one request, where it knows it (ms, else None)."""

    pre_ms: float | None = None
    infer_ms: float | None = None  # e.g. the denoise steps
    decode_ms: float | None = None  # e.g. the VAE decode
    extra: dict[str, Any] | None = None


# emit(n) is called by the generator each time it hands a chunk of n frames to its
# output; soakd stamps the time and amortises the chunk's interval over its n frames.
EmitFn = Callable[[int], None]


@runtime_checkable
class GeneratorWorkload(Protocol):
    shape: Literal["generator"]

    def setup(self) -> None: ...
    def generate(self, frame: Frame, emit: EmitFn) -> GeneratorTimings: ...
    def describe(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


@dataclass(slots=True, frozen=True)
class Condition:
    """The conditioning for one chunk: the newest paced source frame (its id, capture and
    scheduled times are the chunk's), and the chunk's action/pose from workload.conditions
    (a dict from a JSON-lines file, cycled; or a synthetic one), or None."""

    frame: Frame
    index: int  # 0, 1, 2 ... chunks asked for so far
    action: dict[str, Any] | None


class RolloutRun(Protocol):
    """What soakd hands a rollout: pacing in, timing out."""

    def next_condition(self) -> Condition | None: ...

    # the newest pending condition (older ones are dropped, counted as drops), waiting
    # for the pacer's next tick when none is pending; None when the run is ending: the
    # rollout must then return. Calling it starts a new chunk (and ends the previous one).

    def stage(self, name: str) -> AbstractContextManager[None]: ...

    # times a named stage of the current chunk ("context", "denoise", "kv_write",
    # "vae_decode", "memory_bank", any free-form [a-z0-9_]+ name); the workload's sync()
    # runs at the stage end (CUDA synchronize), so GPU time is not attributed late.
    # A name may repeat inside a chunk: its times add up.

    def emit(self, n: int) -> None: ...

    # n generated frames of the current chunk are out now (may be called more than once
    # per chunk, e.g. per decoded latent frame)


@runtime_checkable
class RolloutWorkload(Protocol):
    shape: Literal["rollout"]

    def setup(self) -> None: ...
    # loop: while (c := run.next_condition()) is not None: ...
    def rollout(self, run: RolloutRun) -> None: ...
    def sync(self) -> None: ...
    def describe(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


Workload = StagedWorkload | SessionWorkload | GeneratorWorkload | RolloutWorkload
