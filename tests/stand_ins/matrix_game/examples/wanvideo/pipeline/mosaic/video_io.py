"""Stand-in of ``examples/wanvideo/pipeline/mosaic/video_io.py``: VAE decode/encode helpers."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def _decode_latents_to_numpy_frames(pipe, latents, device, tiled=False):
    """Mirrors ``_decode_latents_to_numpy_frames``: (1,C,T,H,W) -> (1+4(T-1),H,W,3) uint8."""
    z = latents if latents.ndim == 5 else latents[None]
    with torch.no_grad():
        x = pipe.vae.decode(z.to(device=device, dtype=torch.float32))[0]
    x = ((x.clamp(-1, 1) + 1) * 127.5).to(torch.uint8)
    return x.permute(1, 2, 3, 0).cpu().numpy()


def _encode_frames_per_frame(pipe, frames_np, device, tiled=False, single2four=False):
    """Mirrors ``_encode_frames_per_frame``: each RGB frame -> one latent, stacked on T."""
    x = torch.as_tensor(np.asarray(frames_np)).float().permute(3, 0, 1, 2)[None] / 127.5 - 1
    with torch.no_grad():
        return pipe.vae.encode(x.to(device))


class _DepthEstimator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Conv2d(3, 1, 3, padding=1)

    def inference(self, frames):
        x = torch.as_tensor(np.asarray(frames)).float().permute(0, 3, 1, 2) / 255.0
        with torch.no_grad():
            return self.net(x).abs()[:, 0] + 1.0


def _init_registration_estimator(args, device=None):
    """Mirrors ``_init_registration_estimator``: the depth estimator of the memory bank."""
    return _DepthEstimator().to(device or "cpu").eval()


def _get_frustum_handler_cls():
    """Mirrors ``_get_frustum_handler_cls``."""
    from frustum.frustum_handler import FrustumHandler

    return FrustumHandler
