"""Session workloads: any model with MOSS-VL-Realtime's realtime interface.

The model is loaded with ``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=...,
dtype=..., attn_implementation=...)`` and its processor with ``AutoProcessor``; soakd then
calls ``model.create_realtime_session(processor, initial_prompt=..., system_prompt=...,
frame_queue_size=..., max_tokens_per_turn=..., **generate_kwargs)`` (``generate_kwargs`` =
``do_sample``, ``max_new_tokens`` and ``workload.generate_kwargs``), ``session.start()``, and
for each paced frame ``session.push_frame(image, timestamp)`` (True when the session dropped
its oldest pending frame), ``session.pending_frames``, ``session.active`` and, from a poller
thread, ``session.poll_output(timeout)``; ``workload.questions`` go in with
``session.push_prompt(text)``.

What soakd can truly see is recorded (push time, drops, pending frames, outputs and when they
arrive); the stages the model hides (preprocess, infer, decode) are unknown and stored as NULL.

**When the model takes a frame.** The real session gives no signal of it: its generation
thread drains ``session._frame_queue`` (a ``queue.Queue``) with ``get_nowait()`` after every
token. soakd replaces that queue, before ``start()``, with a ``queue.Queue`` subclass of the
same size whose ``_get`` hook stamps each frame taken (``consumed()``); a take on the pushing
thread is ``push_frame`` dropping the oldest frame, not a consume. Watching
``pending_frames`` fall was the alternative: it only samples (a frame taken between two
samples is timed late by up to the poll interval) and a drop briefly lowers the count too, so
it would invent times. A session without a ``queue.Queue`` named ``_frame_queue`` has no
consume times (NULL, ``consume_tracking`` null in ``describe()``).

**A dead generation thread.** ``active`` is checked after every push; once it is False the
session is closed and its error (``close()`` re-raises it) ends the run as ``SessionFailed``
with the cause named. ``poll_output`` raising and ``close()`` raising at the end are reported
the same way.

With ``model_path`` unset the built-in tiny model of :mod:`soakd.workloads.tiny_session` is
used, so the whole path runs offline. Checkpoint problems (a path that does not exist, no
``config.json``, custom code while ``trust_remote_code`` is off, a model without
``create_realtime_session``) raise a one-line ``WorkloadError`` before the run starts.
"""

from __future__ import annotations

import json
import math
import queue
import re
import threading
import time
from pathlib import Path
from typing import Any, Literal

from soakd.config import SessionWorkloadSettings
from soakd.records import Frame
from soakd.workloads.base import (
    Consumed,
    PushResult,
    SessionFailed,
    SessionOutput,
    WorkloadContext,
    WorkloadError,
)
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


def failure_text(exc: BaseException) -> str:
    """One line naming an exception and what caused it: the real session's ``close()`` and
    ``poll_output()`` raise ``RuntimeError("MOSS-VL realtime generation failed")`` *from* the
    generation thread's own error, which is the part worth reading."""
    parts: list[str] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen and len(parts) < 4:
        seen.add(id(cur))
        parts.append(_first_line(cur))
        cur = cur.__cause__ or cur.__context__
    return "; caused by ".join(parts)[:2000]


class StampedQueue(queue.Queue):  # type: ignore[type-arg]
    """A ``queue.Queue`` that stamps every ``(image, timestamp)`` item taken from it: by the
    model's generation thread (consumed) or by the pushing thread (``push_frame`` dropping
    its oldest frame). ``expect(timestamp, frame_id)`` names the frame pushed next."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self._ids: dict[float, int] = {}
        self._pusher = threading.get_ident()
        self.taken: queue.SimpleQueue[Consumed] = queue.SimpleQueue()

    def expect(self, timestamp: float, frame_id: int) -> None:
        with self.mutex:
            self._ids[float(timestamp)] = frame_id
            self._pusher = threading.get_ident()

    def _get(self) -> Any:  # called by get()/get_nowait() with self.mutex held
        item = super()._get()
        t = time.perf_counter_ns()
        ts = item[1] if isinstance(item, tuple) and len(item) >= 2 else None
        fid = self._ids.pop(ts, None) if isinstance(ts, int | float) else None
        if fid is not None:
            dropped = threading.get_ident() == self._pusher
            self.taken.put(Consumed(fid, t, dropped))
        return item


def track_consumes(session: Any) -> StampedQueue | None:
    """Swap the session's empty ``_frame_queue`` (a ``queue.Queue``, as MOSS-VL-Realtime's
    is) for a ``StampedQueue`` of the same size; None when it has no such queue."""
    q = getattr(session, "_frame_queue", None)
    if type(q) is not queue.Queue or q.qsize():
        return None
    stamped = StampedQueue(q.maxsize)
    session._frame_queue = stamped
    return stamped


def downscale(rgb: Any, max_pixels: int | None) -> Any:
    """``rgb`` resized (area, aspect kept) to at most ``max_pixels`` pixels; as is when it
    already fits or no limit is set."""
    h, w = rgb.shape[:2]
    if max_pixels is None or h * w <= max_pixels:
        return rgb
    import cv2

    f = math.sqrt(max_pixels / (h * w))
    size = (max(1, int(w * f)), max(1, int(h * f)))
    return cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)


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
        self.stamps: StampedQueue | None = None
        self.failure: str | None = None  # the session's death, once reported
        self._t0_ns: int | None = None
        self._prev_threads: int | None = None
        self._pil = False  # real processors take PIL images; the tiny model takes arrays

    @property
    def response_timeout_s(self) -> float:
        return self.s.response_timeout_s

    @property
    def poll_timeout_s(self) -> float:
        return self.s.poll_timeout_s

    @property
    def questions(self) -> list[tuple[float, str]]:
        """``workload.questions`` as (seconds after the run starts, text)."""
        return [(q.at_s, q.text) for q in self.s.questions]

    # --- lifecycle
    def setup(self) -> None:
        tiny = self.model is None and self.s.model_path is None
        self._set_threads(self.s.torch_threads or (1 if tiny else None))
        if self.model is None:
            if tiny:
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

    def _set_threads(self, n: int | None) -> None:
        """torch intra-op threads while the session lives (restored on close). The tiny
        model defaults to 1: its ops gain nothing from more, and OpenMP spin-waiting beside
        the pacer, sampler, writer and poller threads made turns 30x slower on 2 cores."""
        if n is None:
            return
        import torch

        self._prev_threads = torch.get_num_threads()
        torch.set_num_threads(n)

    def _setup_tiny(self) -> None:
        self.model = TinyRealtimeModel(
            seed=self.ctx.seed, device=self.s.device, silence_threshold=self.s.silence_threshold
        )
        self.processor = self.model.processor

    def session_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``create_realtime_session`` (``system_prompt`` only when
        set, so sessions written before it existed still take the call)."""
        s = self.s
        kw: dict[str, Any] = {
            "initial_prompt": s.initial_prompt,
            "frame_queue_size": s.frame_queue_size,
            "max_tokens_per_turn": s.max_tokens_per_turn,
            "max_new_tokens": s.max_new_tokens,
            "do_sample": s.do_sample,
            **s.generate_kwargs,
        }
        if s.system_prompt is not None:
            kw["system_prompt"] = s.system_prompt
        return kw

    def start(self) -> None:
        try:
            self.session = self.model.create_realtime_session(
                self.processor, **self.session_kwargs()
            )
        except TypeError as exc:
            raise WorkloadError(
                f"workload: create_realtime_session rejected the settings: {exc}"
            ) from exc
        self.stamps = track_consumes(self.session)
        self.session.start()

    def close(self) -> None:
        """Close the session (its error, if its thread died, is re-raised by ``close()``:
        raised here as ``SessionFailed`` naming the cause) and restore torch's threads."""
        session, self.session = self.session, None
        try:
            if session is not None:
                session.close()
        except Exception as exc:
            if self.failure is None:  # not already the reason the run ended
                raise SessionFailed(f"session close failed: {failure_text(exc)}") from exc
        finally:
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
            "system_prompt": s.system_prompt,
            "frame_queue_size": s.frame_queue_size,
            "max_tokens_per_turn": s.max_tokens_per_turn,
            "max_new_tokens": s.max_new_tokens,
            "do_sample": s.do_sample,
            "generate_kwargs": dict(s.generate_kwargs),
            "device": s.device,
            "dtype": s.dtype,
            "attn_implementation": s.attn_implementation,
            "trust_remote_code": s.trust_remote_code,
            "hidden_stages": ["pre", "infer", "decode"],
            "silence_threshold": s.silence_threshold if s.model_path is None else None,
            "torch_threads": s.torch_threads or (1 if self._prev_threads is not None else None),
            "max_pixels": s.max_pixels,
            "questions": len(s.questions),
            "consume_tracking": "frame_queue" if self.stamps is not None else None,
        }

    # --- the hot path
    def _image(self, frame: Frame) -> Any:
        """Frames are BGR (OpenCV); models are given RGB, at most ``max_pixels`` pixels."""
        import cv2

        rgb = downscale(cv2.cvtColor(frame.image, cv2.COLOR_BGR2RGB), self.s.max_pixels)
        if not self._pil:
            return rgb
        from PIL import Image

        return Image.fromarray(rgb)

    def push(self, frame: Frame) -> PushResult:
        """Push one frame; raises ``SessionFailed`` once the generation thread is dead."""
        if self._t0_ns is None:
            self._t0_ns = frame.t_capture_ns
        timestamp = (frame.t_capture_ns - self._t0_ns) / 1e9
        image = self._image(frame)
        if self.stamps is not None:
            self.stamps.expect(timestamp, frame.id)
        dropped = bool(self.session.push_frame(image, timestamp))
        if getattr(self.session, "active", True) is False:
            raise SessionFailed(self._death())
        pending = getattr(self.session, "pending_frames", None)
        if callable(pending):
            pending = pending()
        return PushResult(dropped=dropped, pending=None if pending is None else int(pending))

    def _death(self) -> str:
        """Close the dead session and name what killed it (``close()`` re-raises it)."""
        session, self.session = self.session, None
        self.failure = "the session's generation thread died (close() reported no error)"
        try:
            session.close()
        except Exception as exc:
            self.failure = f"the session's generation thread died: {failure_text(exc)}"
        return self.failure

    def poll(self, timeout_s: float) -> list[SessionOutput]:
        session = self.session
        if session is None:  # closed after its thread died; the driver is ending the run
            time.sleep(timeout_s)
            return []
        try:
            raw = session.poll_output(timeout_s)
        except Exception as exc:
            dead = getattr(session, "active", True) is False
            what = "the session's generation thread died" if dead else "session poll failed"
            self.failure = f"{what}: {failure_text(exc)}"
            raise SessionFailed(self.failure) from exc
        chunks = _chunks(raw)
        now = time.perf_counter_ns()
        return [SessionOutput(text=c, kind=classify_chunk(c), t_ns=now) for c in chunks]

    def consumed(self) -> list[Consumed] | None:
        """Frames the model took (or the session dropped) since the last call; None when
        this session's consumes cannot be seen (no ``queue.Queue`` frame queue)."""
        if self.stamps is None:
            return None
        out: list[Consumed] = []
        taken = self.stamps.taken
        while not taken.empty():
            out.append(taken.get_nowait())
        return out

    def ask(self, text: str) -> None:
        """Push a question into the running session (``push_prompt``)."""
        self.session.push_prompt(text)


def build(settings: SessionWorkloadSettings, ctx: WorkloadContext) -> RealtimeSessionWorkload:
    """The session workload; checkpoint problems are raised here, before anything loads."""
    if settings.model_path is not None:
        check_checkpoint(settings.model_path, settings.trust_remote_code)
    return RealtimeSessionWorkload(settings, ctx)
