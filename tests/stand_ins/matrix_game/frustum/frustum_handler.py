"""Stand-in of ``frustum/frustum_handler.py``: the memory bank (depth + registration of
frames, queries of registered latents for a chunk's poses).

``MG_STANDIN_MEMORY_SLEEP_MS=N`` (a planted fault) sleeps N ms per registration."""

from __future__ import annotations

import os
import time

import numpy as np
import torch


class FrustumHandler:
    """Mirrors ``FrustumHandler`` (the methods the rollout calls)."""

    def __init__(
        self,
        intrinsic,
        *,
        image_size=None,
        grid_size=(64, 64),
        point_stride=None,
        depth_inf_thresh=None,
        is_c2w=True,
        use_gpu=True,
        depth_estimator=None,
        init_extrinsic=None,
        **kwargs,
    ):
        self.intrinsic = np.asarray(intrinsic, np.float32)
        self.depth_estimator = depth_estimator
        self.extrinsics, self.depths, self._Kpixs = [], [], []
        self.last_extrinsic = np.eye(4, dtype=np.float32)[None]

    def register_source_sequence(
        self,
        device,
        frames,
        *,
        extrinsics=None,
        intrinsics=None,
        depths=None,
        start_index=None,
        overwrite_stride=None,
        force_using_input_extrinics=False,
        cat_to_start=False,
        cache_frames=False,
    ):
        """Mirrors ``register_source_sequence``: estimate depth, register each frame."""
        sleep_ms = float(os.environ.get("MG_STANDIN_MEMORY_SLEEP_MS", "0") or 0)
        if sleep_ms:
            time.sleep(sleep_ms / 1000.0)
        if depths is None and self.depth_estimator is not None:
            depths = self.depth_estimator.inference(frames).numpy()
        for k in range(len(frames)):
            self.extrinsics.append(np.asarray(extrinsics[k], np.float32))
            self.depths.append(depths[k] if depths is not None else None)
            self._Kpixs.append(np.eye(3, dtype=np.float32))
        self.last_extrinsic = np.asarray(extrinsics[-1:], np.float32)

    def align_w2c_trajectory(self, A_w2c, B_w2c=None, eps=1e-8):
        """Mirrors ``align_w2c_trajectory``: A aligned so that A[0] == B."""
        b = self.last_extrinsic[0] if B_w2c is None else np.asarray(B_w2c).reshape(4, 4)
        return np.asarray(A_w2c) @ np.linalg.inv(A_w2c[0]) @ b

    def query_hits_mode_new(
        self,
        device,
        query_extrinsics,
        latents,
        w2c=None,
        depths=None,
        K=None,
        memory_K=None,
        query_K=None,
        **kwargs,
    ):
        """Mirrors ``query_hits_mode_new``: one fused latent per 4 query frames (C,T,H,W)."""
        t = len(query_extrinsics) // 4
        weights = torch.softmax(torch.arange(latents.shape[1], dtype=torch.float32), 0)
        fused = (latents * weights.view(1, -1, 1, 1)).sum(1, keepdim=True)
        return fused.expand(-1, t, -1, -1).contiguous()

    def fuse_candidates(
        self, *, query_extrinsics, candidate_frame_ids, latents, w2c, depths, **kwargs
    ):
        """Mirrors ``fuse_candidates``."""
        return self.query_hits_mode_new(None, query_extrinsics, latents), None
