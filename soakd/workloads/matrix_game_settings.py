"""``[workload]`` of ``kind = "matrix_game"`` (the workload: matrix_game.py)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from soakd.sections import Device, Duration, _Section


class MatrixGameWorkloadSettings(_Section):
    """Matrix-Game-3.5's distilled causal rollout, run from a checkout of the authors' code
    (``repo``) with their inputs, as their ``infer_distilled.py`` takes them. The knobs left
    unset keep the value of the authors' YAML ``config``; each one set replaces it there."""

    kind: Literal["matrix_game"] = "matrix_game"
    #: one stream only: the model keeps one stream's state between frames (run.streams = 1)
    single_stream: ClassVar[bool] = True
    repo: str  # a checkout of Riemann-Dynamics/Matrix-Game-3.5
    config: str | None = None  # their YAML; None: <repo>/configs/infer_distilled.yaml
    checkpoint: str  # the distilled first-person .safetensors (their --checkpoint)
    image: str  # the anchor RGB image (--image)
    camera: str  # .npz camera trajectory: extrinsics_c2w (N,4,4) + intrinsics (--camera)
    camera_convention: Literal["c2w", "w2c"] = "c2w"
    prompt: str | None = None  # exactly one of prompt / caption (--prompt / --caption)
    caption: str | None = None  # a segment caption .json
    wan_dir: str | None = None  # None: $WAN... or <repo>/checkpoints/ as their infer.py looks
    tokenizer_dir: str | None = None
    da3_dir: str | None = None  # Depth-Anything-3, for memory modes with online depth
    # the authors' knobs (distilled_config.DistilledInferenceConfig); None: the YAML's value
    schedule: tuple[int, ...] | None = None  # denoising timesteps, e.g. [1000, 667, 333]
    student_cfg_scale: float | None = Field(None, ge=1)
    chunk_size: int | None = Field(None, ge=1)  # latent frames per chunk (4 RGB frames each)
    latent_window_size: int | None = Field(None, ge=1)
    context_chunks: int | None = Field(None, ge=0)  # rolling KV window, in chunks
    num_blocks: int | None = Field(None, ge=1)  # blocks per episode (the rollout's length)
    # RGB frames per episode (one call of their rollout), rounded up to whole blocks; 0: one
    # episode for the whole soak (KV cache and memory bank grow over it); None: num_blocks
    episode_frames: int | None = Field(None, ge=0)
    memory_mode: str | None = None  # c0_plus_generated | c0_only | gt | empty
    height: int | None = Field(None, ge=16)  # resolution (pixels)
    width: int | None = Field(None, ge=16)
    device: Device = "cuda"  # where their pipeline runs (telemetry samples it; sync on CUDA)
    workdir: str | None = None  # their input workspace and memory cache; None: a temp folder
    response_timeout_s: Duration = Field(300.0, gt=0)  # no emit or chunk for this long = stall
    # a stage their first episode never timed (a renamed hook): a warning and a
    # missing_stage event instead of ending setup (exit 2)
    allow_missing_stages: bool = False
