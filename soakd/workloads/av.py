"""Audio-visual Q&A: a staged workload over a rolling window of frames and audio.

Each dispatched frame updates two bounded windows: the frames of the last
``window_seconds`` sampled at ``video_fps`` by capture time (``video_fps x window_seconds``
frames, at most ``max_frames``) and the last ``max_audio_seconds`` of audio (the
``Frame.audio`` chunks the runner attaches, at ``ctx.audio_rate`` Hz). ``preprocess`` calls
the processor with the window's frames as **one video** (with ``fps = video_fps``, which
sets the video's temporal positions) and its audio, as a separate clip or, with
``use_audio_in_video``, interleaved with the video in time (then also passed to
``generate``). Frames reach the processor at the source's own size unless ``short_side``
is set, so the processor's ``min_pixels`` / ``max_pixels`` decide the video's size, as they
do for a real stream. ``decode`` reports the media token counts (``vision_tokens``,
``audio_tokens``) and, in the frame's ``extra``, the window's frame count, the video grid
``(t, h, w)``, the seconds per temporal grid step and the audio feature shape.

Models:

* built-in tiny (``model_path`` unset): a random-weight Qwen2.5-Omni checkpoint in the
  published layout, built once by ``soakd.workloads.tiny`` (see ``soakd.workloads.omni``);
* a local checkpoint (``model_path``): a config with a ``thinker_config`` (Qwen2.5-Omni 3B /
  7B) loads ``Qwen2_5OmniThinkerForConditionalGeneration``; others load
  ``AutoModelForImageTextToText``, or the class named by ``model_class``.

Both Omni paths use transformers' ``Qwen2_5OmniProcessor`` from the checkpoint's files;
where torchvision does not import, ``omni.PilVideoProcessor`` replaces only its video
processor, so the token counts and the audio padding (every clip padded to 300 s of 128-bin
features) are the real processor's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from soakd.records import Frame, StageOutput
from soakd.workloads.av_settings import AvWorkloadSettings
from soakd.workloads.base import WorkloadContext, WorkloadError
from soakd.workloads.hf import (
    LOAD_TIMEOUT_S,
    bgr_to_rgb,
    check_device,
    check_model_dir,
    check_trust,
    load_error,
    model_class_for,
    one_line,
    resize_short_side,
    synchronize,
    torch_dtype,
)
from soakd.workloads.omni import is_omni_checkpoint, load_processor
from soakd.workloads.tiny import TinySpec, ensure_tiny_model

DEFAULT_AUDIO_RATE = 16000
MIN_AUDIO_SAMPLES = 1600  # shorter audio windows are left-padded with silence


def window_frames(video_fps: float, window_seconds: float, max_frames: int) -> int:
    """Frames in a full window: ``video_fps x window_seconds``, at least 1, at most
    ``max_frames``."""
    return max(1, min(max_frames, round(video_fps * window_seconds)))


class MediaWindow:
    """The last ``size`` frames kept at ``video_fps`` and the last ``max_audio_seconds`` of
    audio. Memory is bounded by both limits."""

    def __init__(
        self, video_fps: float, size: int, max_audio_seconds: float, audio_rate: int | None
    ) -> None:
        self.period_ns = int(1e9 / video_fps)
        self.frames: deque[np.ndarray] = deque(maxlen=size)
        self._last_kept_ns: int | None = None
        self.audio_rate = audio_rate
        cap = round(max_audio_seconds * audio_rate) if audio_rate else 0
        self._audio = np.zeros(cap, dtype=np.float32)
        self._audio_len = 0

    def add_frame(self, image: np.ndarray, t_ns: int) -> bool:
        """Keep ``image`` if at least one period (less 10 % for pacing jitter) has passed."""
        last = self._last_kept_ns
        if last is not None and t_ns - last < self.period_ns * 0.9:
            return False
        self.frames.append(image)
        self._last_kept_ns = t_ns
        return True

    def add_audio(self, chunk: np.ndarray | None) -> None:
        cap = self._audio.size
        if chunk is None or cap == 0 or chunk.size == 0:
            return
        x = np.asarray(chunk, dtype=np.float32).reshape(-1)[-cap:]
        n = x.size
        self._audio[: cap - n] = self._audio[n:]
        self._audio[cap - n :] = x
        self._audio_len = min(cap, self._audio_len + n)

    def audio(self) -> np.ndarray:
        return self._audio[self._audio.size - self._audio_len :].copy()


@dataclass(slots=True)
class _Request:
    """One request: the processor's tensors and what they say about the media."""

    inputs: dict[str, Any]
    media: dict[str, Any]


def media_facts(inputs: Any, n_frames: int) -> dict[str, Any]:
    """The window as the processor encoded it: frames, video grid (t, h, w), seconds per
    temporal grid step, audio feature shape (mel bins, frames; padding included)."""
    facts: dict[str, Any] = {"window_frames": n_frames}
    grid = inputs.get("video_grid_thw")
    if grid is not None:
        facts["video_grid_thw"] = [int(v) for v in grid[0].tolist()]
    spg = inputs.get("video_second_per_grid")
    if spg is not None:
        facts["seconds_per_grid"] = round(float(spg[0]), 6)
    feats = inputs.get("input_features")
    if feats is not None:
        facts["audio_features"] = [int(v) for v in feats.shape[1:]]
    return facts


class AvStaged:
    """Audio-visual Q&A over the media window, as a staged workload."""

    shape: Literal["staged"] = "staged"

    def __init__(self, settings: AvWorkloadSettings, ctx: WorkloadContext) -> None:
        self.s = settings
        self.ctx = ctx
        self.rate = ctx.audio_rate
        self.window_size = window_frames(
            settings.video_fps, settings.window_seconds, settings.max_frames
        )
        self.window = MediaWindow(
            settings.video_fps, self.window_size, settings.max_audio_seconds, self.rate
        )
        self.processor: Any = None
        self.model: Any = None
        self._path: Path | None = None
        self._tiny = settings.model_path is None
        self._token_ids: dict[str, int | None] = {}
        self._texts: dict[bool, str] = {}
        min_new = (
            settings.max_new_tokens
            if settings.min_new_tokens is None
            else min(settings.min_new_tokens, settings.max_new_tokens)
        )
        self._gen: dict[str, Any] = {
            "max_new_tokens": settings.max_new_tokens,
            "min_new_tokens": min_new,
            "num_beams": settings.num_beams,
            "do_sample": settings.do_sample,
            "use_cache": settings.use_cache,
        }
        if settings.use_audio_in_video:
            self._gen["use_audio_in_video"] = True
        self._info: dict[str, Any] = {}

    # -- loading

    def setup(self) -> None:
        if self.s.use_audio_in_video and not self.rate:
            raise WorkloadError("use_audio_in_video needs an audio source ([audio] kind)")
        check_device(self.s.device)
        self.ctx.extend_timeout(LOAD_TIMEOUT_S)
        self.ctx.phase("loading model")
        path = self._path = self._model_dir()
        self.processor = self._load_processor(path)
        self.model = self._load_model(path).to(self.s.device).eval()
        self._token_ids = {
            k: getattr(self.processor, f"{k}_token_id", None) for k in ("image", "video", "audio")
        }
        self._texts = {has_audio: self._prompt_text(has_audio) for has_audio in (False, True)}
        self._check_input_size()
        self._info = self._model_info()

    def _model_dir(self) -> Path:
        if self._tiny:
            spec = TinySpec("qwen2.5-omni", seed=self.ctx.seed)
            return ensure_tiny_model(spec, self.s.cache_dir or self.ctx.cache_dir)
        assert self.s.model_path is not None
        path = check_model_dir(self.s.model_path)
        check_trust(path, self.s.trust_remote_code)
        return path

    def _load_processor(self, path: Path) -> Any:
        from transformers import AutoProcessor

        try:
            if is_omni_checkpoint(path):
                return load_processor(path)
            return AutoProcessor.from_pretrained(path, trust_remote_code=self.s.trust_remote_code)
        except Exception as exc:
            raise load_error("processor", path, exc) from exc

    def _load_model(self, path: Path) -> Any:
        cls = model_class_for(path, self.s.model_class)
        try:
            return cls.from_pretrained(
                path, dtype=torch_dtype(self.s.dtype), trust_remote_code=self.s.trust_remote_code
            )
        except Exception as exc:
            raise load_error("model", path, exc) from exc

    def _prompt_text(self, has_audio: bool) -> str:
        """The chat template around [video, audio (a separate clip only), prompt]."""
        content: list[dict[str, Any]] = [{"type": "video"}]
        if has_audio and not self.s.use_audio_in_video:
            content.append({"type": "audio"})
        content.append({"type": "text", "text": self.s.prompt})
        messages = [{"role": "user", "content": content}]
        return str(
            self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        )

    def _check_input_size(self) -> None:
        """Run the processor once on blank media of the source size, before the run."""
        blank = resize_short_side(
            np.zeros((self.ctx.height, self.ctx.width, 3), np.uint8), self.s.short_side
        )
        audio = np.zeros(self.rate, np.float32) if self.rate else None
        try:
            self._call_processor([blank], audio)
        except Exception as exc:
            side = self.s.short_side
            size = f"{self.ctx.width}x{self.ctx.height}" + (f" (short side {side})" if side else "")
            raise WorkloadError(f"processor rejected a {size} input: {one_line(exc)}") from exc

    def _model_info(self) -> dict[str, Any]:
        proc = self.processor
        fe = getattr(proc, "feature_extractor", None)
        size = (getattr(proc, "videos_kwargs", None) or {}).get("size") or {}
        info = {
            "model_class": type(self.model).__name__,
            "model_type": getattr(self.model.config, "model_type", None),
            "param_count": int(sum(p.numel() for p in self.model.parameters())),
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "model_device": str(self.model.device),
            "processor": type(proc).__name__,
            "video_processor": type(getattr(proc, "video_processor", None)).__name__,
            "video_min_pixels": size.get("shortest_edge"),
            "video_max_pixels": size.get("longest_edge"),
        }
        if fe is not None:
            info["audio_mel_bins"] = getattr(fe, "feature_size", None)
            n, sr = getattr(fe, "n_samples", None), getattr(fe, "sampling_rate", None)
            info["audio_padded_seconds"] = n / sr if n and sr else None
        return info

    # -- the three stages

    def preprocess(self, frame: Frame) -> _Request:
        rgb = resize_short_side(bgr_to_rgb(frame.image), self.s.short_side)
        self.window.add_frame(rgb, frame.stream_ns)
        self.window.add_audio(frame.audio)
        audio = self.window.audio() if self.rate else None
        frames = list(self.window.frames)
        inputs = self._call_processor(frames, audio)
        return _Request(inputs, media_facts(inputs, len(frames)))

    def _call_processor(self, frames: list[np.ndarray], audio: np.ndarray | None) -> Any:
        if audio is not None and 0 < audio.size < MIN_AUDIO_SAMPLES:
            # STFT-based feature extractors need a few hundred samples (n_fft = 400)
            audio = np.pad(audio, (MIN_AUDIO_SAMPLES - audio.size, 0))
        has_audio = audio is not None and audio.size > 0
        kwargs: dict[str, Any] = {
            "text": [self._texts[has_audio]],
            "videos": [np.stack(frames)],
            "videos_kwargs": {"fps": self.s.video_fps},
            "return_tensors": "pt",
            "padding": True,
        }
        if has_audio:
            kwargs["audio"] = [audio]
            kwargs["sampling_rate"] = self.rate or DEFAULT_AUDIO_RATE
            if self.s.use_audio_in_video:
                kwargs.update(self._audio_in_video_kwargs())
        inputs = self.processor(**kwargs)
        return {k: v.to(self.s.device) if hasattr(v, "to") else v for k, v in inputs.items()}

    def _audio_in_video_kwargs(self) -> dict[str, Any]:
        """transformers >= 5.25 names it ``load_audio_from_video`` and takes the audio of
        video 0 from ``audio``; earlier releases take ``use_audio_in_video``."""
        if hasattr(self.processor, "load_audio_from_video"):
            return {"load_audio_from_video": True, "audio_from_video_indices": [0]}
        return {"use_audio_in_video": True}

    def infer(self, request: _Request) -> Any:
        import torch

        inputs = request.inputs
        with torch.inference_mode():
            out = self.model.generate(**inputs, **self._gen)
        ids = inputs["input_ids"]
        counts = {
            k: (None if tid is None else int((ids == tid).sum()))
            for k, tid in self._token_ids.items()
        }
        vision = None
        if counts["image"] is not None or counts["video"] is not None:
            vision = (counts["image"] or 0) + (counts["video"] or 0)
        return out[:, ids.shape[1] :], vision, counts["audio"], request.media

    def decode(self, outputs: Any) -> StageOutput:
        new, vision, audio, media = outputs
        text = self.processor.batch_decode(new, skip_special_tokens=True)[0]
        return StageOutput(
            text=text,
            tokens=int(new.shape[1]),
            vision_tokens=vision,
            audio_tokens=audio,
            extra=media,
        )

    def sync(self) -> None:
        synchronize(self.s.device)

    def describe(self) -> dict[str, Any]:
        s = self.s
        gen = {k: v for k, v in self._gen.items() if k != "use_audio_in_video"}
        return {
            "kind": "av",
            "model_path": str(self._path) if self._path else s.model_path,
            "builtin": self._tiny,
            "model_class_requested": s.model_class,
            "device": s.device,
            "dtype_requested": s.dtype,
            "trust_remote_code": s.trust_remote_code,
            "prompt": s.prompt,
            "video_fps": s.video_fps,
            "window_seconds": s.window_seconds,
            "max_frames": s.max_frames,
            "window_frames": self.window_size,
            "max_audio_seconds": s.max_audio_seconds,
            "use_audio_in_video": s.use_audio_in_video,
            "audio_rate": self.rate,
            "short_side": s.short_side,
            **gen,
            **self._info,
        }

    def close(self) -> None:
        self.model = None
        self.processor = None
        if self.s.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()


def build(settings: AvWorkloadSettings, ctx: WorkloadContext) -> AvStaged:
    """The ``av`` workload; a bad ``model_path`` fails here, before loading."""
    if settings.model_path is not None:
        check_model_dir(settings.model_path)
    return AvStaged(settings, ctx)
