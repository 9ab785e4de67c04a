"""Stand-in of ``examples/wanvideo/pipeline/mosaic/causal_inference.py``."""

from __future__ import annotations

from .causal_rollout import (  # noqa: F401  (the names upstream imports here)
    _normalize_causal_validation_memory_mode,
    _run_causal_kv_rollout,
    _validation_memory_mode_uses_online_depth,
    _validation_memory_mode_uses_runtime_pool,
)
from .cleanup import _rank_local_cuda_device  # noqa: F401
from .video_io import _get_frustum_handler_cls, _init_registration_estimator  # noqa: F401


def _build_handler(data, args, *, height, width, latent_h, latent_w, estimator):
    """Mirrors ``_build_handler``: a fresh FrustumHandler (the memory bank)."""
    handler_cls = _get_frustum_handler_cls()
    return handler_cls(
        data["clean_latent_indices_prope_intrinsic"][-1].cpu().numpy(),
        image_size=(int(height), int(width)),
        grid_size=(int(latent_h), int(latent_w)),
        depth_estimator=estimator,
        is_c2w=False,
        use_gpu=True,
        init_extrinsic=data["clean_latent_indices_prope_extrinsic"][-1:].cpu().numpy(),
    )
