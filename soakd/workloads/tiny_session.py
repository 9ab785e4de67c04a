"""The built-in tiny realtime-session model: MOSS-VL-Realtime's calling convention on top of a
random-weight causal LM built offline from a transformers config (fixed seed).

It exists so that soakd's ``session`` workload and its driver can be soaked offline with the
same methods and semantics as the real model; it says nothing about the real model's speed.

``TinyRealtimeModel.create_realtime_session(processor, *, initial_prompt="", system_prompt=None,
frame_queue_size=256, max_tokens_per_turn=12, **generate_kwargs)`` has the signature of
``MossVLForConditionalGeneration.create_realtime_session`` in the authors' remote code
(``modeling_moss_vl.py``) and returns a session with its methods:

* ``start()``: starts the background generation thread;
* ``push_frame(image, timestamp=None, *, drop_oldest=True) -> bool``: queues a frame in
  ``_frame_queue``, a ``queue.Queue(frame_queue_size)`` as upstream; returns True when the
  oldest pending frame was dropped (taken with ``get_nowait()`` on the pushing thread);
* ``push_prompt(text)``: accepted and ignored (the tiny model has no chat turns);
* ``poll_output(timeout=0.0) -> str | None``: the next text chunk, or None after ``timeout``;
  raises once the generation thread has died;
* ``active`` and ``pending_frames``;
* ``close(timeout=5.0)``: stops and joins the thread; re-raises the thread's failure.

Unlike the real model it answers **one chunk per turn**, not one per token, and
``max_tokens_per_turn`` is its per-turn token budget, not the real session's tokens-per-second
rate cap; ``generate_kwargs`` other than ``max_new_tokens`` and ``do_sample`` are ignored.

Each turn the thread takes the oldest pending frame, runs the processor on it (``processor(image)``:
patches and a thumbnail), embeds it (a 4x4 grid of patches through a fixed random projection)
after the prompt and the recent answer history, runs the LM on it (``step_module``: the torch
module whose forward is one step, which soakd times) and detokenises the answer with
``processor.tokenizer.decode``, as the real loop calls its processor, model and tokenizer.
When the frame barely differs from the previous one (mean absolute difference of 16x16 grey
thumbnails below ``silence_threshold``, in 0-255 units) the model only prefills and answers
``<|silence|>``, as the real model does when the visual evidence has not changed; otherwise it
greedily generates up to ``max_tokens_per_turn`` printable tokens and answers them as one chunk.
``max_new_tokens`` bounds the answer history kept in context, so memory stays bounded.
"""

from __future__ import annotations

import collections
import inspect
import queue
import threading
import time
from typing import Any

import numpy as np

SILENCE = "<|silence|>"
_SILENCE_ID = 256
_EOT_ID = 257
_VOCAB = 264
_PATCH_GRID = 4  # frame embedded as 4x4 patches
_PATCH_PX = 8  # each patch 8x8 RGB pixels
_PROMPT_MAX_BYTES = 64


class ByteTokenizer:
    """Bytes are token ids 0-255; 256 is ``<|silence|>``, 257 ends a turn."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        out = bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
        return out + (SILENCE if _SILENCE_ID in ids else "")


class TinyProcessor:
    """Turns a frame into patch vectors and a grey thumbnail; holds the tokenizer."""

    def __init__(self) -> None:
        self.tokenizer = ByteTokenizer()

    def __call__(self, images: Any) -> list[tuple[np.ndarray, np.ndarray]]:
        """``frame_arrays`` of one image or of each in a list (the processor call)."""
        batch = images if isinstance(images, list) else [images]
        return [self.frame_arrays(image) for image in batch]

    def frame_arrays(self, image: Any) -> tuple[np.ndarray, np.ndarray]:
        import cv2

        arr = np.asarray(image)
        if arr.ndim == 2:
            arr = np.repeat(arr[:, :, None], 3, axis=2)
        arr = np.ascontiguousarray(arr[:, :, :3], dtype=np.uint8)
        side = _PATCH_GRID * _PATCH_PX
        small = cv2.resize(arr, (side, side), interpolation=cv2.INTER_AREA).astype(np.float32)
        patches = (
            small.reshape(_PATCH_GRID, _PATCH_PX, _PATCH_GRID, _PATCH_PX, 3)
            .transpose(0, 2, 1, 3, 4)
            .reshape(_PATCH_GRID * _PATCH_GRID, -1)
        )
        grey = cv2.resize(
            arr.mean(axis=2).astype(np.float32), (16, 16), interpolation=cv2.INTER_AREA
        )
        return patches / 127.5 - 1.0, grey


def build_tiny_lm(seed: int = 0, hidden: int = 64, layers: int = 2) -> Any:
    """A random-weight Qwen2 causal LM from a config (no download, fixed seed)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=_VOCAB,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval()


class TinyLM:
    """A tiny LM with the operations a session turn needs: prefill and greedy decode."""

    def __init__(self, seed: int = 0, device: str = "cpu") -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.lm = build_tiny_lm(seed).to(self.device)
        hidden = self.lm.config.hidden_size
        gen = torch.Generator().manual_seed(seed + 1)
        dim = _PATCH_PX * _PATCH_PX * 3
        self.proj = (torch.randn(dim, hidden, generator=gen) / dim**0.5).to(self.device)
        params = inspect.signature(self.lm.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        allowed = torch.full((_VOCAB,), float("-inf"))
        allowed[32:127] = 0.0  # printable ASCII
        self._text_mask = allowed.to(self.device)
        self._text_or_end_mask = allowed.clone().to(self.device)
        self._text_or_end_mask[_EOT_ID] = 0.0

    def embed(self, ids: list[int], patches: np.ndarray) -> Any:
        torch = self.torch
        tok = torch.tensor([ids], dtype=torch.long, device=self.device)
        text = self.lm.get_input_embeddings()(tok)
        img = torch.from_numpy(patches).to(self.device) @ self.proj
        return torch.cat([text, img.unsqueeze(0)], dim=1)

    def _step(self, **kw: Any) -> tuple[Any, Any]:
        out = self.lm(use_cache=True, **kw)
        cache = out.get("cache") if "cache" in out else out.get("past_key_values")
        return out.logits[:, -1], cache

    def prefill(self, embeds: Any) -> None:
        with self.torch.inference_mode():
            self.lm(inputs_embeds=embeds, use_cache=False, logits_to_keep=1)

    def generate(self, embeds: Any, max_tokens: int) -> list[int]:
        """Greedy decode of 1..max_tokens printable tokens (stops at end of turn)."""
        torch = self.torch
        ids: list[int] = []
        with torch.inference_mode():
            logits, cache = self._step(inputs_embeds=embeds, logits_to_keep=1)
            for i in range(max_tokens):
                mask = self._text_mask if i == 0 else self._text_or_end_mask
                tok = int((logits[0] + mask).argmax())
                if tok == _EOT_ID:
                    break
                ids.append(tok)
                if i + 1 < max_tokens:
                    nxt = torch.tensor([[tok]], device=self.device)
                    logits, cache = self._step(input_ids=nxt, **{self._cache_kw: cache})
        return ids


class TinyRealtimeSession:
    """One realtime session over a ``TinyLM`` (see the module docstring for the semantics)."""

    def __init__(
        self,
        lm: TinyLM,
        processor: TinyProcessor,
        *,
        initial_prompt: str,
        frame_queue_size: int,
        max_tokens_per_turn: int,
        max_new_tokens: int,
        silence_threshold: float,
    ) -> None:
        if frame_queue_size < 1 or max_tokens_per_turn < 1 or max_new_tokens < 1:
            raise ValueError(
                "frame_queue_size, max_tokens_per_turn and max_new_tokens must be >= 1"
            )
        self.lm = lm
        self.processor = processor
        self.prompt_ids = processor.tokenizer.encode(initial_prompt)[:_PROMPT_MAX_BYTES]
        self.max_tokens_per_turn = max_tokens_per_turn
        self.max_new_tokens = max_new_tokens
        self.silence_threshold = silence_threshold
        self._frame_queue: queue.Queue[tuple[Any, float]] = queue.Queue(frame_queue_size)
        self._output_queue: queue.Queue[str] = queue.Queue()
        self._history: collections.deque[int] = collections.deque(maxlen=max_new_tokens)
        self._prev_grey: np.ndarray | None = None
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self.turns = 0
        self.dropped = 0
        self.error: BaseException | None = None

    @property
    def pending_frames(self) -> int:
        return self._frame_queue.qsize()

    @property
    def active(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> TinyRealtimeSession:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="soakd-tiny-session", daemon=True
            )
            self._thread.start()
        return self

    def push_frame(
        self, image: Any, timestamp: float | None = None, *, drop_oldest: bool = True
    ) -> bool:
        if self._closed.is_set():
            raise RuntimeError("session is closed")
        item = (image, time.monotonic() if timestamp is None else float(timestamp))
        dropped = False
        while True:
            try:
                self._frame_queue.put_nowait(item)
                return dropped
            except queue.Full:
                if not drop_oldest:
                    raise
            try:
                self._frame_queue.get_nowait()
                dropped = True
                self.dropped += 1
            except queue.Empty:
                pass

    def push_prompt(self, prompt: str) -> None:
        if not prompt:
            raise ValueError("prompt must not be empty")

    def poll_output(self, timeout: float = 0.0) -> str | None:
        try:
            out = self._output_queue
            return out.get(timeout=timeout) if timeout else out.get_nowait()
        except queue.Empty:
            if self.error is not None:
                raise RuntimeError("tiny realtime generation failed") from self.error
            return None

    def close(self, timeout: float | None = 5.0) -> None:
        self._closed.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                raise TimeoutError("tiny realtime generation did not stop before the timeout")
        if self.error is not None:
            raise RuntimeError("tiny realtime generation failed") from self.error

    # --- the generation thread
    def _next_frame(self) -> tuple[Any, float] | None:
        while not self._closed.is_set():
            try:
                return self._frame_queue.get(timeout=0.05)
            except queue.Empty:
                continue
        return None

    def _loop(self) -> None:
        try:
            while (item := self._next_frame()) is not None:
                self._output_queue.put(self.turn(item[0]))
                self.turns += 1
        except BaseException as exc:  # kept for the caller; the session stops answering
            self.error = exc

    def turn(self, image: Any) -> str:
        """Run one turn on ``image``: ``<|silence|>`` or up to max_tokens_per_turn chars."""
        ((patches, grey),) = self.processor(image)
        changed = (
            self._prev_grey is None
            or float(np.abs(grey - self._prev_grey).mean()) >= self.silence_threshold
        )
        self._prev_grey = grey
        embeds = self.lm.embed([*self.prompt_ids, *self._history], patches)
        tokenizer = self.processor.tokenizer
        if not changed:
            self.lm.prefill(embeds)
            return str(tokenizer.decode([_SILENCE_ID]))
        ids = self.lm.generate(embeds, self.max_tokens_per_turn)
        self._history.extend(ids)
        return str(tokenizer.decode(ids))


class TinyRealtimeModel:
    """A model object exposing ``create_realtime_session`` like MOSS-VL-Realtime."""

    def __init__(self, seed: int = 0, device: str = "cpu", silence_threshold: float = 1.0) -> None:
        self.lm = TinyLM(seed, device)
        self.silence_threshold = silence_threshold
        self.processor = TinyProcessor()

    @property
    def step_module(self) -> Any:
        """The torch module whose forward is one model step (what soakd times as infer)."""
        return self.lm.lm

    def create_realtime_session(
        self,
        processor: TinyProcessor,
        *,
        initial_prompt: str = "",
        system_prompt: str | None = None,
        frame_queue_size: int = 256,
        max_tokens_per_turn: int = 12,
        **generate_kwargs: Any,
    ) -> TinyRealtimeSession:
        """``system_prompt`` is accepted and unused (the tiny LM has no chat template)."""
        if generate_kwargs.get("do_sample"):
            raise ValueError("the tiny realtime model only decodes greedily (do_sample=False)")
        return TinyRealtimeSession(
            self.lm,
            processor,
            initial_prompt=initial_prompt,
            frame_queue_size=frame_queue_size,
            max_tokens_per_turn=max_tokens_per_turn,
            max_new_tokens=int(generate_kwargs.get("max_new_tokens", 4096)),
            silence_threshold=self.silence_threshold,
        )
