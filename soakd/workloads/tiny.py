"""Build, cache and locate the built-in tiny random-weight models.

Each tiny model is made from a transformers config with a fixed seed and a byte-level
tokenizer made with ``tokenizers``, saved once with ``save_pretrained`` and loaded back by
the workloads through ``from_pretrained``: the very path a real checkpoint takes. Nothing is
downloaded and no weights live in the repository.

Architectures (``TINY_ARCHS``):

* ``llava``: LLaVA (CLIP vision tower + Qwen2 text model), ``LlavaProcessor`` with the
  PIL CLIP image processor. Needs no torchvision, so it is the one that runs everywhere.
* ``qwen2-vl``: Qwen2-VL. transformers' ``Qwen2VLProcessor`` requires torchvision (its video
  processor is mandatory), so building it without torchvision raises ``WorkloadError``.
* ``qwen2.5-omni``: a Qwen2.5-Omni checkpoint in the published layout (``model_type =
  "qwen2_5_omni"``, thinker weights, the 7B's processor settings); see
  ``soakd.workloads.omni``.

The directory is ``<root>/<arch>-<hash of the build spec>`` with root ``$CACHE_DIRECTORY``
(systemd, first entry) + ``/models``, else ``~/.cache/soakd/models``. It is written into a
temporary sibling and renamed into place, so two processes or a crash never leave a
half-written model; a directory without the ``.complete`` marker is never used.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from soakd.workloads.base import WorkloadError

TINY_ARCHS: tuple[str, ...] = ("llava", "qwen2-vl", "qwen2.5-omni")
BUILD_VERSION = 3  # bump when a builder changes, so stale caches are not reused
MARKER = ".complete"

_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}IMAGE"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True, slots=True)
class TinySpec:
    """Everything that determines a tiny model's files (and so its cache directory)."""

    arch: str
    seed: int = 0
    short_side: int = 56  # llava: the vision tower's image size
    version: int = BUILD_VERSION

    def digest(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def dirname(self) -> str:
        return f"{self.arch}-{self.digest()}"


def default_cache_root() -> Path:
    """``$CACHE_DIRECTORY/models`` under systemd, else ``~/.cache/soakd/models``."""
    cache = os.environ.get("CACHE_DIRECTORY")
    if cache:
        return Path(cache.split(":")[0]) / "models"
    return Path("~/.cache/soakd/models").expanduser()


def model_dir(spec: TinySpec, cache_dir: str | Path | None = None) -> Path:
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_root()
    return root / spec.dirname()


def torchvision_available() -> bool:
    return find_spec("torchvision") is not None


def ensure_tiny_model(spec: TinySpec, cache_dir: str | Path | None = None) -> Path:
    """Return the directory of the tiny model for ``spec``, building it first if needed."""
    if spec.arch not in TINY_ARCHS:
        raise WorkloadError(f"unknown tiny architecture {spec.arch!r} (known: {TINY_ARCHS})")
    if spec.arch == "qwen2-vl" and not torchvision_available():
        raise WorkloadError(
            "tiny-vlm arch 'qwen2-vl' needs torchvision (transformers' Qwen2VLProcessor "
            "requires it); install torchvision or use arch = 'llava'"
        )
    final = model_dir(spec, cache_dir)
    if (final / MARKER).is_file():
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    except OSError as exc:
        raise WorkloadError(f"cannot create model cache in {final.parent}: {exc}") from exc
    try:
        _BUILDERS[spec.arch](spec, tmp)
        (tmp / MARKER).write_text(json.dumps(asdict(spec)) + "\n", encoding="utf-8")
        _publish(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _publish(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``; if another process won the race, keep its copy."""
    if final.exists() and not (final / MARKER).is_file():
        shutil.rmtree(final, ignore_errors=True)  # a leftover without marker: never complete
    try:
        os.rename(tmp, final)
    except OSError:
        if not (final / MARKER).is_file():
            raise


def weights_digest(path: str | Path) -> str:
    """sha256 over the tensor names, dtypes, shapes and bytes of ``model.safetensors``."""
    from safetensors.numpy import load_file

    tensors = load_file(str(Path(path) / "model.safetensors"))
    h = hashlib.sha256()
    for name in sorted(tensors):
        arr = tensors[name]
        h.update(f"{name}:{arr.dtype}:{arr.shape}".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------
# Builders


def byte_tokenizer(specials: list[str], *, eos: str, pad: str) -> Any:
    """A byte-level tokenizer (256 byte symbols, no merges) plus ``specials``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {s: i for i, s in enumerate(specials)}
    for ch in pre_tokenizers.ByteLevel.alphabet():
        vocab.setdefault(ch, len(vocab))
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(specials)
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=eos, pad_token=pad)


def _seeded(seed: int, make: Callable[[], Any]) -> Any:
    """Construct a model under ``seed`` without disturbing the caller's RNG state."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make().eval()


def _text_config(tok: Any, **extra: Any) -> dict[str, Any]:
    return {
        **_TEXT,
        "vocab_size": len(tok),
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        **extra,
    }


def _build_llava(spec: TinySpec, dst: Path) -> None:
    from transformers import LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    side = max(14, spec.short_side // 14 * 14)
    tok = byte_tokenizer(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>"],
        eos="<|im_end|>",
        pad="<|endoftext|>",
    )
    cfg = LlavaConfig(
        text_config={"model_type": "qwen2", **_text_config(tok)},
        vision_config={
            "model_type": "clip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": side,
            "patch_size": 14,
            "projection_dim": 32,
        },
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    model = _seeded(spec.seed, lambda: LlavaForConditionalGeneration(cfg))
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": side}, crop_size={"height": side, "width": side}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        chat_template=_CHAT_TEMPLATE.replace("IMAGE", "<image>"),
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        image_token="<image>",
    )
    model.save_pretrained(dst)
    processor.save_pretrained(dst)


def _build_qwen2_vl(spec: TinySpec, dst: Path) -> None:  # pragma: no cover - needs torchvision
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
    )

    specials = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|image_pad|>",
        "<|video_pad|>",
    ]
    tok = byte_tokenizer(specials, eos="<|im_end|>", pad="<|endoftext|>")
    ids = {s: tok.convert_tokens_to_ids(s) for s in specials}
    cfg = Qwen2VLConfig(
        text_config=_text_config(
            tok, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]}
        ),
        vision_config={
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": 64,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    model = _seeded(spec.seed, lambda: Qwen2VLForConditionalGeneration(cfg))
    image_processor = Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=28 * 28 * 64)
    template = _CHAT_TEMPLATE.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>")
    processor = Qwen2VLProcessor(
        image_processor=image_processor, tokenizer=tok, chat_template=template
    )
    model.save_pretrained(dst)
    processor.save_pretrained(dst)


def _build_omni(spec: TinySpec, dst: Path) -> None:
    from soakd.workloads.omni import OMNI_SPECIALS, save_tiny_checkpoint

    tok = byte_tokenizer(OMNI_SPECIALS, eos="<|im_end|>", pad="<|endoftext|>")
    save_tiny_checkpoint(dst, spec.seed, tok)


_BUILDERS: dict[str, Callable[[TinySpec, Path], None]] = {
    "llava": _build_llava,
    "qwen2-vl": _build_qwen2_vl,
    "qwen2.5-omni": _build_omni,
}
