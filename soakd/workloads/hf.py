"""The transformers image-text-to-text adapter: the ``tiny-vlm`` default and ``hf`` checkpoints.

One staged workload class serves both; only where the model directory comes from differs.
``setup`` loads ``AutoProcessor`` and ``AutoModelForImageTextToText`` with
``from_pretrained`` and checks once that the processor accepts the configured input size.

* ``preprocess(frame)``: BGR -> RGB, resize so the short side is ``short_side`` (when set),
  apply the chat template around the prompt and call the processor; tensors go to the device.
* ``infer(inputs)``: ``model.generate`` with the generation settings. The output length is
  fixed (``min_new_tokens = max_new_tokens`` unless set) so frame times are comparable.
* ``decode(outputs)``: ``processor.batch_decode`` of the new tokens -> ``StageOutput`` with
  the text, the number of new tokens and the number of image tokens in the prompt.

torch and transformers are imported only inside this module's functions and methods.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from soakd.records import Frame, StageOutput
from soakd.workloads.base import WorkloadContext, WorkloadError
from soakd.workloads.hf_settings import HfWorkload, TinyVlmWorkload
from soakd.workloads.tiny import MARKER, TinySpec, ensure_tiny_model
from soakd.workloads.tiny import model_dir as tiny_model_dir

LOAD_TIMEOUT_S = 300.0  # asked of systemd (EXTEND_TIMEOUT_USEC) before a model load


@dataclass(frozen=True, slots=True)
class HfParams:
    """The resolved, timing-relevant settings of one transformers workload."""

    kind: str
    model_path: str
    device: str = "cpu"
    dtype: str = "auto"
    attn_implementation: str | None = None
    trust_remote_code: bool = False
    prompt: str = "Describe what is happening in this frame."
    short_side: int | None = None
    max_new_tokens: int = 16
    min_new_tokens: int | None = None
    num_beams: int = 1
    do_sample: bool = False
    use_cache: bool = True
    torch_threads: int | None = None  # torch intra-op threads; None = torch's default
    extra: dict[str, Any] = field(default_factory=dict)

    def generate_kwargs(self) -> dict[str, Any]:
        min_new = self.max_new_tokens if self.min_new_tokens is None else self.min_new_tokens
        return {
            "max_new_tokens": self.max_new_tokens,
            "min_new_tokens": min(min_new, self.max_new_tokens),
            "num_beams": self.num_beams,
            "do_sample": self.do_sample,
            "use_cache": self.use_cache,
        }


# ---------------------------------------------------------------------------------------
# Shared helpers (also used by the audio-visual workload)


def check_model_dir(path: str | Path) -> Path:
    """The checkpoint directory, or WorkloadError naming what is wrong with it."""
    p = Path(path).expanduser()
    if not p.exists():
        raise WorkloadError(f"model_path {str(p)!r}: no such directory")
    if not p.is_dir():
        raise WorkloadError(f"model_path {str(p)!r}: not a directory")
    if not (p / "config.json").is_file():
        raise WorkloadError(f"model_path {str(p)!r}: not a model directory (no config.json)")
    return p


def needs_remote_code(path: Path) -> bool:
    """True when the checkpoint's config maps to code shipped with it (``auto_map``)."""
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"model_path {str(path)!r}: unreadable config.json: {exc}") from exc
    return isinstance(cfg, dict) and bool(cfg.get("auto_map"))


def check_trust(path: Path, trust_remote_code: bool) -> None:
    if needs_remote_code(path) and not trust_remote_code:
        raise WorkloadError(
            f"model_path {str(path)!r}: the model needs its own code; set "
            "trust_remote_code = true if you trust it"
        )


def model_class_for(path: Path, name: str | None = None) -> Any:
    """The class ``path`` loads with: the transformers class ``name`` when given; else the
    Qwen2.5-Omni thinker for a config with a ``thinker_config`` (``model_type =
    "qwen2_5_omni"``, which ``AutoModelForImageTextToText`` does not know); else
    ``AutoModelForImageTextToText``."""
    import transformers

    from soakd.workloads.omni import is_omni_checkpoint

    if name:
        try:
            cls = getattr(transformers, name, None) if name.isidentifier() else None
        except Exception as exc:  # a class whose backend (e.g. torchvision) does not import
            raise WorkloadError(f"model_class {name!r}: {one_line(exc)}") from exc
        if cls is None or not hasattr(cls, "from_pretrained"):
            raise WorkloadError(f"model_class {name!r}: not a model class in transformers")
        return cls
    if is_omni_checkpoint(path):
        return transformers.Qwen2_5OmniThinkerForConditionalGeneration
    return transformers.AutoModelForImageTextToText


def check_device(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise WorkloadError(f"device {device!r}: CUDA is not available on this host")
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise WorkloadError(
                f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) visible"
            )


def torch_dtype(name: str) -> Any:
    import torch

    return "auto" if name == "auto" else getattr(torch, name)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def load_error(what: str, path: Path, exc: BaseException) -> WorkloadError:
    """Map a from_pretrained failure to a one-line WorkloadError."""
    msg = str(exc)
    if "trust_remote_code" in msg:
        return WorkloadError(
            f"model_path {str(path)!r}: the model needs its own code; set "
            "trust_remote_code = true if you trust it"
        )
    return WorkloadError(f"model_path {str(path)!r}: cannot load the {what}: {one_line(exc)}")


def resize_short_side(rgb: np.ndarray, short_side: int | None) -> np.ndarray:
    """Resize so that min(h, w) == short_side, keeping the aspect ratio."""
    if short_side is None:
        return rgb
    import cv2

    h, w = rgb.shape[:2]
    scale = short_side / min(h, w)
    if scale == 1.0:
        return rgb
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    return cv2.resize(rgb, size, interpolation=interp)


def bgr_to_rgb(image: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(image[..., ::-1])


def synchronize(device: str) -> None:
    """Wait for queued CUDA work on ``device``; nothing on CPU."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------
# The staged adapter


class HfStaged:
    """A transformers image-text-to-text model as a staged workload."""

    shape: Literal["staged"] = "staged"

    def __init__(self, params: HfParams, ctx: WorkloadContext) -> None:
        self.params = params
        self.ctx = ctx
        self.processor: Any = None
        self.model: Any = None
        self._text = ""
        self._image_token_id: int | None = None
        self._gen = params.generate_kwargs()
        self._info: dict[str, Any] = {}
        self._path: Path | None = None

    # -- loading

    def model_dir(self) -> Path:
        return check_model_dir(self.params.model_path)

    def setup(self) -> None:
        p = self.params
        path = self._path = self.model_dir()
        check_trust(path, p.trust_remote_code)
        check_device(p.device)
        self.ctx.extend_timeout(LOAD_TIMEOUT_S)
        if p.torch_threads:
            import torch

            # on a small CPU box torch's OpenMP pool contends with soakd's own threads and
            # shows up as infer jitter; the setting is recorded with the run
            torch.set_num_threads(p.torch_threads)
        self.ctx.phase("loading model")
        from transformers import AutoProcessor

        try:
            self.processor = AutoProcessor.from_pretrained(
                path, trust_remote_code=p.trust_remote_code
            )
        except Exception as exc:
            raise load_error("processor", path, exc) from exc
        kwargs: dict[str, Any] = {"dtype": torch_dtype(p.dtype)}
        if p.attn_implementation:
            kwargs["attn_implementation"] = p.attn_implementation
        try:
            model: Any = model_class_for(path).from_pretrained(
                path, trust_remote_code=p.trust_remote_code, **kwargs
            )
        except Exception as exc:
            raise load_error("model", path, exc) from exc
        self.model = model.to(p.device).eval()
        self._text = self._prompt_text()
        self._image_token_id = _image_token_id(self.processor, self.model)
        self._check_input_size()
        self._info = _model_info(self.model)

    def _prompt_text(self) -> str:
        proc = self.processor
        if getattr(proc, "chat_template", None):
            messages = [
                {
                    "role": "user",
                    "content": [{"type": "image"}, {"type": "text", "text": self.params.prompt}],
                }
            ]
            return str(
                proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            )
        token = getattr(proc, "image_token", None) or "<image>"
        return f"{token}{self.params.prompt}"

    def _check_input_size(self) -> None:
        """Run the processor once on a blank frame of the source size, before the run."""
        blank = np.zeros((self.ctx.height, self.ctx.width, 3), dtype=np.uint8)
        frame = Frame(id=-1, t_sched_ns=0, t_capture_ns=0, grab_ns=0, image=blank)
        try:
            self.preprocess(frame)
        except Exception as exc:
            side = self.params.short_side
            size = f"{self.ctx.width}x{self.ctx.height}" + (f" (short side {side})" if side else "")
            raise WorkloadError(f"processor rejected a {size} input: {one_line(exc)}") from exc

    # -- the three stages

    def preprocess(self, frame: Frame) -> Any:
        rgb = resize_short_side(bgr_to_rgb(frame.image), self.params.short_side)
        inputs = self.processor(text=[self._text], images=[rgb], return_tensors="pt")
        return inputs.to(self.params.device)

    def infer(self, inputs: Any) -> Any:
        import torch

        with torch.inference_mode():
            out = self.model.generate(**inputs, **self._gen)
        ids = inputs["input_ids"]
        vision = None if self._image_token_id is None else int((ids == self._image_token_id).sum())
        return out[:, ids.shape[1] :], vision

    def decode(self, outputs: Any) -> StageOutput:
        new, vision = outputs
        text = self.processor.batch_decode(new, skip_special_tokens=True)[0]
        return StageOutput(text=text, tokens=int(new.shape[1]), vision_tokens=vision)

    def sync(self) -> None:
        synchronize(self.params.device)

    def describe(self) -> dict[str, Any]:
        p = self.params
        return {
            "kind": p.kind,
            "builtin": p.kind == "tiny-vlm",  # random weights, built offline
            "model_path": str(self._path or p.model_path),
            "device": p.device,
            "dtype_requested": p.dtype,
            "attn_implementation": p.attn_implementation,
            "trust_remote_code": p.trust_remote_code,
            "prompt": p.prompt,
            "short_side": p.short_side,
            "torch_threads": p.torch_threads,
            **self._gen,
            **p.extra,
            **self._info,
        }

    def close(self) -> None:
        self.model = None
        self.processor = None
        if self.params.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()


class TinyVlmStaged(HfStaged):
    """The embedded default: builds (once) and caches the tiny model, then loads it."""

    def __init__(
        self, params: HfParams, ctx: WorkloadContext, spec: TinySpec, cache_dir: str | None
    ) -> None:
        super().__init__(params, ctx)
        self.spec = spec
        self.cache_dir = cache_dir

    def model_dir(self) -> Path:
        self.ctx.extend_timeout(LOAD_TIMEOUT_S)
        if not (tiny_model_dir(self.spec, self.cache_dir) / MARKER).is_file():
            self.ctx.phase("building the tiny model")
        return ensure_tiny_model(self.spec, self.cache_dir)


def _image_token_id(processor: Any, model: Any) -> int | None:
    for obj, name in (
        (processor, "image_token_id"),
        (model.config, "image_token_id"),
        (model.config, "image_token_index"),
    ):
        value = getattr(obj, name, None)
        if isinstance(value, int):
            return value
    return None


def _model_info(model: Any) -> dict[str, Any]:
    return {
        "model_class": type(model).__name__,
        "model_type": getattr(model.config, "model_type", None),
        "param_count": int(sum(p.numel() for p in model.parameters())),
        "dtype": str(model.dtype).removeprefix("torch."),
        "model_device": str(model.device),
        "attn_implementation_used": getattr(model.config, "_attn_implementation", None),
    }


# ---------------------------------------------------------------------------------------
# Factories (registry: "tiny-vlm" -> build_tiny, "hf" -> build_hf)


def _generation(settings: TinyVlmWorkload | HfWorkload) -> dict[str, Any]:
    return {
        "prompt": settings.prompt,
        "max_new_tokens": settings.max_new_tokens,
        "min_new_tokens": settings.min_new_tokens,
        "num_beams": settings.num_beams,
        "do_sample": settings.do_sample,
        "use_cache": settings.use_cache,
    }


def build_tiny(settings: TinyVlmWorkload, ctx: WorkloadContext) -> TinyVlmStaged:
    """The ``tiny-vlm`` workload; the model is built (or found in the cache) in ``setup``."""
    spec = TinySpec(arch=settings.arch, seed=settings.seed, short_side=settings.short_side)
    params = HfParams(
        kind="tiny-vlm",
        model_path="",
        device=settings.device,
        dtype=settings.dtype,
        short_side=settings.short_side,
        torch_threads=settings.torch_threads,
        extra={"arch": settings.arch, "seed": settings.seed, "build": spec.digest()},
        **_generation(settings),
    )
    return TinyVlmStaged(params, ctx, spec, settings.cache_dir or ctx.cache_dir)


def build_hf(settings: HfWorkload, ctx: WorkloadContext) -> HfStaged:
    """The ``hf`` workload for a local checkpoint; a bad path fails here, before loading."""
    check_model_dir(settings.model_path)
    params = HfParams(
        kind="hf",
        model_path=str(Path(settings.model_path).expanduser()),
        device=settings.device,
        dtype=settings.dtype,
        attn_implementation=settings.attn_implementation,
        trust_remote_code=settings.trust_remote_code,
        short_side=settings.short_side,
        torch_threads=settings.torch_threads,
        **_generation(settings),
    )
    return HfStaged(params, ctx)
