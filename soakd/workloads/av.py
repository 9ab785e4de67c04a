"""Audio-visual Q&A: a staged workload over a rolling window of frames and audio.

Each dispatched frame updates two bounded windows: the last ``max_frames`` frames sampled
at ``video_fps`` (by capture time) and the last ``max_audio_seconds`` of audio (the
``Frame.audio`` chunks the runner attaches, at ``ctx.audio_rate`` Hz). ``preprocess``
calls the processor with both; ``decode`` reports the media token counts of the request
(``vision_tokens``, ``audio_tokens``), since they set its cost.

Models:

* built-in tiny (``model_path`` unset): a random-weight Qwen2.5-Omni *thinker* built by
  ``soakd.workloads.tiny``. transformers' ``Qwen2_5OmniProcessor`` needs torchvision, so the
  tiny model's three parts (Qwen2-VL image processor with the PIL backend, Whisper feature
  extractor, tokenizer) are each loaded with ``from_pretrained`` and composed here with the
  same placeholder arithmetic as that processor; window frames go in as images.
* a local checkpoint (``model_path``): ``AutoProcessor`` called with ``videos=[frames]`` and
  ``audio=[samples]``, and ``AutoModelForImageTextToText`` (e.g. Qwen2.5-Omni on a host with
  torchvision). This path has not been run here (no checkpoint, no network).
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any, Literal

import numpy as np

from soakd.config import AvWorkloadSettings
from soakd.records import Frame, StageOutput
from soakd.workloads.base import WorkloadContext, WorkloadError
from soakd.workloads.hf import (
    LOAD_TIMEOUT_S,
    bgr_to_rgb,
    check_device,
    check_model_dir,
    check_trust,
    load_error,
    one_line,
    resize_short_side,
    synchronize,
    torch_dtype,
)
from soakd.workloads.tiny import (
    AUDIO_SUBDIR,
    IMAGE_SUBDIR,
    OMNI_TOKENS,
    TinySpec,
    ensure_tiny_model,
)

DEFAULT_AUDIO_RATE = 16000
MIN_AUDIO_SAMPLES = 1600  # shorter audio windows are left-padded with silence


class MediaWindow:
    """The last ``max_frames`` frames kept at ``video_fps`` and the last
    ``max_audio_seconds`` of audio. Memory is bounded by both limits."""

    def __init__(
        self, video_fps: float, max_frames: int, max_audio_seconds: float, audio_rate: int | None
    ) -> None:
        self.period_ns = int(1e9 / video_fps)
        self.frames: deque[np.ndarray] = deque(maxlen=max_frames)
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


class _TinyOmniProcessor:
    """The tiny thinker's processor: image processor + feature extractor + tokenizer, each
    loaded with ``from_pretrained``, composed like ``Qwen2_5OmniProcessor``."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoFeatureExtractor, AutoImageProcessor, AutoTokenizer

        self.image_processor = AutoImageProcessor.from_pretrained(path / IMAGE_SUBDIR)
        self.feature_extractor = AutoFeatureExtractor.from_pretrained(path / AUDIO_SUBDIR)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.merge = int(self.image_processor.merge_size) ** 2
        t = OMNI_TOKENS
        self.image_token_id = self.tokenizer.convert_tokens_to_ids(t["image"])
        self.audio_token_id = self.tokenizer.convert_tokens_to_ids(t["audio"])

    def __call__(
        self, prompt: str, frames: list[np.ndarray], audio: np.ndarray | None, rate: int
    ) -> Any:
        from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import (
            _get_feat_extract_output_lengths,
        )

        t = OMNI_TOKENS
        parts = ["<|im_start|>user\n"]
        data: dict[str, Any] = {}
        if frames:
            im = self.image_processor(images=frames, return_tensors="pt")
            data["pixel_values"] = im["pixel_values"]
            data["image_grid_thw"] = im["image_grid_thw"]
            for n in (im["image_grid_thw"].prod(-1) // self.merge).tolist():
                parts.append(t["vision_bos"] + t["image"] * int(n) + t["vision_eos"])
        if audio is not None and audio.size:
            au = self.feature_extractor(
                [audio],
                sampling_rate=rate,
                padding="longest",
                return_attention_mask=True,
                return_tensors="pt",
            )
            data["input_features"] = au["input_features"]
            data["feature_attention_mask"] = au["attention_mask"]
            n = int(_get_feat_extract_output_lengths(au["attention_mask"].sum(-1))[0])
            parts.append(t["audio_bos"] + t["audio"] * n + t["audio_eos"])
        parts.append(f"{prompt}<|im_end|>\n<|im_start|>assistant\n")
        enc = self.tokenizer(["".join(parts)], return_tensors="pt")
        return {**enc, **data}

    def batch_decode(self, ids: Any, **kwargs: Any) -> list[str]:
        return list(self.tokenizer.batch_decode(ids, **kwargs))


class AvStaged:
    """Audio-visual Q&A over the media window, as a staged workload."""

    shape: Literal["staged"] = "staged"

    def __init__(self, settings: AvWorkloadSettings, ctx: WorkloadContext) -> None:
        self.s = settings
        self.ctx = ctx
        self.rate = ctx.audio_rate
        self.window = MediaWindow(
            settings.video_fps, settings.max_frames, settings.max_audio_seconds, self.rate
        )
        self.processor: Any = None
        self.model: Any = None
        self._path: Path | None = None
        self._tiny = settings.model_path is None
        self._token_ids: dict[str, int | None] = {}
        min_new = (
            settings.max_new_tokens
            if settings.min_new_tokens is None
            else min(settings.min_new_tokens, settings.max_new_tokens)
        )
        self._gen = {
            "max_new_tokens": settings.max_new_tokens,
            "min_new_tokens": min_new,
            "num_beams": settings.num_beams,
            "do_sample": settings.do_sample,
            "use_cache": settings.use_cache,
        }
        self._info: dict[str, Any] = {}

    # -- loading

    def setup(self) -> None:
        check_device(self.s.device)
        self.ctx.extend_timeout(LOAD_TIMEOUT_S)
        if self._tiny:
            self._load_tiny()
        else:
            self._load_checkpoint()
        self.model = self.model.to(self.s.device).eval()
        self._check_input_size()
        self._info = {
            "model_class": type(self.model).__name__,
            "param_count": int(sum(p.numel() for p in self.model.parameters())),
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "model_device": str(self.model.device),
        }

    def _load_tiny(self) -> None:
        from transformers.models.qwen2_5_omni import Qwen2_5OmniThinkerForConditionalGeneration

        path = self._path = ensure_tiny_model(
            TinySpec("qwen2.5-omni", seed=self.ctx.seed), self.s.cache_dir or self.ctx.cache_dir
        )
        self.processor = _TinyOmniProcessor(path)
        self.model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(
            path, dtype=torch_dtype(self.s.dtype)
        )
        self._token_ids = {
            "image": self.processor.image_token_id,
            "video": None,
            "audio": self.processor.audio_token_id,
        }

    def _load_checkpoint(self) -> None:  # pragma: no cover - needs a real checkpoint
        from transformers import AutoModelForImageTextToText, AutoProcessor

        assert self.s.model_path is not None
        path = self._path = check_model_dir(self.s.model_path)
        check_trust(path, self.s.trust_remote_code)
        try:
            self.processor = AutoProcessor.from_pretrained(
                path, trust_remote_code=self.s.trust_remote_code
            )
        except Exception as exc:
            raise load_error("processor", path, exc) from exc
        try:
            self.model = AutoModelForImageTextToText.from_pretrained(
                path, dtype=torch_dtype(self.s.dtype), trust_remote_code=self.s.trust_remote_code
            )
        except Exception as exc:
            raise load_error("model", path, exc) from exc
        self._token_ids = {
            k: getattr(self.processor, f"{k}_token_id", None) for k in ("image", "video", "audio")
        }

    def _check_input_size(self) -> None:
        """Run the processor once on blank media of the source size, before the run."""
        blank = resize_short_side(
            np.zeros((self.ctx.height, self.ctx.width, 3), np.uint8), self.s.short_side
        )
        audio = np.zeros(self.rate, np.float32) if self.rate else None
        try:
            self._call_processor([blank], audio)
        except Exception as exc:
            raise WorkloadError(
                f"processor rejected a {self.ctx.width}x{self.ctx.height} input "
                f"(short side {self.s.short_side}): {one_line(exc)}"
            ) from exc

    # -- the three stages

    def preprocess(self, frame: Frame) -> Any:
        rgb = resize_short_side(bgr_to_rgb(frame.image), self.s.short_side)
        self.window.add_frame(rgb, frame.stream_ns)
        self.window.add_audio(frame.audio)
        audio = self.window.audio() if self.rate else None
        return self._call_processor(list(self.window.frames), audio)

    def _call_processor(self, frames: list[np.ndarray], audio: np.ndarray | None) -> Any:
        rate = self.rate or DEFAULT_AUDIO_RATE
        if audio is not None and 0 < audio.size < MIN_AUDIO_SAMPLES:
            # STFT-based feature extractors need a few hundred samples (n_fft = 400)
            audio = np.pad(audio, (MIN_AUDIO_SAMPLES - audio.size, 0))
        if self._tiny:
            inputs = self.processor(self.s.prompt, frames, audio, rate)
        else:  # pragma: no cover - needs a real checkpoint
            inputs = self._checkpoint_inputs(frames, audio, rate)
        return {k: v.to(self.s.device) if hasattr(v, "to") else v for k, v in inputs.items()}

    def _checkpoint_inputs(
        self, frames: list[np.ndarray], audio: np.ndarray | None, rate: int
    ) -> Any:  # pragma: no cover - needs a real checkpoint
        content: list[dict[str, Any]] = [{"type": "video"}]
        if audio is not None and audio.size:
            content.append({"type": "audio"})
        content.append({"type": "text", "text": self.s.prompt})
        text = self.processor.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
        kwargs: dict[str, Any] = {
            "text": [text],
            "videos": [np.stack(frames)],
            "return_tensors": "pt",
            "padding": True,
        }
        if audio is not None and audio.size:
            kwargs["audio"] = [audio]
            kwargs["sampling_rate"] = rate
        return self.processor(**kwargs)

    def infer(self, inputs: Any) -> Any:
        import torch

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
        return out[:, ids.shape[1] :], vision, counts["audio"], len(self.window.frames)

    def decode(self, outputs: Any) -> StageOutput:
        new, vision, audio, n_frames = outputs
        text = self.processor.batch_decode(new, skip_special_tokens=True)[0]
        return StageOutput(
            text=text,
            tokens=int(new.shape[1]),
            vision_tokens=vision,
            audio_tokens=audio,
            extra={"window_frames": n_frames},
        )

    def sync(self) -> None:
        synchronize(self.s.device)

    def describe(self) -> dict[str, Any]:
        s = self.s
        return {
            "kind": "av",
            "model_path": str(self._path) if self._path else s.model_path,
            "builtin": self._tiny,
            "device": s.device,
            "dtype_requested": s.dtype,
            "trust_remote_code": s.trust_remote_code,
            "prompt": s.prompt,
            "video_fps": s.video_fps,
            "max_frames": s.max_frames,
            "max_audio_seconds": s.max_audio_seconds,
            "audio_rate": self.rate,
            "short_side": s.short_side,
            **self._gen,
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
