"""Stand-in of ``diffsynth/pipelines/wan_video.py``: the causal KV forward of the DiT."""

from __future__ import annotations

import torch


class _PropeCameraUnit:
    """Mirrors ``WanVideoUnit_PropeCamera`` as ``WAN_VIDEO_PROPE_CAMERA_UNIT.process``."""

    def process(self, pipe=None, **kwargs):
        extr = kwargs.get("noisy_latent_indices_prope_extrinsic")
        return {"camera_info": {"noisy_extrinsic": extr}}


WAN_VIDEO_PROPE_CAMERA_UNIT = _PropeCameraUnit()


def init_causal_kv_caches(num_blocks):
    """Mirrors ``init_causal_kv_caches``: per-block empty KV caches."""
    return [
        {"k": None, "v": None, "positions": [], "frames": [], "chunk_ids": []}
        for _ in range(num_blocks)
    ]


def model_fn_causal_kv(
    dit,
    *,
    latents_chunk,
    timestep_frames,
    context,
    camera_info,
    cur_positions,
    cur_frames,
    caches,
    mosaic_latent=None,
    mosaic_positions=None,
    mosaic_frames=None,
    cache_positions=None,
    cache_frames=None,
    cache_read_chunk_id=None,
    cur_cache_chunk_ids=None,
    write_cache=False,
    use_gradient_checkpointing=False,
    use_gradient_checkpointing_offload=False,
):
    """Mirrors ``model_fn_causal_kv``: one chunk forward attending to ``[cache, M, CUR]``;
    with ``write_cache`` the CUR frames' keys/values are appended to ``caches``. Returns
    the CUR prediction (B, C, F, H, W), B = the context batch (CFG: 2)."""
    x = latents_chunk if mosaic_latent is None else torch.cat([mosaic_latent, latents_chunk], 2)
    b = int(context.shape[0])
    x = x.expand(b, -1, -1, -1, -1) if x.shape[0] == 1 else x
    _, c, f, h, w = x.shape
    tokens = x.permute(0, 2, 3, 4, 1).reshape(b, f * h * w, c)
    t = timestep_frames.float().mean() / 1000.0
    hid = dit.embed(tokens) + t + context.mean(dim=1, keepdim=True)
    n_cur = int(latents_chunk.shape[2]) * h * w
    for block, cache in zip(dit.blocks, caches, strict=False):
        q, k, v = block.q(hid), block.k(hid), block.v(hid)
        keys, vals = k, v
        if cache["k"] is not None:
            keys = torch.cat([cache["k"].expand(b, -1, -1), k], 1)
            vals = torch.cat([cache["v"].expand(b, -1, -1), v], 1)
        att = torch.softmax(q @ keys.transpose(1, 2) / keys.shape[-1] ** 0.5, dim=-1)
        hid = hid + block.o(att @ vals)
        if write_cache:
            new_k, new_v = k[:, -n_cur:], v[:, -n_cur:]
            if cache["k"] is not None:
                new_k = torch.cat([cache["k"].expand(b, -1, -1), new_k], 1)
                new_v = torch.cat([cache["v"].expand(b, -1, -1), new_v], 1)
            cache["k"], cache["v"] = new_k, new_v
            cache["positions"] = [*cache["positions"], *cur_positions]
            cache["frames"] = [*cache["frames"], *cur_frames]
            ids = cur_cache_chunk_ids or [-1] * len(cur_frames)
            cache["chunk_ids"] = [*cache["chunk_ids"], *ids]
    out = dit.head(hid)[:, -n_cur:].reshape(b, int(latents_chunk.shape[2]), h, w, c)
    return out.permute(0, 4, 1, 2, 3).contiguous()
