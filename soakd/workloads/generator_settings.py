"""``[workload]`` of ``kind = "generator"`` (the workload: generator.py)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field

from soakd.records import STAGE_NAME
from soakd.sections import Device, Duration, FactoryRef, _Section


def _check_stage_name(v: str) -> str:
    if not STAGE_NAME.fullmatch(v):
        raise ValueError(f"must be a stage name of [a-z0-9_] characters, got {v!r}")
    return v


class GeneratorWorkloadSettings(_Section):
    """A streaming frame generator (Matrix-Game style)."""

    kind: Literal["generator"] = "generator"
    #: one stream only: the model keeps one stream's state between frames (run.streams = 1)
    single_stream: ClassVar[bool] = True
    factory: FactoryRef | None = None  # "pkg.mod:fn" for a real pipeline; None: built-in tiny one
    options: dict[str, Any] = Field(default_factory=dict)  # passed to the factory
    width: int = Field(64, ge=8, le=8192)
    height: int = Field(64, ge=8, le=8192)
    num_inference_steps: int = Field(4, ge=1, le=1000)
    frames_per_chunk: int = Field(4, ge=1, le=1024)
    chunks_per_request: int = Field(2, ge=1, le=1024)
    channels: int = Field(16, ge=1, le=1024)
    device: Device = "cpu"
    seed: int = 0
    response_timeout_s: Duration = Field(30.0, gt=0)  # a request not returning = hung
    # "rollout": one long session per run, a chunk per paced condition (Matrix-Game's shape);
    # "request": one request per paced frame (chunks_per_request chunks each)
    mode: Literal["rollout", "request"] = "rollout"
    # rollout: each chunk's action / camera pose: "synthetic" (a fixed WASD + mouse path),
    # "none", or a JSON-lines file of objects, one per chunk, cycled
    conditions: str = "synthetic"
    context_chunks: int = Field(2, ge=0, le=64)  # rollout: chunks in the rolling KV window
    # a planted fault (tests, demos): an extra named stage of slow_stage_ms per chunk, longer
    # by slow_stage_growth_ms at each chunk (a stage that grows)
    slow_stage: Annotated[str, AfterValidator(_check_stage_name)] | None = None
    slow_stage_ms: float = Field(0.0, ge=0, le=60_000)
    slow_stage_growth_ms: float = Field(0.0, ge=0, le=1000)
