"""``[workload]`` of ``kind = "av"`` (the workload: av.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from soakd.sections import Device, GenerationSettings, StageTiming


class AvWorkloadSettings(GenerationSettings):
    """Audio-visual Q&A over a window of recent frames and audio."""

    kind: Literal["av"] = "av"
    model_path: str | None = None  # None: the built-in tiny audio-visual model
    # a transformers class to load model_path with; None: the Qwen2.5-Omni thinker when the
    # config has a thinker_config, else AutoModelForImageTextToText
    model_class: str | None = None
    device: Device = "cpu"
    timing: StageTiming = "sync"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    trust_remote_code: bool = False
    video_fps: float = Field(2.0, gt=0, le=60)
    window_seconds: float = Field(4.0, gt=0, le=600)  # frames = video_fps x window_seconds
    max_frames: int = Field(64, ge=1, le=1024)  # cap on the window's frames
    max_audio_seconds: float = Field(4.0, gt=0, le=600)
    use_audio_in_video: bool = False  # interleave the window's audio with its video in time
    # resize before the processor; None: the source's own size (the processor's min / max
    # pixels decide, as for a real stream)
    short_side: int | None = Field(None, ge=14, le=4096)
    max_new_tokens: int = Field(8, ge=1, le=4096)
    cache_dir: str | None = None  # built-in tiny model: default $CACHE_DIRECTORY or ~/.cache/soakd
