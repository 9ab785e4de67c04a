"""Stand-in of ``examples/wanvideo/pipeline/mosaic/pipeline_module.py``: a tiny
``WanMosaicPipelineModule`` (random weights: a two-block DiT, a 4-channel VAE, a text
encoder, a flow-matching scheduler)."""

from __future__ import annotations

import torch
from torch import nn

LATENT_CHANNELS = 4
PATCH = 16  # pixels per latent cell, as causal_inference assumes (height = latent_h * 16)
WIDTH = 16


class _Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))


class _Dit(nn.Module):
    def __init__(self, c, d, n_blocks=2):
        super().__init__()
        self.embed, self.head = nn.Linear(c, d), nn.Linear(d, c)
        self.blocks = nn.ModuleList(_Block(d) for _ in range(n_blocks))
        self.trans_scale = 50.0


class _Vae(nn.Module):
    """Wan VAE's time layout: ``T`` latents <-> ``1 + 4*(T-1)`` RGB frames."""

    def __init__(self, c):
        super().__init__()
        self.dec, self.enc = nn.Conv3d(c, 3, 1), nn.Conv3d(3, c, 1)

    def decode(self, z):
        reps = torch.tensor([1] + [4] * (z.shape[2] - 1))
        x = torch.repeat_interleave(self.dec(z), reps, dim=2)
        return torch.tanh(nn.functional.interpolate(x, scale_factor=(1, PATCH, PATCH)))

    def encode(self, x):
        return self.enc(nn.functional.avg_pool3d(x, (1, PATCH, PATCH)))


class _Tokenizer:
    def __call__(self, p, return_mask=True, add_special_tokens=True):
        codes = [(ord(ch) % 97) + 1 for ch in (p or "")[:16]]
        ids = torch.tensor([codes + [0] * (16 - len(codes))])
        return ids, (ids > 0).long()


class _TextEncoder(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.emb = nn.Embedding(100, d)

    def forward(self, ids, mask):
        return self.emb(ids)


class _Scheduler:
    """Flow matching: x_t = (1 - s) x0 + s noise, s = t / 1000."""

    def __init__(self):
        self.timesteps = torch.tensor([1000.0])
        self.sigmas = torch.tensor([1.0])
        self.training = False

    def step(self, model_output, timestep, sample, to_final=False):
        return sample - float(timestep) / 1000.0 * model_output

    def add_noise(self, x0, noise, timestep):
        s = float(timestep) / 1000.0
        return (1 - s) * x0 + s * noise

    def set_timesteps(self, n, training=False):
        self.timesteps = torch.linspace(1000, 1, n)


class _Pipe:
    def __init__(self, device):
        self.device = device
        self.torch_dtype = torch.float32
        self.dit = _Dit(LATENT_CHANNELS, WIDTH)
        self.vae = _Vae(LATENT_CHANNELS)
        self.text_encoder = _TextEncoder(WIDTH)
        self.tokenizer = _Tokenizer()
        self.scheduler = _Scheduler()
        self.in_iteration_models = ("dit",)

    def load_models_to_device(self, names):
        pass


class WanMosaicPipelineModule(nn.Module):
    """Mirrors ``WanMosaicPipelineModule`` (the attributes the rollout reads)."""

    def __init__(
        self, *, device="cpu", enable_mosaic=True, only_prope=False, vae_decode_tiled=True, **kwargs
    ):
        super().__init__()
        torch.manual_seed(0)
        self.pipe = _Pipe(torch.device(device))
        self.enable_mosaic, self.only_prope = enable_mosaic, only_prope
        self.vae_decode_tiled = vae_decode_tiled

    def _materialize_data(self, data):
        """Mirrors ``_materialize_data``: VAE-encode the anchor frame into clean_latents."""
        img = torch.as_tensor(data["image"]).float().permute(2, 0, 1)[None, :, None] / 127.5 - 1
        with torch.no_grad():
            data["clean_latents"] = self.pipe.vae.encode(img)
        data["needs_first_latent_materialization"] = False
        return data

    def _ensure_batched_latents(self, latents):
        return latents if latents.ndim == 5 else latents[None]
