"""Session workloads: any model with MOSS-VL-Realtime's realtime interface.

The model is loaded with ``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=...,
dtype=..., attn_implementation=...)`` and its processor with ``AutoProcessor``; soakd then
calls ``model.create_realtime_session(processor, initial_prompt=..., frame_queue_size=...,
max_tokens_per_turn=..., max_new_tokens=..., do_sample=...)``, ``session.start()``, and for
each paced frame ``session.push_frame(image, timestamp)`` (True when the session dropped its
oldest pending frame), ``session.pending_frames`` and ``session.poll_output(timeout)``.

What soakd can truly see is recorded (push time, drops, pending frames, outputs and when they
arrive); the stages the model hides (preprocess, infer, decode) are unknown and stored as NULL.

With ``model_path`` unset the built-in tiny model of :mod:`soakd.workloads.tiny_session` is
used, so the whole path runs offline. Checkpoint problems (a path that does not exist, no
``config.json``, custom code while ``trust_remote_code`` is off, a model without
``create_realtime_session``) raise a one-line ``WorkloadError`` before the run starts.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Literal

from soakd.config import SessionWorkloadSettings
from soakd.records import Frame
from soakd.workloads.base import PushResult, SessionOutput, WorkloadContext, WorkloadError
from soakd.workloads.tiny_session import TinyRealtimeModel

SILENCE_TOKEN = "<|silence|>"
_CONTROL_RE = re.compile(r"<\|[^|<>]*\|>")


def classify_chunk(text: str) -> Literal["text", "silence", "control"]:
    """``text`` if the chunk has visible text besides control tokens, ``silence`` if it holds
    ``<|silence|>`` and nothing else visible, else ``control``."""
    if _CONTROL_RE.sub("", text).strip():
        return "text"
    return "silence" if SILENCE_TOKEN in text else "control"


def _chunks(raw: Any) -> list[str]:
    """``poll_output`` may return None, a string, a list of strings, or dicts with 'text'."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [raw] if raw else []
    if isinstance(raw, dict):
        text = raw.get("text")
        return [str(text)] if text else []
    if isinstance(raw, list | tuple):
        return [c for item in raw for c in _chunks(item)]
    return [str(raw)]


def check_checkpoint(path: str, trust_remote_code: bool) -> Path:
    """Cheap checks before anything loads: the path exists, holds a transformers config,
    and does not need custom code that ``trust_remote_code = false`` forbids."""
    p = Path(path).expanduser()
    if not p.exists():
        raise WorkloadError(f"workload.model_path: {p} does not exist")
    cfg_file = p / "config.json" if p.is_dir() else p
    if not cfg_file.is_file():
        raise WorkloadError(
            f"workload.model_path: {p} has no config.json (not a transformers checkpoint)"
        )
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadError(
            f"workload.model_path: {cfg_file} is not readable JSON: {exc}"
        ) from None
    if not isinstance(cfg, dict):
        raise WorkloadError(f"workload.model_path: {cfg_file} is not a JSON object")
    if (
        cfg.get("auto_map")
        and not trust_remote_code
        and not _known_model_type(cfg.get("model_type"))
    ):
        raise WorkloadError(
            f"workload.trust_remote_code: {p} ships its own model code (model_type "
            f"{cfg.get('model_type')!r}); set trust_remote_code = true if you trust it"
        )
    return p


def _known_model_type(model_type: Any) -> bool:
    from transformers import CONFIG_MAPPING

    return isinstance(model_type, str) and model_type in CONFIG_MAPPING


def _torch_dtype(name: str) -> Any:
    if name == "auto":
        return "auto"
    import torch

    return getattr(torch, name)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def load_realtime_model(settings: SessionWorkloadSettings, ctx: WorkloadContext) -> tuple[Any, Any]:
    """Load model and processor from ``settings.model_path`` (a local checkpoint)."""
    assert settings.model_path is not None
    path = check_checkpoint(settings.model_path, settings.trust_remote_code)
    from transformers import AutoModelForCausalLM, AutoProcessor

    kwargs: dict[str, Any] = {
        "trust_remote_code": settings.trust_remote_code,
        "dtype": _torch_dtype(settings.dtype),
    }
    if settings.attn_implementation:
        kwargs["attn_implementation"] = settings.attn_implementation
    ctx.extend_timeout(600.0)
    try:
        processor = AutoProcessor.from_pretrained(
            path, trust_remote_code=settings.trust_remote_code
        )
        model: Any = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        model = model.to(settings.device).eval()
    except Exception as exc:
        raise WorkloadError(f"workload.model_path: cannot load {path}: {_first_line(exc)}") from exc
    return model, processor


class RealtimeSessionWorkload:
    """The ``session`` workload: an adapter over a model's realtime session."""

    shape: Literal["session"] = "session"

    def __init__(
        self,
        settings: SessionWorkloadSettings,
        ctx: WorkloadContext,
        *,
        model: Any = None,
        processor: Any = None,
    ) -> None:
        self.s = settings
        self.ctx = ctx
        self.model = model
        self.processor = processor
        self.session: Any = None
        self._t0_ns: int | None = None
        self._prev_threads: int | None = None
        self._pil = False  # real processors take PIL images; the tiny model takes arrays

    @property
    def response_timeout_s(self) -> float:
        return self.s.response_timeout_s

    @property
    def poll_timeout_s(self) -> float:
        return self.s.poll_timeout_s

    # --- lifecycle
    def setup(self) -> None:
        if self.model is None:
            if self.s.model_path is None:
                self._setup_tiny()
            else:
                self.model, self.processor = load_realtime_model(self.s, self.ctx)
                self._pil = True
        if not callable(getattr(self.model, "create_realtime_session", None)):
            raise WorkloadError(
                f"workload: {type(self.model).__name__} has no create_realtime_session(); "
                "kind = 'session' needs a model with the realtime session interface "
                "(use kind = 'hf' for a plain image-text model)"
            )

    def _setup_tiny(self) -> None:
        import torch

        # the tiny ops gain nothing from intra-op threads, and OpenMP spin-waiting beside the
        # pacer, sampler, writer and poller threads made turn times jump 30x on 2 cores
        self._prev_threads = torch.get_num_threads()
        torch.set_num_threads(1)
        device = self.s.device
        self.model = TinyRealtimeModel(
            seed=self.ctx.seed, device=device, silence_threshold=self.s.silence_threshold
        )
        self.processor = self.model.processor

    def start(self) -> None:
        s = self.s
        try:
            self.session = self.model.create_realtime_session(
                self.processor,
                initial_prompt=s.initial_prompt,
                frame_queue_size=s.frame_queue_size,
                max_tokens_per_turn=s.max_tokens_per_turn,
                max_new_tokens=s.max_new_tokens,
                do_sample=s.do_sample,
            )
        except TypeError as exc:
            raise WorkloadError(
                f"workload: create_realtime_session rejected the settings: {exc}"
            ) from exc
        self.session.start()

    def close(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.close()
        if self._prev_threads is not None:
            import torch

            torch.set_num_threads(self._prev_threads)
            self._prev_threads = None

    def describe(self) -> dict[str, Any]:
        s = self.s
        return {
            "model": s.model_path or "tiny-realtime (built-in, random weights)",
            "model_class": type(self.model).__name__ if self.model is not None else None,
            "initial_prompt": s.initial_prompt,
            "frame_queue_size": s.frame_queue_size,
            "max_tokens_per_turn": s.max_tokens_per_turn,
            "max_new_tokens": s.max_new_tokens,
            "do_sample": s.do_sample,
            "device": s.device,
            "dtype": s.dtype,
            "attn_implementation": s.attn_implementation,
            "trust_remote_code": s.trust_remote_code,
            "hidden_stages": ["pre", "infer", "decode"],
            "silence_threshold": s.silence_threshold if s.model_path is None else None,
            "torch_threads": 1 if self._prev_threads is not None else None,
        }

    # --- the hot path
    def _image(self, frame: Frame) -> Any:
        """Frames are BGR (OpenCV); models are given RGB."""
        import cv2

        rgb = cv2.cvtColor(frame.image, cv2.COLOR_BGR2RGB)
        if not self._pil:
            return rgb
        from PIL import Image

        return Image.fromarray(rgb)

    def push(self, frame: Frame) -> PushResult:
        if self._t0_ns is None:
            self._t0_ns = frame.t_capture_ns
        timestamp = (frame.t_capture_ns - self._t0_ns) / 1e9
        dropped = bool(self.session.push_frame(self._image(frame), timestamp))
        pending = getattr(self.session, "pending_frames", None)
        if callable(pending):
            pending = pending()
        return PushResult(dropped=dropped, pending=None if pending is None else int(pending))

    def poll(self, timeout_s: float) -> list[SessionOutput]:
        chunks = _chunks(self.session.poll_output(timeout_s))
        now = time.perf_counter_ns()
        return [SessionOutput(text=c, kind=classify_chunk(c), t_ns=now) for c in chunks]


def build(settings: SessionWorkloadSettings, ctx: WorkloadContext) -> RealtimeSessionWorkload:
    """The session workload; checkpoint problems are raised here, before anything loads."""
    if settings.model_path is not None:
        check_checkpoint(settings.model_path, settings.trust_remote_code)
    return RealtimeSessionWorkload(settings, ctx)
