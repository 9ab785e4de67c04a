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
arrive), and the stages soakd itself hands the session (``StageTrace``): the processor soakd
passes to ``create_realtime_session`` is wrapped (``TimedProcessor``) so its call is ``pre``
and its tokenizer's ``decode`` is ``decode``, and the model's forward (one step of the
realtime loop: ``_real_time_sample`` calls ``self(**inputs)``) is timed by torch forward hooks
(``infer``; on CUDA the hook synchronises first). A frame's stages are the processor call that
took it and the steps and detokenisations up to the model's first output after it. Nothing of
the authors' code is changed. A model without a torch module to hook has them NULL.

**Outputs the loop inserts.** The same trace tells model outputs (the text the last
detokenisation made) from items the loop puts itself: ``<|round_start|>`` when a question
arrives, and the ``<|silence|>`` MOSS-VL-Realtime adds when a question and frames arrive
together (their ``_update_model_kwargs_for_real_time_generation``). soakd swaps the session's
``_output_queue`` for a ``queue.Queue`` subclass that tags each item as it is put; inserted
ones come back with ``SessionOutput.inserted`` and are never a frame's answer nor silence.

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

import importlib.util
import json
import math
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from soakd.records import Frame
from soakd.workloads.base import (
    Consumed,
    FrameStages,
    PushResult,
    SessionFailed,
    SessionOutput,
    WorkloadContext,
    WorkloadError,
)
from soakd.workloads.session_settings import SessionWorkloadSettings
from soakd.workloads.tiny_session import TinyRealtimeModel

SILENCE_TOKEN = "<|silence|>"
_CONTROL_RE = re.compile(r"<\|[^|<>]*\|>")
#: frames the stage trace holds while it waits for a processor call or a model output
MAX_TRACKED = 4096


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


def attention_backend(settings: SessionWorkloadSettings) -> str | None:
    """``attn_implementation`` as loaded: ``"auto"`` resolves as the authors' runner does
    (``device_utils.resolve_attn_impl``): ``flash_attention_2`` on CUDA, else ``eager``;
    flash_attention_2 without the flash_attn package is a WorkloadError naming the fix."""
    name = settings.attn_implementation
    if name == "auto":
        name = "flash_attention_2" if settings.device.startswith("cuda") else "eager"
    if name == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        how = "'auto' on CUDA means" if settings.attn_implementation == "auto" else "needs"
        raise WorkloadError(
            f"workload.attn_implementation: {how} flash_attention_2 (the authors' runner's "
            "choice) but flash_attn is not installed; install flash-attn or set "
            "workload.attn_implementation = 'sdpa'"
        )
    return name


def load_realtime_model(settings: SessionWorkloadSettings, ctx: WorkloadContext) -> tuple[Any, Any]:
    """Load model and processor from ``settings.model_path`` (a local checkpoint)."""
    assert settings.model_path is not None
    path = check_checkpoint(settings.model_path, settings.trust_remote_code)
    from transformers import AutoModelForCausalLM, AutoProcessor

    kwargs: dict[str, Any] = {
        "trust_remote_code": settings.trust_remote_code,
        "dtype": _torch_dtype(settings.dtype),
    }
    attn = attention_backend(settings)
    if attn:
        kwargs["attn_implementation"] = attn
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

    def __init__(self, maxsize: int, on_take: Callable[[int], None] | None = None) -> None:
        super().__init__(maxsize)
        self._ids: dict[float, int] = {}
        self._pusher = threading.get_ident()
        self.taken: queue.SimpleQueue[Consumed] = queue.SimpleQueue()
        self.on_take = on_take  # the model took this frame (``StageTrace.took``)

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
            if not dropped and self.on_take is not None:
                self.on_take(fid)
        return item


def track_consumes(
    session: Any, on_take: Callable[[int], None] | None = None
) -> StampedQueue | None:
    """Swap the session's empty ``_frame_queue`` (a ``queue.Queue``, as MOSS-VL-Realtime's
    is) for a ``StampedQueue`` of the same size; None when it has no such queue."""
    return _swap_queue(session, "_frame_queue", lambda size: StampedQueue(size, on_take))


class StageTrace:
    """The session loop as soakd's hooks see it: the frames the model takes, the processor
    calls, model steps and detokenisations, and the outputs put. Every event comes from the
    generation thread, in order; ``done`` is read by soakd's driver."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync  # waits for the device at the end of a step (CUDA)
        self.done: queue.SimpleQueue[FrameStages] = queue.SimpleQueue()
        self._taken: deque[int] = deque(maxlen=MAX_TRACKED)  # taken, before their processor call
        self._open: deque[tuple[tuple[int, ...], float]] = deque(maxlen=MAX_TRACKED)
        self._infer_ns = 0  # steps and detokenisation since the last model output
        self._decode_ns = 0
        self._text: str | None = None  # what the last detokenisation made, not yet put
        self._step_t0 = 0
        self.decodes = 0

    def took(self, frame_id: int) -> None:
        self._taken.append(frame_id)

    def pre(self, dt_ns: int) -> None:
        """A processor call: the frames taken since the last one are what it processed."""
        if self._taken:
            self._open.append((tuple(self._taken), dt_ns / 1e6))
            self._taken.clear()

    def step_start(self, *_: Any) -> None:
        self._step_t0 = time.perf_counter_ns()

    def step_end(self, *_: Any) -> None:
        if self.sync is not None:
            self.sync()
        self._infer_ns += time.perf_counter_ns() - self._step_t0

    def decoded(self, dt_ns: int, text: Any) -> None:
        self._decode_ns += dt_ns
        self._text = text if isinstance(text, str) else None
        self.decodes += 1

    def put(self, item: Any) -> bool:
        """``item`` is being put on the output queue: True when it is the text the last
        detokenisation made (a model output, which settles the frames processed before it),
        False when the loop inserted it; True while no detokenisation was ever seen."""
        if not self.decodes:
            return True
        if self._text is None or item != self._text:
            return False
        self._text = None
        infer, decode = self._infer_ns / 1e6, self._decode_ns / 1e6
        for fids, pre in self._open:
            for fid in fids:
                self.done.put(FrameStages(fid, pre, infer, decode))
        self._open.clear()
        self._infer_ns = self._decode_ns = 0
        return True


class TimedTokenizer:
    """The processor's tokenizer with ``decode`` timed (the ``decode`` stage); the rest is
    the tokenizer's own."""

    def __init__(self, tokenizer: Any, trace: StageTrace) -> None:
        self._tokenizer = tokenizer
        self._trace = trace

    def decode(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        text = self._tokenizer.decode(*args, **kwargs)
        self._trace.decoded(time.perf_counter_ns() - t0, text)
        return text

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tokenizer(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


class TimedProcessor:
    """What soakd hands to ``create_realtime_session``: the model's processor with its call
    timed (the ``pre`` stage) and its tokenizer a ``TimedTokenizer``; the rest is its own."""

    def __init__(self, processor: Any, trace: StageTrace) -> None:
        self._processor = processor
        self._trace = trace
        tok = getattr(processor, "tokenizer", None)
        self.tokenizer = None if tok is None else TimedTokenizer(tok, trace)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = self._processor(*args, **kwargs)
        self._trace.pre(time.perf_counter_ns() - t0)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._processor, name)


class TaggedQueue(queue.Queue):  # type: ignore[type-arg]
    """The session's output queue: each item is tagged as it is put with whether the model
    made it (``StageTrace.put``; False: the loop inserted it) and when (the putting thread's
    clock); ``tags`` gets the tags of the items taken, in order."""

    def __init__(self, maxsize: int, trace: StageTrace) -> None:
        super().__init__(maxsize)
        self.trace = trace
        self._queued: deque[tuple[bool, int]] = deque()
        self.tags: deque[tuple[bool, int]] = deque()

    def _put(self, item: Any) -> None:  # called by put() with self.mutex held
        self._queued.append((self.trace.put(item), time.perf_counter_ns()))
        super()._put(item)

    def _get(self) -> Any:
        item = super()._get()
        self.tags.append(self._queued.popleft() if self._queued else (True, 0))
        return item


def track_outputs(session: Any, trace: StageTrace) -> TaggedQueue | None:
    """Swap the session's empty ``_output_queue`` (a ``queue.Queue``) for a ``TaggedQueue``;
    None when it has no such queue (its outputs are then all taken as the model's)."""
    return _swap_queue(session, "_output_queue", lambda size: TaggedQueue(size, trace))


Q = TypeVar("Q", bound=queue.Queue)  # type: ignore[type-arg]


def _swap_queue(session: Any, name: str, make: Callable[[int], Q]) -> Q | None:
    """Replace the session's attribute ``name``, an empty plain ``queue.Queue``, with
    ``make(its maxsize)``; None (and nothing changed) when it is anything else."""
    q = getattr(session, name, None)
    if type(q) is not queue.Queue or q.qsize():
        return None
    swapped = make(q.maxsize)
    setattr(session, name, swapped)
    return swapped


def step_module(model: Any) -> Any:
    """The torch module whose forward is one step of the session loop: the model itself
    (MOSS-VL-Realtime's ``_real_time_sample`` calls ``self(**inputs)``), else the model's
    ``step_module`` attribute (the built-in tiny model); None when there is none."""
    import torch

    if isinstance(model, torch.nn.Module):
        return model
    m = getattr(model, "step_module", None)
    return m if isinstance(m, torch.nn.Module) else None


def device_sync(device: str) -> Callable[[], None] | None:
    """``torch.cuda.synchronize`` for a CUDA device (a step ends when its kernels do)."""
    if not device.startswith("cuda"):
        return None
    import torch

    dev = torch.device(device)
    return lambda: torch.cuda.synchronize(dev)


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
        self.outputs: TaggedQueue | None = None
        self.trace = StageTrace(device_sync(settings.device))
        self._hooks: list[Any] = []  # torch hook handles timing the model step
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
        trace = self.trace
        try:
            self.session = self.model.create_realtime_session(
                TimedProcessor(self.processor, trace), **self.session_kwargs()
            )
        except TypeError as exc:
            raise WorkloadError(
                f"workload: create_realtime_session rejected the settings: {exc}"
            ) from exc
        self.stamps = track_consumes(self.session, trace.took)
        self.outputs = track_outputs(self.session, trace)
        module = step_module(self.model)
        if module is not None and self.stamps is not None:
            self._hooks = [
                module.register_forward_pre_hook(trace.step_start),
                module.register_forward_hook(trace.step_end),
            ]
        self.session.start()

    @property
    def stages_timed(self) -> bool:
        """pre / infer / decode are timed per frame (a torch step module and a frame queue)."""
        return bool(self._hooks)

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
            for handle in self._hooks:
                handle.remove()
            self._hooks = []
            if self._prev_threads is not None:
                import torch

                torch.set_num_threads(self._prev_threads)
                self._prev_threads = None

    def describe(self) -> dict[str, Any]:
        s, tiny = self.s, self.s.model_path is None
        # described before start(): what the hooks will time (the summary says what they did)
        hookable = self.model is not None and step_module(self.model) is not None
        timed = ["pre", "infer", "decode"] if hookable else []
        return {
            "model": s.model_path or "tiny-realtime (built-in, random weights)",
            "builtin": tiny,
            "model_class": type(self.model).__name__ if self.model is not None else None,
            "initial_prompt": s.initial_prompt,
            "system_prompt": s.system_prompt,
            "frame_queue_size": s.frame_queue_size,
            "max_tokens_per_turn": s.max_tokens_per_turn,
            "max_new_tokens": s.max_new_tokens,
            "do_sample": s.do_sample,
            "generate_kwargs": dict(s.generate_kwargs),
            "device": s.device,
            "dtype": "float32 (built-in)" if tiny else s.dtype,
            "attn_implementation": None if tiny else attention_backend(s),
            "attn_implementation_setting": s.attn_implementation,
            "trust_remote_code": s.trust_remote_code,
            "timed_stages": timed,
            "hidden_stages": [st for st in ("pre", "infer", "decode") if st not in timed],
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
        tags = self._tags(len(chunks))
        return [
            SessionOutput(c, classify_chunk(c), now, inserted=not m, t_made_ns=t or None)
            for c, (m, t) in zip(chunks, tags, strict=True)
        ]

    def _tags(self, n: int) -> list[tuple[bool, int]]:
        """(made by the model, put at) of the last ``n`` items taken from the output queue
        (made, unknown time when they cannot be told apart)."""
        tags = self.outputs.tags if self.outputs is not None else deque()
        got = [tags.popleft() for _ in range(len(tags))]
        return got if len(got) == n else [(True, 0)] * n

    def stages(self) -> list[FrameStages] | None:
        """The stages of frames the model answered since the last call (processor call,
        model steps and detokenisation up to its first output); None when not timed."""
        if not self.stages_timed:
            return None
        out: list[FrameStages] = []
        done = self.trace.done
        while not done.empty():
            out.append(done.get_nowait())
        return out

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
        attention_backend(settings)
    return RealtimeSessionWorkload(settings, ctx)
