"""Frame-generation workloads (Matrix-Game style): a request goes in, frames come out.

``build(settings, ctx)`` returns either the built-in tiny generator (``factory`` unset) or
the user's own generator (``factory = "pkg.mod:fn"``, called as ``fn(options, ctx)``).

The tiny generator is a small random-weight convolutional denoiser (fixed seed) run for
``num_inference_steps`` steps per chunk on a latent of ``channels x height/8 x width/8``,
followed by a small decoder that upsamples the latent x8 to RGB frames. Each request makes
``chunks_per_request`` chunks of ``frames_per_chunk`` frames and calls ``emit(n)`` as soon as
a chunk's frames are decoded. It reports ``GeneratorTimings(pre_ms, infer_ms, decode_ms)``:
``infer_ms`` is the denoising total and ``decode_ms`` the decoder total over all chunks,
measured with ``perf_counter`` after a CUDA synchronize on CUDA devices.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import numpy as np

from soakd.config import GeneratorWorkloadSettings
from soakd.records import Frame
from soakd.workloads.base import EmitFn, GeneratorTimings, WorkloadContext, WorkloadError
from soakd.workloads.plugin import load_factory

_LATENT_SCALE = 8  # the decoder upsamples the latent by this factor (like an image VAE)


def _ms(t0: float, t1: float) -> float:
    return (t1 - t0) * 1000.0


class TinyGenerator:
    """The built-in offline generator: random weights, real convolutions, real timings."""

    shape: Literal["generator"] = "generator"

    def __init__(self, settings: GeneratorWorkloadSettings, ctx: WorkloadContext) -> None:
        if settings.width % _LATENT_SCALE or settings.height % _LATENT_SCALE:
            raise WorkloadError(
                f"workload.width/height: must be multiples of {_LATENT_SCALE} for the tiny "
                f"generator, got {settings.width}x{settings.height}"
            )
        self.s = settings
        self.ctx = ctx
        self._torch: Any = None
        self._device: Any = None
        self._denoiser: Any = None
        self._decoder: Any = None
        self._gen: Any = None
        self._prev_threads: int | None = None
        self.requests = 0

    @property
    def response_timeout_s(self) -> float:
        return self.s.response_timeout_s

    # --- lifecycle
    def setup(self) -> None:
        try:
            import torch
            from torch import nn
        except ImportError as exc:  # pragma: no cover - torch is a dependency
            raise WorkloadError(f"the tiny generator needs torch: {exc}") from exc
        s = self.s
        try:
            device = torch.device(s.device)
        except RuntimeError as exc:
            raise WorkloadError(f"workload.device: {exc}") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise WorkloadError(
                f"workload.device: {s.device!r} requested but CUDA is not available"
            )
        # the tiny ops gain nothing from intra-op threads, and OpenMP spin-waiting beside the
        # pacer, sampler and writer threads made request times jump tenfold on 2 cores
        self._prev_threads = torch.get_num_threads()
        torch.set_num_threads(1)
        torch.manual_seed(s.seed)
        c, hidden = s.channels, max(16, s.channels * 2)
        self._denoiser = nn.Sequential(
            nn.Conv2d(c + 3, hidden, 3, padding=1),
            nn.SiLU(),
            nn.Conv2d(hidden, hidden, 3, padding=1),
            nn.SiLU(),
            nn.Conv2d(hidden, c, 3, padding=1),
        )
        layers: list[Any] = [nn.Conv2d(c, hidden, 3, padding=1), nn.SiLU()]
        for _ in range(3):  # three x2 upsamplings = x8
            layers += [
                nn.Upsample(scale_factor=2, mode="nearest"),
                nn.Conv2d(hidden, hidden, 3, padding=1),
                nn.SiLU(),
            ]
        layers += [nn.Conv2d(hidden, 3, 3, padding=1), nn.Tanh()]
        self._decoder = nn.Sequential(*layers)
        self._denoiser.to(device).eval()
        self._decoder.to(device).eval()
        self._gen = torch.Generator(device=device).manual_seed(s.seed)
        self._torch = torch
        self._device = device

    def close(self) -> None:
        self._denoiser = self._decoder = None
        if self._prev_threads is not None:
            self._torch.set_num_threads(self._prev_threads)
            self._prev_threads = None

    def describe(self) -> dict[str, Any]:
        s = self.s
        return {
            "generator": "tiny",
            "width": s.width,
            "height": s.height,
            "channels": s.channels,
            "num_inference_steps": s.num_inference_steps,
            "frames_per_chunk": s.frames_per_chunk,
            "chunks_per_request": s.chunks_per_request,
            "device": s.device,
            "seed": s.seed,
            "torch_threads": 1,
        }

    # --- the hot path
    def _sync(self) -> None:
        if self._device is not None and self._device.type == "cuda":
            self._torch.cuda.synchronize(self._device)

    def _condition(self, frame: Frame) -> Any:
        """The frame, resized to the latent grid, as a 3-channel conditioning tensor."""
        import cv2

        torch, s = self._torch, self.s
        lh, lw = s.height // _LATENT_SCALE, s.width // _LATENT_SCALE
        img = frame.image
        if img.ndim == 2:
            img = np.repeat(img[:, :, None], 3, axis=2)
        small = cv2.resize(
            np.ascontiguousarray(img[:, :, :3]), (lw, lh), interpolation=cv2.INTER_AREA
        )
        t = torch.from_numpy(small).to(self._device, dtype=torch.float32)
        return (t.permute(2, 0, 1).unsqueeze(0) / 127.5) - 1.0

    def generate(self, frame: Frame, emit: EmitFn) -> GeneratorTimings:
        if self._torch is None:
            raise RuntimeError("TinyGenerator.generate called before setup()")
        torch, s = self._torch, self.s
        t0 = time.perf_counter()
        cond = self._condition(frame).expand(s.frames_per_chunk, -1, -1, -1)
        self._sync()
        pre_ms = _ms(t0, time.perf_counter())
        infer_ms = decode_ms = 0.0
        shape = (
            s.frames_per_chunk,
            s.channels,
            s.height // _LATENT_SCALE,
            s.width // _LATENT_SCALE,
        )
        with torch.inference_mode():
            for _ in range(s.chunks_per_request):
                t1 = time.perf_counter()
                latent = torch.randn(shape, generator=self._gen, device=self._device)
                for _ in range(s.num_inference_steps):
                    eps = self._denoiser(torch.cat([latent, cond], dim=1))
                    latent = latent - eps / s.num_inference_steps
                self._sync()
                t2 = time.perf_counter()
                frames = self._decoder(latent)
                out = ((frames + 1.0) * 127.5).clamp(0, 255).to(torch.uint8).cpu()
                self._sync()
                t3 = time.perf_counter()
                infer_ms += _ms(t1, t2)
                decode_ms += _ms(t2, t3)
                emit(int(out.shape[0]))
        self.requests += 1
        return GeneratorTimings(pre_ms=pre_ms, infer_ms=infer_ms, decode_ms=decode_ms)


def build(settings: GeneratorWorkloadSettings, ctx: WorkloadContext) -> Any:
    """The tiny generator, or the user's generator when ``factory`` is set."""
    if settings.factory is None:
        return TinyGenerator(settings, ctx)
    return load_factory(settings.factory, dict(settings.options), ctx, expect="generator")
