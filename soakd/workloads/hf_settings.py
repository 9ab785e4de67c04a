"""``[workload]`` of ``kind = "tiny-vlm"`` and ``kind = "hf"`` (the workloads: hf.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from soakd.sections import Device, GenerationSettings, StageTiming


class TinyVlmWorkload(GenerationSettings):
    """The embedded default: a tiny random-weight VLM built offline from a config."""

    kind: Literal["tiny-vlm"] = "tiny-vlm"
    # llava runs without torchvision; qwen2-vl's processor needs torchvision in transformers 5
    arch: Literal["llava", "qwen2-vl"] = "llava"
    seed: int = 0  # weights seed of the tiny model (same seed -> same weights)
    short_side: int = Field(56, ge=14, le=4096)  # input short side fed to the processor
    max_new_tokens: int = Field(8, ge=1, le=4096)
    device: Device = "cpu"
    timing: StageTiming = "sync"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "float32"
    cache_dir: str | None = None  # default: $CACHE_DIRECTORY or ~/.cache/soakd
    torch_threads: int | None = Field(1, ge=1, le=1024)  # 1: no OpenMP contention on a CPU box


class HfWorkload(GenerationSettings):
    """Any local transformers image-text-to-text checkpoint."""

    kind: Literal["hf"] = "hf"
    model_path: str
    device: Device = "cpu"  # cpu | cuda | cuda:N
    timing: StageTiming = "sync"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    attn_implementation: str | None = None  # eager | sdpa | flash_attention_2
    trust_remote_code: bool = False
    short_side: int | None = Field(None, ge=14, le=8192)
    torch_threads: int | None = Field(None, ge=1, le=1024)  # None: torch's default
