"""Stand-in of ``examples/wanvideo/pipeline/mosaic/causal_config.py``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from distilled_config import DistilledInferenceConfig, profile_runtime_settings


def build_runtime_args(
    config: DistilledInferenceConfig,
    *,
    checkpoint: str | Path,
    dataset_index: str | Path,
    workspace: str | Path,
    wan_dir: str | Path,
    tokenizer_dir: str | Path,
    memory_cache_dir: str | Path,
):
    """Mirrors ``build_runtime_args``: the public config as the pipeline's argument names."""
    profile = profile_runtime_settings(config)
    return SimpleNamespace(
        dataset_index_path=str(dataset_index),
        dataset_base_path=str(workspace),
        camera_params_path=str(Path(workspace) / "scenes"),
        trained_dit=str(checkpoint),
        height=config.height,
        width=config.width,
        latent_window_size=config.latent_window_size,
        num_validation_blocks=config.num_blocks,
        validation_cfg_scale=config.student_cfg_scale,
        validation_negative_prompt=config.negative_prompt,
        validation_seed=config.seed,
        seed=42,
        enable_mosaic=True,
        vae_decode_tiled=True,
        causal_chunk_size=config.chunk_size,
        causal_context_chunks=config.context_chunks,
        causal_validation_memory_mode=config.memory_mode,
        causal_generated_memory_publish_interval=config.memory_publish_interval,
        causal_kv_dynamic_context=config.dynamic_context,
        causal_kv_force_context_original_anchor=profile["force_original_anchor"],
        causal_dmd_denoising_step_list=config.schedule,
        causal_dmd_validation_use_cfg=config.student_cfg_scale > 1.0,
        causal_validation_fixed_initial_anchor=False,
    )
