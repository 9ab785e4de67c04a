"""Stand-in of ``examples/wanvideo/pipeline/mosaic/causal_memory.py``: the dynamic
context pool and the per-chunk VAE decode."""

from __future__ import annotations

import numpy as np

from .video_io import _decode_latents_to_numpy_frames, _encode_frames_per_frame


def _decode_generated_chunk_from_prefix_latents(
    pipe,
    prefix_latents,
    *,
    noisy_start,
    noisy_count,
    device,
    tiled=False,
    context_latents=1,
    context="VAE prefix decode",
):
    """Mirrors ``_decode_generated_chunk_from_prefix_latents``: the chunk's 4*noisy_count
    RGB frames, decoded with one latent of context before it."""
    start = 1 + int(noisy_start)
    window = prefix_latents[:, :, max(0, start - int(context_latents)) : start + noisy_count]
    decoded = _decode_latents_to_numpy_frames(pipe, window, device, tiled=tiled)
    local = start - max(0, start - int(context_latents)) - 1
    frames = decoded[1 + 4 * local : 1 + 4 * local + 4 * int(noisy_count)]
    if frames.shape[0] != 4 * int(noisy_count):
        raise RuntimeError(f"{context}: decoded {frames.shape[0]} frames")
    return np.ascontiguousarray(frames)


class _CausalKVDynamicContextPool:
    """Mirrors ``_CausalKVDynamicContextPool``: per-chunk visual context entries."""

    def __init__(self, *, anchor_latent=None, generated_context_publish_interval=1, **kwargs):
        self.initial_entries = []
        self.generated_entries = []
        self.pending_generated_chunk_indices = []
        self.initial_context_count = 0
        self.anchor_position = 0
        self.anchor_camera_frame = 0
        self.anchor_latent = anchor_latent
        self.generated_context_publish_interval = int(generated_context_publish_interval)

    def position_for_noisy_index(self, noisy_index):
        return int(noisy_index)

    def camera_frame_for_noisy_index(self, noisy_index):
        return int(noisy_index)

    def select_for_chunk(
        self,
        chunk_idx,
        target_extrinsics,
        *,
        exclude_positions=None,
        exclude_camera_frames=None,
        max_source_position_exclusive=None,
    ):
        """Mirrors ``select_for_chunk``: the pose-nearest entry of the chunks before."""
        older = [e for e in self.generated_entries if e["chunk_idx"] < int(chunk_idx)]
        if not older:
            return []
        target = np.asarray(target_extrinsics)[:, :3, 3].mean(0)
        return [min(older, key=lambda e: float(np.linalg.norm(e["center"] - target)))]

    def add_generated_chunk(
        self,
        *,
        pipe,
        generated_frames,
        chunk_idx,
        frames_per_chunk,
        rgb_start,
        full_noisy_extr,
        full_noisy_intr,
        device,
        tiled=False,
        source="generated",
    ):
        """Mirrors ``add_generated_chunk``: re-encode the chunk's last frame as context."""
        latent = _encode_frames_per_frame(pipe, np.asarray(generated_frames)[-1:], device)
        center = np.asarray(full_noisy_extr)[rgb_start : rgb_start + 4, :3, 3].mean(0)
        self.generated_entries.append(
            {
                "chunk_idx": int(chunk_idx),
                "latent": latent,
                "center": center,
                "position": 1 + int(chunk_idx) * frames_per_chunk,
                "camera_frame": 0,
                "source": source,
            }
        )
        return {"published_context_chunks": [int(chunk_idx)]}


def _build_initial_causal_kv_dynamic_context_pool(
    *,
    args,
    data,
    pipe,
    device,
    H_img,
    W_img,
    total_chunks,
    frames_per_chunk,
    full_noisy_extr,
    initial_c0_frames,
    initial_anchor_latent=None,
    generated_context_publish_interval=1,
    tiled=False,
):
    """Mirrors ``_build_initial_causal_kv_dynamic_context_pool``: (pool, intr, extr)."""
    if not getattr(args, "causal_kv_dynamic_context", False):
        return None, None, None
    pool = _CausalKVDynamicContextPool(
        anchor_latent=initial_anchor_latent,
        generated_context_publish_interval=generated_context_publish_interval,
    )
    return pool, None, None
