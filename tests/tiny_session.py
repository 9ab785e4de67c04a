"""The CI stand-in for MOSS-VL-Realtime's realtime session, on top of soakd's tiny LM.

It mirrors the authors' remote code (``modeling_moss_vl.py`` in the MOSS-VL-Realtime-0708
checkpoint, as stored by ``Joiin0392/moss-npu-adaptations``; not copied here; docs/upstream.md
names the version and its sha256) call for call, so a change in soakd's session shape that
breaks the real API fails CI (``bench/upstream_check.py --moss`` compares these signatures
with the real file, ``ast``, no import):

* ``ScriptedModel.create_realtime_session`` mirrors
  ``MossVLForConditionalGeneration.create_realtime_session(processor, *, initial_prompt="",
  system_prompt=None, frame_queue_size=256, max_tokens_per_turn=86400, **generate_kwargs)``;
* ``ScriptedSession`` mirrors ``MossVLRealtimeSession``: ``start()`` (refused while the model's
  ``continue_generating`` is set: one realtime loop per model), ``active``, ``pending_frames``
  (``_frame_queue.qsize()``), ``push_frame(image, timestamp=None, *, drop_oldest=True) ->
  bool`` (starts the session if needed; no timestamp: seconds since ``start()``; True: the
  oldest queued frame was dropped, taken with ``get_nowait()`` on the pushing thread),
  ``push_prompt(prompt)``, ``poll_output(timeout=0.0)`` (starts the session if needed; raises
  once the generation thread has died), ``close(timeout=5.0)`` (``stop_real_time_generate()``
  on the model, then ``TimeoutError``, or re-raises the generation thread's failure ``from``
  it);
* its generation thread mirrors ``MossVLRealtimeSession._run`` (``start_real_time_generate()``,
  then the loop, then ``stop_real_time_generate()``),
  ``MossVLForConditionalGeneration._real_time_sample`` (loops while ``continue_generating``)
  and ``_update_model_kwargs_for_real_time_generation``, in their order: a model step (the
  model's ``step_module`` forward; upstream ``self(**inputs)``), ``processor.tokenizer.decode``
  of what it made, that text put on ``_output_queue``, the step paced to at most
  ``max_tokens_per_turn`` steps per second (a rate cap), then every queued prompt and frame
  drained with ``get_nowait()``: a prompt puts ``<|round_start|>``, a prompt drained together
  with frames also puts ``<|silence|>`` (both inserted by the loop, not decoded), and the
  frames go through one ``processor(images=...)`` call; the next step ingests them. The first
  step, before any input, says ``<|silence|>`` (unless ``talk``), as upstream's first token
  after the prompt's prefill is, so a model output always comes before the first drain. Where
  upstream busy-waits after ``<|silence|>`` with nothing queued, this one sleeps 5 ms between
  looks, unless ``busy_wait`` (below).

Planted behaviour gives the tests a known truth:

* ``script``: the kind of the answer to each consumed frame, cycling ("t" = text, "s" =
  ``<|silence|>``), so the silence ratio is known in advance;
* ``talk``: the model keeps talking: a text chunk every step whether or not a frame came,
  as MOSS-VL-Realtime does while it describes a scene;
* ``frame_cost_s``: the step after frames were drained sleeps this long first, inside the
  model step (the vision tower's work on them), so the first output after a consume and the
  frame's ``infer_ms`` are at least that long;
* ``busy_wait``: with nothing to say and nothing queued, spin in Python as upstream does (its
  ``continue``), holding the GIL, instead of sleeping;
* ``die_on_frame``: the generation thread raises ``ValueError`` when it drains that frame
  (1-based), and the session is no longer ``active``;
* ``gate``: a ``threading.Event`` the test holds; steps wait for it;
* ``stall_after``: after answering this many frames the session stops answering;
* ``start_after_pushes``: the session consumes nothing until that many frames were pushed, so
  with ``frame_queue_size = q`` exactly ``start_after_pushes - q`` frames are dropped.

``factory(options, ctx)`` builds a ``session`` workload over it for ``kind = "python"``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any

import torch

from soakd.config import SessionWorkloadSettings
from soakd.workloads.base import WorkloadContext
from soakd.workloads.session import RealtimeSessionWorkload
from soakd.workloads.tiny_session import SILENCE, TinyLM, TinyProcessor

ROUND_START = "<|round_start|>"
SILENCE_ID = 256  # the byte tokenizer's <|silence|>
ANSWER = "Yes, I see it."  # the answer to every question


class StepModule(torch.nn.Module):
    """One step of the loop as a torch module (upstream: the model's own ``forward``): the
    planted frame cost, then the tiny LM's greedy decode of ``n`` tokens (none: a prefill)."""

    def __init__(self, lm: TinyLM) -> None:
        super().__init__()
        self.tiny = lm
        self.lm = lm.lm

    def forward(self, embeds: Any, n: int, cost_s: float = 0.0) -> list[int]:
        if cost_s:
            time.sleep(cost_s)
        if n == 0:
            self.tiny.prefill(embeds)
            return []
        return self.tiny.generate(embeds, n)


class ScriptedSession:
    """``MossVLRealtimeSession`` (see the module docstring)."""

    def __init__(
        self,
        model: ScriptedModel,
        processor: TinyProcessor,
        *,
        initial_prompt: str = "",
        system_prompt: str | None = None,
        frame_queue_size: int = 256,
        max_tokens_per_turn: int = 86400,
        **generate_kwargs: Any,
    ) -> None:
        if frame_queue_size < 1:
            raise ValueError("frame_queue_size must be at least 1")
        if max_tokens_per_turn < 1:
            raise ValueError("max_tokens_per_turn must be at least 1")
        self.model = model
        self.processor = processor
        self.prompt_ids = processor.tokenizer.encode(initial_prompt)[:32]
        self.system_prompt = system_prompt
        self.max_tokens_per_turn = max_tokens_per_turn
        self.generate_kwargs = dict(generate_kwargs)
        self._frame_queue: queue.Queue[tuple[Any, float]] = queue.Queue(frame_queue_size)
        self._prompt_queue: queue.Queue[str] = queue.Queue()
        self._output_queue: queue.Queue[str] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._closed = threading.Event()
        self._error: BaseException | None = None
        self._started_at: float | None = None
        self._last_timestamp: float | None = None
        self.pushes = 0
        self.drained = 0  # frames taken by the generation thread
        self.accepted = 0  # frames taken to be answered
        self.answered = 0  # frames answered (ingested by a model step)
        self._ingest: list[Any] = []  # frames processed, for the next step
        self.timestamps: list[float] = []
        self._pushed_enough = threading.Event()

    @property
    def active(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._done.is_set()

    @property
    def pending_frames(self) -> int:
        return self._frame_queue.qsize()

    def start(self) -> ScriptedSession:
        if self._closed.is_set():
            raise RuntimeError("Cannot start a closed realtime session")
        if self._thread is not None:
            return self
        if self.model.continue_generating:
            raise RuntimeError("This model already has an active realtime generation loop")
        self._started_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="test-session", daemon=True)
        self._thread.start()
        return self

    def push_frame(
        self, image: Any, timestamp: float | None = None, *, drop_oldest: bool = True
    ) -> bool:
        if self._closed.is_set():
            raise RuntimeError("Realtime session is closed")
        if image is None:
            raise ValueError("image must not be None")
        if self._started_at is None:
            self.start()
        assert self._started_at is not None
        ts = float(time.monotonic() - self._started_at if timestamp is None else timestamp)
        if self._last_timestamp is not None and ts < self._last_timestamp:
            raise ValueError(f"Frame timestamps must be non-decreasing: {ts}")
        self._last_timestamp = ts
        self.timestamps.append(ts)
        self.pushes += 1
        if self.pushes >= self.model.start_after_pushes:
            self._pushed_enough.set()
        dropped = False
        while True:
            try:
                self._frame_queue.put_nowait((image, ts))
                return dropped
            except queue.Full:
                if not drop_oldest:
                    raise
            try:
                self._frame_queue.get_nowait()
                dropped = True
            except queue.Empty:
                pass

    def push_prompt(self, prompt: str) -> None:
        if self._closed.is_set():
            raise RuntimeError("Realtime session is closed")
        if not prompt:
            raise ValueError("prompt must not be empty")
        if self._thread is None:
            self.start()
        self._prompt_queue.put_nowait(str(prompt))

    def poll_output(self, timeout: float = 0.0) -> str | None:
        if timeout < 0:
            raise ValueError("timeout must be non-negative")
        if self._thread is None:
            self.start()
        try:
            if timeout == 0:
                return self._output_queue.get_nowait()
            return self._output_queue.get(timeout=timeout)
        except queue.Empty:
            self._raise_if_failed()
            return None

    def _raise_if_failed(self) -> None:
        if self._done.is_set() and self._error is not None:
            raise RuntimeError("MOSS-VL realtime generation failed") from self._error

    def close(self, timeout: float | None = 5.0) -> None:
        self._closed.set()
        if self._thread is None:
            self._done.set()
            return
        self.model.stop_real_time_generate()
        self.model.gate.set()
        self._thread.join(timeout=timeout)
        if self._thread.is_alive():
            raise TimeoutError("Realtime generation did not stop before the timeout")
        self._raise_if_failed()

    # --- the generation thread (``_real_time_sample``)
    def _run(self) -> None:
        try:
            while not self._pushed_enough.wait(0.05):
                if self._closed.is_set():
                    return
            self.model.start_real_time_generate()
            try:
                self._sample()
            finally:
                self.model.stop_real_time_generate()
        except BaseException as exc:
            self._error = exc
        finally:
            self._done.set()

    def _sample(self) -> None:
        m, said = self.model, deque[list[int]]()
        if not m.talk:  # the first token after the prompt's prefill (upstream: <|silence|>)
            said.append([SILENCE_ID])
        while m.continue_generating and not self._closed.is_set():
            m.gate.wait()
            t_step = time.monotonic()
            ids = self._step(said)
            if ids is not None:  # decode what the step made, put it (upstream's order)
                self._output_queue.put(self.processor.tokenizer.decode(ids))
            wait = 1.0 / self.max_tokens_per_turn - (time.monotonic() - t_step)
            if wait > 0:
                time.sleep(wait)
            if not self._drain(said):
                self._idle(said)

    def _step(self, said: deque[list[int]]) -> list[int] | None:
        """One model step: ingest the frames processed at the last drain (their answers
        queue up, one a step), else say the next queued answer, else talk on; None when
        there is nothing to do (no step)."""
        m = self.model
        if self._ingest:
            frames, self._ingest = self._ingest, []
            for patches in frames:
                embeds = m.lm.embed(self.prompt_ids, patches)
                silent = m.script[self.answered % len(m.script)] == "s"
                ids = m.step_module(embeds, 0 if silent else 3, m.frame_cost_s)
                said.append([SILENCE_ID] if silent else ids)
                self.answered += 1
        if said:
            return said.popleft()
        if m.talk:
            return list(m.step_module(m.lm.embed(self.prompt_ids, m.blank), 1))
        return None

    def _idle(self, said: deque[list[int]]) -> None:
        """Nothing drained: wait for input (upstream busy-waits after <|silence|>)."""
        if said or self._ingest or self.model.talk:
            return
        if self.model.busy_wait:
            while self._frame_queue.empty() and self._prompt_queue.empty():
                if self._closed.is_set() or not self.model.continue_generating:
                    return
        else:
            time.sleep(0.005)

    def _drain(self, said: deque[list[int]]) -> bool:
        """Take every queued prompt and frame (``get_nowait``): a prompt puts
        ``<|round_start|>`` and queues its answer; a prompt with frames also puts the
        ``<|silence|>`` upstream inserts; the frames go through one processor call."""
        m = self.model
        prompts = 0
        while not self._prompt_queue.empty():
            self._prompt_queue.get_nowait()
            self._output_queue.put(ROUND_START)
            said.append(self.processor.tokenizer.encode(ANSWER))
            prompts += 1
        frames = []
        while not self._frame_queue.empty():
            try:
                frames.append(self._frame_queue.get_nowait()[0])
            except queue.Empty:
                break
        for _ in frames:
            self.drained += 1
            if m.die_on_frame is not None and self.drained >= m.die_on_frame:
                raise ValueError(f"planted: the vision tower failed on frame {self.drained}")
            if m.stall_after is not None and self.accepted >= m.stall_after:
                self._closed.wait()  # stops answering, like a hung model
                return True
            self.accepted += 1
        if prompts and frames:
            self._output_queue.put(SILENCE)  # upstream's own, matching its training data
        if frames:
            self._ingest = [patches for patches, _ in self.processor(images=frames)]
        return bool(prompts or frames)


class ScriptedModel:
    """The model object: ``MossVLForConditionalGeneration.create_realtime_session``."""

    def __init__(
        self,
        script: str = "t",
        stall_after: int | None = None,
        start_after_pushes: int = 0,
        seed: int = 0,
        *,
        talk: bool = False,
        frame_cost_s: float = 0.0,
        die_on_frame: int | None = None,
        busy_wait: bool = False,
    ) -> None:
        assert script and set(script) <= {"s", "t"}
        self.script = script
        self.stall_after = stall_after
        self.start_after_pushes = start_after_pushes
        self.talk = talk
        self.frame_cost_s = frame_cost_s
        self.die_on_frame = die_on_frame
        self.busy_wait = busy_wait
        # one intra-op thread while the model lives, as soakd's own tiny models do: OpenMP
        # spin-waiting beside the run's other threads makes turns 30x slower on 2 cores
        self.prev_threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self.lm = TinyLM(seed)
        self.step_module = StepModule(self.lm)  # soakd times its forward (infer)
        self.processor = TinyProcessor()
        self.blank = self.processor.frame_arrays(torch.zeros(8, 8, 3, dtype=torch.uint8))[0]
        self.gate = threading.Event()
        self.gate.set()
        self.sessions: list[ScriptedSession] = []
        # ``MossVLForConditionalGeneration.continue_generating``: the realtime loop's flag
        self.continue_generating = False

    def start_real_time_generate(self) -> None:
        self.continue_generating = True

    def stop_real_time_generate(self) -> None:
        self.continue_generating = False

    def create_realtime_session(
        self,
        processor: TinyProcessor,
        *,
        initial_prompt: str = "",
        system_prompt: str | None = None,
        frame_queue_size: int = 256,
        max_tokens_per_turn: int = 86400,
        **generate_kwargs: Any,
    ) -> ScriptedSession:
        session = ScriptedSession(
            self,
            processor,
            initial_prompt=initial_prompt,
            system_prompt=system_prompt,
            frame_queue_size=frame_queue_size,
            max_tokens_per_turn=max_tokens_per_turn,
            **generate_kwargs,
        )
        self.sessions.append(session)
        return session


_MODEL_OPTIONS = ("talk", "frame_cost_s", "die_on_frame", "busy_wait")


def factory(options: dict[str, Any], ctx: WorkloadContext) -> RealtimeSessionWorkload:
    """``kind = "python"``: options ``script``, ``stall_after``, ``start_after_pushes``,
    ``talk``, ``frame_cost_s``, ``die_on_frame``, ``busy_wait`` and any session setting."""
    opts = dict(options)
    planted = {k: opts.pop(k) for k in _MODEL_OPTIONS if k in opts}
    model = ScriptedModel(
        opts.pop("script", "t"),
        opts.pop("stall_after", None),
        opts.pop("start_after_pushes", 0),
        ctx.seed,
        **planted,
    )
    settings = SessionWorkloadSettings(**opts)
    return RealtimeSessionWorkload(settings, ctx, model=model, processor=model.processor)
