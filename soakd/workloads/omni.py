"""Qwen2.5-Omni as transformers ships it: the checkpoint layout, the thinker and the processor.

* ``save_tiny_checkpoint(dst, seed, tokenizer)`` writes a random-weight checkpoint laid out like the
  published Qwen2.5-Omni-7B: ``config.json`` of ``model_type = "qwen2_5_omni"`` with a
  ``thinker_config`` (text, vision and audio configs shrunk; no talker weights), the weights
  under ``thinker.``, a ``preprocessor_config.json`` holding the 7B's image-processor and
  feature-extractor settings (128 mel bins, clips padded to 300 s), a ``chat_template.json``
  and a byte-level tokenizer with the 7B's media token names.
* ``load_processor(path)``: transformers' own ``Qwen2_5OmniProcessor`` from the directory
  (the tokenizer loaded without transformers' warnings about its default talker config).
  Its video processor (``Qwen2VLVideoProcessor``) needs torchvision; where torchvision does
  not import, ``PilVideoProcessor`` stands in for it (and transformers' PIL image processor
  for the default one), and every other piece (chat template, placeholder expansion, audio
  padding, audio-in-video interleaving, seconds per grid) is the real processor's code.
* ``expected_counts(...)``: the media token counts the real processor gives for a window,
  computed from its settings alone (the tests check the workload against it).

torch and transformers are imported only inside functions.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

#: the media token names of the published checkpoints' tokenizer
OMNI_TOKENS = {
    "image_token": "<|IMAGE|>",
    "video_token": "<|VIDEO|>",
    "audio_token": "<|AUDIO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}
#: the tokenizer's special tokens: chat markers, then the media tokens
OMNI_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *OMNI_TOKENS.values()]
#: the chat role the thinker config names (``user_token_id``; one token in the 7B's vocabulary)
USER_TOKEN = "user"
DEFAULT_SYSTEM_PROMPT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of "
    "perceiving auditory and visual inputs, as well as generating text and speech."
)
#: the 7B's preprocessor_config.json (image processor + Whisper feature extractor in one file)
PREPROCESSOR_7B: dict[str, Any] = {
    "processor_class": "Qwen2_5OmniProcessor",
    "image_processor_type": "Qwen2VLImageProcessor",
    "feature_extractor_type": "WhisperFeatureExtractor",
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "feature_size": 128,
    "sampling_rate": 16000,
    "hop_length": 160,
    "n_fft": 400,
    "chunk_length": 300,
    "n_samples": 4800000,
    "nb_max_frames": 30000,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "dither": 0.0,
}

# The 7B chat template's structure: a default system turn, then media placeholders in order.
_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    + DEFAULT_SYSTEM_PROMPT
    + "<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif c['type'] == 'audio' %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif c['type'] == 'video' %}<|vision_bos|><|VIDEO|><|vision_eos|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_SIZES = {"text": 64, "vision": 32, "audio": 32}


# ---------------------------------------------------------------------------------------
# The checkpoint


def is_omni_checkpoint(path: Path) -> bool:
    """True when ``config.json`` is a Qwen2.5-Omni (thinker + talker) config."""
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and "thinker_config" in cfg


def _tokenizer(base: Any) -> Any:
    """``base`` with the media token names as the processor reads them
    (``tokenizer.video_token`` ...) and the chat role ``user`` as one token, as in the
    published vocabulary (the thinker config's ``user_token_id``)."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=base.backend_tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=OMNI_TOKENS,
    )
    tok.add_tokens([USER_TOKEN])
    return tok


def _thinker_config(tok: Any) -> dict[str, Any]:
    ids = {k.removesuffix("_token"): tok.convert_tokens_to_ids(v) for k, v in OMNI_TOKENS.items()}
    text = _SIZES["text"]
    return {
        "audio_config": {
            "num_mel_bins": PREPROCESSOR_7B["feature_size"],
            "encoder_layers": 1,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "d_model": _SIZES["audio"],
            "output_dim": text,
            "n_window": 100,
        },
        "vision_config": {
            "depth": 1,
            "hidden_size": _SIZES["vision"],
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": text,
            "fullatt_block_indexes": [0],
            "window_size": 112,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        "text_config": {
            "hidden_size": text,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 32768,
            "vocab_size": len(tok),
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 3, 3],
            },
        },
        "audio_token_index": ids["audio"],
        "image_token_index": ids["image"],
        "video_token_index": ids["video"],
        "audio_start_token_id": ids["audio_bos"],
        "audio_end_token_id": ids["audio_eos"],
        "vision_start_token_id": ids["vision_bos"],
        "vision_end_token_id": ids["vision_eos"],
        "user_token_id": tok.convert_tokens_to_ids(USER_TOKEN),  # transformers' default: 872
        "position_id_per_seconds": 25,
        "seconds_per_chunk": 2,
        "pad_token_id": tok.pad_token_id,
        "eos_token_id": tok.eos_token_id,
    }


def save_tiny_checkpoint(dst: Path, seed: int, base_tokenizer: Any) -> None:
    """Write a random-weight Qwen2.5-Omni checkpoint in the published layout into ``dst``;
    ``base_tokenizer`` is a fast tokenizer holding ``OMNI_SPECIALS`` (soakd.workloads.tiny
    makes a byte-level one and calls this)."""
    import torch
    from transformers.models.qwen2_5_omni import (
        Qwen2_5OmniConfig,
        Qwen2_5OmniForConditionalGeneration,
    )

    tok = _tokenizer(base_tokenizer)
    thinker = _thinker_config(tok)
    talker_ids = {k: thinker[k] for k in thinker if k.endswith(("_token_id", "_token_index"))}
    cfg = Qwen2_5OmniConfig(
        thinker_config=thinker,
        talker_config={
            **talker_ids,
            "tts_text_start_token_id": tok.pad_token_id,
            "tts_text_end_token_id": tok.pad_token_id,
            "tts_text_pad_token_id": tok.pad_token_id,
        },
        enable_audio_output=False,  # the thinker only: soakd measures text answers
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5OmniForConditionalGeneration(cfg).eval()
    dst.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst)
    tok.save_pretrained(dst)
    (dst / "preprocessor_config.json").write_text(
        json.dumps(PREPROCESSOR_7B, indent=2) + "\n", encoding="utf-8"
    )
    (dst / "chat_template.json").write_text(
        json.dumps({"chat_template": _CHAT_TEMPLATE}) + "\n", encoding="utf-8"
    )


# ---------------------------------------------------------------------------------------
# The processor


def torchvision_imports() -> bool:
    """Whether torchvision imports here (a wheel that does not match torch fails on import)."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # ImportError, or a RuntimeError from a mismatched build
        return False
    return True


def _video_processor_base() -> type:
    from transformers.video_processing_utils import VideoProcessorMixin

    return VideoProcessorMixin


def _make_pil_video_processor_class() -> type:
    base = _video_processor_base()

    class PilVideoProcessor(base):  # type: ignore[misc, valid-type]
        """``Qwen2VLVideoProcessor`` with PIL and numpy, for hosts where torchvision does not
        import: each frame resized by ``smart_resize`` to the size the processor passes
        (bicubic), rescaled and normalized, an odd frame count padded with the last frame,
        and patches laid out as that processor lays them out."""

        model_input_names: ClassVar[list[str]] = ["pixel_values_videos", "video_grid_thw"]

        def __init__(self, **kwargs: Any) -> None:
            self.patch_size = int(kwargs.pop("patch_size", 14))
            self.temporal_patch_size = int(kwargs.pop("temporal_patch_size", 2))
            self.merge_size = int(kwargs.pop("merge_size", 2))
            self.image_mean = list(kwargs.pop("image_mean", PREPROCESSOR_7B["image_mean"]))
            self.image_std = list(kwargs.pop("image_std", PREPROCESSOR_7B["image_std"]))
            self.min_pixels = int(kwargs.pop("min_pixels", 128 * 28 * 28))
            self.max_pixels = int(kwargs.pop("max_pixels", 768 * 28 * 28))

        def __call__(self, videos: Any, **kwargs: Any) -> Any:
            from transformers import BatchFeature

            size = kwargs.get("size") or {}
            lo = int(size.get("shortest_edge", self.min_pixels))
            hi = int(size.get("longest_edge", self.max_pixels))
            pixels, grids = [], []
            for video in videos:
                p, grid = self._one(np.asarray(video), lo, hi)
                pixels.append(p)
                grids.append(grid)
            data = {
                "pixel_values_videos": np.concatenate(pixels).astype(np.float32),
                "video_grid_thw": np.array(grids, dtype=np.int64),
            }
            return BatchFeature(data=data, tensor_type=kwargs.get("return_tensors"))

        def _one(self, video: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, list[int]]:
            from PIL import Image

            p, m, tp = self.patch_size, self.merge_size, self.temporal_patch_size
            h, w = smart_resize(video.shape[1], video.shape[2], p * m, lo, hi)
            mean = np.array(self.image_mean, np.float32)[:, None, None]
            std = np.array(self.image_std, np.float32)[:, None, None]
            frames = [
                np.asarray(Image.fromarray(f).resize((w, h), Image.Resampling.BICUBIC))
                for f in video
            ]
            x = (np.stack(frames).astype(np.float32) / 255.0).transpose(0, 3, 1, 2)
            x = (x - mean) / std
            if pad := -len(x) % tp:
                x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
            gt, gh, gw = len(x) // tp, h // p, w // p
            x = x.reshape(gt, tp, 3, gh // m, m, p, gw // m, m, p)
            x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
            return x.reshape(gt * gh * gw, 3 * tp * p * p), [gt, gh, gw]

    return PilVideoProcessor


def pil_video_processor(path: Path) -> Any:
    """The stand-in video processor with the directory's video (else image) settings."""
    for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
        f = path / name
        if f.is_file():
            cfg = json.loads(f.read_text(encoding="utf-8"))
            break
    else:
        cfg = {}
    keys = ("patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std")
    kwargs = {k: cfg[k] for k in keys if k in cfg}
    size = cfg.get("size") or {}
    for key, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        # as Qwen2VLVideoProcessor: min_pixels / max_pixels override size (and the processor
        # passes its own size at each call, which overrides both)
        value = cfg.get(key, size.get(edge))
        if value is not None:
            kwargs[key] = value
    return _make_pil_video_processor_class()(**kwargs)


def load_processor(path: Path) -> Any:
    """``Qwen2_5OmniProcessor`` from ``path``, its tokenizer from ``load_tokenizer``; where
    torchvision does not import, with the PIL video and image processors
    (``type(processor.video_processor).__name__`` says which)."""
    from transformers.models.qwen2_5_omni import Qwen2_5OmniProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    tokenizer = load_tokenizer(path)
    if torchvision_imports():
        return Qwen2_5OmniProcessor.from_pretrained(path, tokenizer=tokenizer)
    return _processor_class_pil_video().from_pretrained(
        path,
        tokenizer=tokenizer,
        video_processor=pil_video_processor(path),
        image_processor=Qwen2VLImageProcessorPil.from_pretrained(path),
    )


def load_tokenizer(path: Path) -> Any:
    """The checkpoint's tokenizer as ``AutoTokenizer`` loads it, given the checkpoint's config
    built by ``Qwen2_5OmniConfig`` itself. Left to read the config with ``AutoConfig``,
    ``AutoTokenizer`` formats it for a debug log line (formatted even when not shown), and
    that builds transformers' default ``Qwen2_5OmniTalkerConfig``, whose own special-token
    ids (151647-151861) lie outside its own default vocabulary (8448): seven warnings about
    a config no checkpoint uses, the published 7B's load included."""
    from transformers import AutoTokenizer
    from transformers.models.qwen2_5_omni import Qwen2_5OmniConfig

    cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    for key in ("model_type", "transformers_version"):
        cfg.pop(key, None)
    cfg["name_or_path"] = str(path)  # as AutoConfig sets it
    try:
        config = Qwen2_5OmniConfig(**cfg)
    except (TypeError, ValueError):  # a config this release cannot build: AutoConfig's turn
        return AutoTokenizer.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path, config=config)


def _processor_class_pil_video() -> Any:
    from transformers.models.qwen2_5_omni import Qwen2_5OmniProcessor

    class Qwen2_5OmniProcessorPilVideo(Qwen2_5OmniProcessor):  # type: ignore[misc]
        """The real processor; only its check of the video processor's class is relaxed
        (transformers resolves ``VideoProcessorMixin`` by name, which fails without
        torchvision)."""

        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            base = _video_processor_base()
            if argument_name == "video_processor" and isinstance(argument, base):
                return base
            return super().check_argument_for_proper_class(argument_name, argument)

    return Qwen2_5OmniProcessorPilVideo


def smart_resize(height: int, width: int, factor: int, lo: int, hi: int) -> tuple[int, int]:
    """transformers' Qwen2-VL resize rule (sides multiples of ``factor``, pixels in [lo, hi])."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        smart_resize as _smart_resize,
    )

    h, w = _smart_resize(height, width, factor=factor, min_pixels=lo, max_pixels=hi)
    return int(h), int(w)


# ---------------------------------------------------------------------------------------
# Counting


@dataclass(frozen=True, slots=True)
class MediaCounts:
    """What the processor makes of one window: the video grid and both token counts."""

    video_grid_thw: tuple[int, int, int]
    video_tokens: int
    audio_tokens: int
    audio_features: tuple[int, int]  # (mel bins, feature frames), padding included


def expected_counts(
    frames: int, height: int, width: int, audio_samples: int, settings: dict[str, Any]
) -> MediaCounts:
    """The counts ``Qwen2_5OmniProcessor`` gives one video of ``frames`` frames of
    ``height`` x ``width`` and one clip of ``audio_samples`` samples, from ``settings``
    (``min_pixels``, ``max_pixels``: the video size the processor passes; ``patch_size``,
    ``temporal_patch_size``, ``merge_size``; ``feature_size``, ``n_samples``,
    ``hop_length``)."""
    p, m, tp = settings["patch_size"], settings["merge_size"], settings["temporal_patch_size"]
    h, w = smart_resize(height, width, p * m, settings["min_pixels"], settings["max_pixels"])
    grid = (math.ceil(frames / tp), h // p, w // p)
    hop = settings["hop_length"]
    n_feat = math.ceil(min(audio_samples, settings["n_samples"]) / hop)
    conv = (n_feat - 1) // 2 + 1
    return MediaCounts(
        video_grid_thw=grid,
        video_tokens=grid[0] * grid[1] * grid[2] // (m * m),
        audio_tokens=(conv - 2) // 2 + 1,
        audio_features=(settings["feature_size"], settings["n_samples"] // hop),
    )
