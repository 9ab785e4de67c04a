"""Frame-generation workloads (Matrix-Game style): conditioning goes in, frames come out.

``build(settings, ctx)`` returns the built-in tiny generator (``factory`` unset) or the
user's own generator (``factory = "pkg.mod:fn"``, called as ``fn(options, ctx)``, which may
return a ``"generator"`` or a ``"rollout"`` workload).

The tiny model is a small random-weight convolutional denoiser (fixed seed) run for
``num_inference_steps`` steps per chunk on a latent of ``channels x height/8 x width/8``,
followed by a small decoder that upsamples the latent x8 to RGB frames. On CUDA every
timing ends after a synchronize. It runs in one of two modes (``workload.mode``):

* ``"rollout"`` (default, Matrix-Game's shape: ``TinyRollout``): one session per run; per
  condition a chunk of ``frames_per_chunk`` frames in the named stages of Matrix-Game's
  chunk: ``context`` (the condition frame and action, and the rolling window of the last
  ``context_chunks`` chunks' KV entries), ``denoise`` (the steps), ``kv_write`` (one more
  forward whose output enters the window) and ``vae_decode``, then ``emit``. A planted
  ``slow_stage`` (e.g. ``"memory_bank"``) of ``slow_stage_ms`` + ``slow_stage_growth_ms``
  per chunk so far stands for memory-bank work, for tests and demos.
* ``"request"`` (``TinyGenerator``): one request per paced frame, ``chunks_per_request``
  chunks each, ``emit(n)`` as each chunk is decoded; it reports
  ``GeneratorTimings(pre_ms, infer_ms, decode_ms)`` (denoise and decode totals).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Literal

import numpy as np

from soakd.records import Frame
from soakd.workloads.base import (
    Condition,
    EmitFn,
    GeneratorTimings,
    RolloutRun,
    WorkloadContext,
    WorkloadError,
)
from soakd.workloads.conditions import load_conditions
from soakd.workloads.generator_settings import GeneratorWorkloadSettings
from soakd.workloads.plugin import load_factory

_LATENT_SCALE = 8  # the decoder upsamples the latent by this factor (like an image VAE)


def _ms(t0: float, t1: float) -> float:
    return (t1 - t0) * 1000.0


class _TinyModel:
    """The built-in offline generator's model: random weights, real convolutions."""

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
            "builtin": True,  # random weights, built offline
            "mode": s.mode,
            "width": s.width,
            "height": s.height,
            "channels": s.channels,
            "num_inference_steps": s.num_inference_steps,
            "frames_per_chunk": s.frames_per_chunk,
            "device": s.device,
            "seed": s.seed,
            "torch_threads": 1,
            **self._describe_mode(),
        }

    def _describe_mode(self) -> dict[str, Any]:
        return {}

    # --- the hot path
    def _sync(self) -> None:
        if self._device is not None and self._device.type == "cuda":
            self._torch.cuda.synchronize(self._device)

    def sync(self) -> None:
        """Wait for the device (CUDA synchronize); a no-op on CPU."""
        self._sync()

    def _latent_shape(self) -> tuple[int, int, int, int]:
        s = self.s
        lh, lw = s.height // _LATENT_SCALE, s.width // _LATENT_SCALE
        return (s.frames_per_chunk, s.channels, lh, lw)

    def _decode(self, latent: Any) -> Any:
        frames = self._decoder(latent)
        return ((frames + 1.0) * 127.5).clamp(0, 255).to(self._torch.uint8).cpu()

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


class TinyGenerator(_TinyModel):
    """``mode = "request"``: one request per paced frame, ``chunks_per_request`` chunks."""

    shape: Literal["generator"] = "generator"

    def _describe_mode(self) -> dict[str, Any]:
        return {"chunks_per_request": self.s.chunks_per_request}

    def generate(self, frame: Frame, emit: EmitFn) -> GeneratorTimings:
        if self._torch is None:
            raise RuntimeError("TinyGenerator.generate called before setup()")
        torch, s = self._torch, self.s
        t0 = time.perf_counter()
        cond = self._condition(frame).expand(s.frames_per_chunk, -1, -1, -1)
        self._sync()
        pre_ms = _ms(t0, time.perf_counter())
        infer_ms = decode_ms = 0.0
        shape = self._latent_shape()
        with torch.inference_mode():
            for _ in range(s.chunks_per_request):
                t1 = time.perf_counter()
                latent = torch.randn(shape, generator=self._gen, device=self._device)
                for _ in range(s.num_inference_steps):
                    eps = self._denoiser(torch.cat([latent, cond], dim=1))
                    latent = latent - eps / s.num_inference_steps
                self._sync()
                t2 = time.perf_counter()
                out = self._decode(latent)
                self._sync()
                t3 = time.perf_counter()
                infer_ms += _ms(t1, t2)
                decode_ms += _ms(t2, t3)
                emit(int(out.shape[0]))
        self.requests += 1
        return GeneratorTimings(pre_ms=pre_ms, infer_ms=infer_ms, decode_ms=decode_ms)


class TinyRollout(_TinyModel):
    """``mode = "rollout"``: one session per run, a chunk per condition, in named stages."""

    shape: Literal["rollout"] = "rollout"

    def _describe_mode(self) -> dict[str, Any]:
        s = self.s
        out: dict[str, Any] = {"context_chunks": s.context_chunks, "conditions": s.conditions}
        if s.slow_stage:
            out.update(
                slow_stage=s.slow_stage,
                slow_stage_ms=s.slow_stage_ms,
                slow_stage_growth_ms=s.slow_stage_growth_ms,
            )
        return out

    def rollout(self, run: RolloutRun) -> None:
        if self._torch is None:
            raise RuntimeError("TinyRollout.rollout called before setup()")
        window: deque[Any] = deque(maxlen=max(self.s.context_chunks, 1))
        with self._torch.inference_mode():
            while (c := run.next_condition()) is not None:
                self._chunk(run, c, window)

    def _chunk(self, run: RolloutRun, c: Condition, window: deque[Any]) -> None:
        torch, s = self._torch, self.s
        with run.stage("context"):
            cond = self._condition(c.frame) + _action_bias(c.action)
            cond = cond.expand(s.frames_per_chunk, -1, -1, -1)
            past = torch.stack(list(window)).mean(0) if window and s.context_chunks else 0.0
        with run.stage("denoise"):
            latent = torch.randn(self._latent_shape(), generator=self._gen, device=self._device)
            for _ in range(s.num_inference_steps):
                eps = self._denoiser(torch.cat([latent + 0.1 * past, cond], dim=1))
                latent = latent - eps / s.num_inference_steps
        with run.stage("kv_write"):  # the forward at t = 0 whose output enters the window
            window.append(self._denoiser(torch.cat([latent, cond], dim=1)))
        if s.slow_stage:
            with run.stage(s.slow_stage):
                time.sleep((s.slow_stage_ms + s.slow_stage_growth_ms * c.index) / 1000.0)
        with run.stage("vae_decode"):
            out = self._decode(latent)
        run.emit(int(out.shape[0]))


def _action_bias(action: dict[str, Any] | None) -> float:
    """A small number from the action's numbers (the tiny model's action embedding)."""
    if not action:
        return 0.0
    total = 0.0
    for v in action.values():
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, int | float) and not isinstance(x, bool):
                total += float(x)
    return max(-1.0, min(1.0, 0.01 * total))


def build(settings: GeneratorWorkloadSettings, ctx: WorkloadContext) -> Any:
    """The tiny generator (a rollout or per-request, as ``mode`` says), or the user's
    generator when ``factory`` is set; ``conditions`` is checked first (a bad file is a
    one-line error before the run)."""
    if settings.mode == "rollout":
        load_conditions(settings.conditions)
    if settings.factory is None:
        return (
            TinyRollout(settings, ctx)
            if settings.mode == "rollout"
            else TinyGenerator(settings, ctx)
        )
    return load_factory(
        settings.factory, dict(settings.options), ctx, expect=("generator", "rollout")
    )
