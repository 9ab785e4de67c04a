"""A realtime session written in the tests, on top of soakd's tiny LM, with the methods and
semantics of MOSS-VL-Realtime's ``create_realtime_session`` and planted behaviour that gives
the tests a known truth:

* ``script``: the kind of each turn's answer, cycling ("t" = text, "s" = ``<|silence|>``), so
  the silence ratio is known in advance;
* ``gate``: a ``threading.Event`` the test holds; turns wait for it, so a test can fill the
  frame queue and know exactly how many frames the session drops, without timing;
* ``stall_after``: after this many turns the session stops answering (blocks until closed);
* ``start_after_pushes``: the session consumes nothing until that many frames were pushed, so
  with ``frame_queue_size = q`` exactly ``start_after_pushes - q`` frames are dropped.

``factory(options, ctx)`` builds a ``session`` workload over it for ``kind = "python"``.
"""

from __future__ import annotations

import collections
import queue
import threading
from typing import Any

import torch

from soakd.config import SessionWorkloadSettings
from soakd.workloads.base import WorkloadContext
from soakd.workloads.session import RealtimeSessionWorkload
from soakd.workloads.tiny_session import SILENCE, TinyLM, TinyProcessor


class ScriptedSession:
    def __init__(
        self,
        model: ScriptedModel,
        processor: TinyProcessor,
        *,
        initial_prompt: str,
        frame_queue_size: int,
        max_tokens_per_turn: int,
        max_new_tokens: int,
    ) -> None:
        self.model = model
        self.processor = processor
        self.prompt_ids = processor.tokenizer.encode(initial_prompt)[:32]
        self.frame_queue_size = frame_queue_size
        self.max_tokens_per_turn = max_tokens_per_turn
        self.max_new_tokens = max_new_tokens
        self.frames: collections.deque[tuple[Any, float]] = collections.deque()
        self.cond = threading.Condition()
        self.out: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.closed = threading.Event()
        self.turns = 0
        self.timestamps: list[float] = []
        self.pushes = 0
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="test-scripted-session", daemon=True)

    @property
    def pending_frames(self) -> int:
        with self.cond:
            return len(self.frames)

    def start(self) -> None:
        self.thread.start()

    def push_frame(self, image: Any, timestamp: float) -> bool:
        with self.cond:
            dropped = len(self.frames) >= self.frame_queue_size
            if dropped:
                self.frames.popleft()
            self.frames.append((image, timestamp))
            self.timestamps.append(timestamp)
            self.pushes += 1
            if self.pushes >= self.model.start_after_pushes:
                self.started.set()
            self.cond.notify()
        return dropped

    def poll_output(self, timeout: float | None = None) -> str | None:
        try:
            return self.out.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self.closed.set()
        self.model.gate.set()
        with self.cond:
            self.cond.notify_all()
        self.thread.join(5.0)
        torch.set_num_threads(self.model.prev_threads)

    def _loop(self) -> None:
        m = self.model
        while not self.started.wait(0.2):
            if self.closed.is_set():
                return
        while not self.closed.is_set():
            m.gate.wait()
            with self.cond:
                while not self.frames and not self.closed.is_set():
                    self.cond.wait(0.2)
                if self.closed.is_set():
                    return
                image, _ = self.frames.popleft()
            if m.stall_after is not None and self.turns >= m.stall_after:
                self.closed.wait()  # stops answering, like a hung model
                return
            self.out.put(self._turn(image))
            self.turns += 1

    def _turn(self, image: Any) -> str:
        patches, _ = self.processor.frame_arrays(image)
        embeds = self.model.lm.embed(self.prompt_ids, patches)
        if self.model.script[self.turns % len(self.model.script)] == "s":
            self.model.lm.prefill(embeds)
            return SILENCE
        ids = self.model.lm.generate(embeds, self.max_tokens_per_turn)
        return self.processor.tokenizer.decode(ids) or "."


class ScriptedModel:
    """The model object: ``create_realtime_session`` like MOSS-VL-Realtime."""

    def __init__(
        self,
        script: str = "t",
        stall_after: int | None = None,
        start_after_pushes: int = 0,
        seed: int = 0,
    ) -> None:
        assert script and set(script) <= {"s", "t"}
        self.script = script
        self.stall_after = stall_after
        self.start_after_pushes = start_after_pushes
        # one intra-op thread while the model lives, as soakd's own tiny models do: OpenMP
        # spin-waiting beside the run's other threads makes turns 30x slower on 2 cores
        self.prev_threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self.lm = TinyLM(seed)
        self.processor = TinyProcessor()
        self.gate = threading.Event()
        self.gate.set()
        self.sessions: list[ScriptedSession] = []

    def create_realtime_session(
        self,
        processor: TinyProcessor,
        *,
        initial_prompt: str = "",
        frame_queue_size: int = 256,
        max_tokens_per_turn: int = 12,
        max_new_tokens: int = 4096,
        do_sample: bool = False,
    ) -> ScriptedSession:
        session = ScriptedSession(
            self,
            processor,
            initial_prompt=initial_prompt,
            frame_queue_size=frame_queue_size,
            max_tokens_per_turn=max_tokens_per_turn,
            max_new_tokens=max_new_tokens,
        )
        self.sessions.append(session)
        return session


def factory(options: dict[str, Any], ctx: WorkloadContext) -> RealtimeSessionWorkload:
    """``kind = "python"``: options ``script``, ``stall_after``, ``start_after_pushes`` and
    any session setting."""
    opts = dict(options)
    model = ScriptedModel(
        opts.pop("script", "t"),
        opts.pop("stall_after", None),
        opts.pop("start_after_pushes", 0),
        ctx.seed,
    )
    settings = SessionWorkloadSettings(**opts)
    return RealtimeSessionWorkload(settings, ctx, model=model, processor=model.processor)
