"""Stand-in of ``distilled_config.py`` (Matrix-Game-3.5): the public distilled config."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import yaml


@dataclass(frozen=True)
class DistilledInferenceConfig:
    """Mirrors ``distilled_config.DistilledInferenceConfig`` (same field names)."""

    profile: str = "standard"
    height: int = 704
    width: int = 1280
    num_blocks: int = 1
    seed: int = 3407
    schedule: tuple[int, ...] = (1000, 667, 333)
    hiar_scales: tuple[float, ...] = ()
    latent_window_size: int = 21
    vae_context_blocks: int = 2
    chunk_size: int = 3
    context_chunks: int = 7
    context_selection: str = "per_3latentframe"
    memory_mode: str = "c0_plus_generated"
    memory_publish_interval: int = 1
    dynamic_context: bool = True
    dynamic_context_selection: str = "oldest"
    nonlocal_memory_context: bool = False
    context_pose_pool_size: int = 5
    student_cfg_scale: float = 3.0
    negative_prompt: str = "static"
    trans_scale: str | float = "logd4"
    mosaic_selection_mode: str = "projection_iou"
    mosaic_candidate_nms_mode: str = "coverage"
    mosaic_candidate_projection_iou_threshold: float = 0.7
    mosaic_candidate_pose_distance_threshold: float = 0.25
    mosaic_candidate_pool_multiplier: float = 2.5
    mosaic_coverage_pool_stride: int = 2
    mosaic_query_reference_frame: int = 4
    mosaic_intrinsics_mode: str = "per_frame"
    mosaic_fuse_mode: str = "fill_stop_zbuffer"
    mosaic_drop_holes: bool = False
    da3_process_res: int = 448
    da3_autocast_dtype: str = "bfloat16"


def validate_inference_config(config: DistilledInferenceConfig) -> None:
    """Mirrors ``distilled_config.validate_inference_config`` (the checks soakd's knobs hit)."""
    s = config.schedule
    if len(s) not in {2, 3, 4} or s[0] != 1000 or any(a <= b for a, b in itertools.pairwise(s)):
        raise ValueError("schedule must contain 2-4 strictly descending steps from 1000")
    if config.num_blocks <= 0:
        raise ValueError("num_blocks must be positive")
    if config.latent_window_size % config.chunk_size:
        raise ValueError("latent_window_size must be divisible by chunk_size")
    if config.student_cfg_scale < 1.0:
        raise ValueError("student_cfg_scale must be >= 1.0")


def load_inference_config(path: str | Path) -> DistilledInferenceConfig:
    """Mirrors ``distilled_config.load_inference_config``: unknown keys fail."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"inference config does not exist: {path}")
    payload = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    unknown = sorted(set(payload) - {f.name for f in fields(DistilledInferenceConfig)})
    if unknown:
        raise ValueError(f"unknown inference config keys: {', '.join(unknown)}")
    if "schedule" in payload:
        payload["schedule"] = tuple(int(v) for v in payload["schedule"])
    config = DistilledInferenceConfig(**payload)
    validate_inference_config(config)
    return config


def config_as_dict(config: DistilledInferenceConfig) -> dict:
    """Mirrors ``distilled_config.config_as_dict``."""
    payload = asdict(config)
    payload["schedule"] = list(config.schedule)
    payload["hiar_scales"] = list(config.hiar_scales)
    return payload


def profile_runtime_settings(config: DistilledInferenceConfig) -> dict:
    """Mirrors ``distilled_config.profile_runtime_settings``."""
    return {
        "prefix_noise_mode": "hiar_sde" if config.profile == "hiar-sde" else "none",
        "noise_dynamic_context": config.profile == "hiar-sde" and config.dynamic_context,
        "force_original_anchor": config.profile == "sink-anchor-context",
    }
