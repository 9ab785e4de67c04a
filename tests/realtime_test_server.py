"""TEST SERVER, not a product: a realtime session server that soakd's tests drive in place of
vLLM-Omni / an OpenAI Realtime endpoint, written from the published wire contracts (OpenAI's
Realtime event vocabulary; vLLM-Omni's "Streaming Video Input API" docs page), never from
their code.

It answers with soakd's embedded tiny LLaVA (random weights, soakd/workloads/tiny.py): a real
``generate`` over the newest buffered frame and the question, streamed token by token (a
transformers streamer), so the deltas, their intervals and the usage's token count are a real
model's. What it says is noise; how it behaves is real: a process with its own pid and RSS,
real sockets, real sleeps.

Endpoints (one process serves both):

* ``ws://HOST:PORT/v1/realtime``: ``session.created`` first; ``session.update`` ->
  ``session.updated``; ``input_audio_buffer.append`` / ``.commit``; ``conversation.item.create``
  (``input_image`` parts buffered as frames, ``input_text`` kept as the question) ->
  ``conversation.item.created``; ``response.create`` -> ``response.created``,
  ``response.output_text.delta`` per token (and ``response.output_audio.delta``, 40 ms of
  PCM16 24 kHz per token, when the session's ``output_modalities`` holds ``"audio"``),
  ``response.output_text.done``, ``response.done`` with ``usage``.
* ``ws://HOST:PORT/v1/video/chat/stream``: ``session.config``, ``video.frame``,
  ``audio.chunk``, ``video.query`` -> ``response.start``, ``response.text.delta``,
  (``response.audio.delta``), ``response.text.done``; ``video.done`` ends the session.

Planted faults, per connection as query parameters of the URL:
``leak_kb=K`` (every frame kept forever with K KiB more: the server's memory grows),
``slow_ms=X`` (turn n waits n*X ms before its first token: it slows down), ``drop_after=N``
(the socket is cut mid-answer from turn N on), ``malformed_after=N`` (a non-JSON event
mid-answer from turn N on), ``expire_s=S`` (the session ends after S s with an
``error {code: session_expired}`` and a close), ``max_tokens=N`` (tokens per answer, 6),
``audio_gap_ms=X`` (each answer's audio chunks, 40 ms each, X ms apart: over 40, a voice
that streams slower than it plays).
A ``session.update`` whose ``turn_detection`` (or ``audio.input.turn_detection``) is
``{type = "server_vad"}`` turns on voice activity detection: loud input audio is speech
(``input_audio_buffer.speech_started``), ``silence_duration_ms`` (300) of quiet after it ends
it (``speech_stopped``, ``committed``) and the server answers unasked.
``--api-key KEY`` refuses handshakes without ``Authorization: Bearer KEY`` (HTTP 401).

Run: ``python tests/realtime_test_server.py --port 0``; prints ``READY <port>`` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import numpy as np

KEEP_FRAMES = 4  # frames a healthy session keeps (it evicts older ones)
VAD_RMS = 0.02  # server VAD: audio louder than this (RMS, full scale 1) is speech
AUDIO_RATE = 24000
AUDIO_PER_TOKEN_S = 0.04
LEAKED: list[bytes] = []  # leak_kb: frames kept forever, process-wide


class TinyModel:
    """The embedded tiny LLaVA, loaded once; ``stream`` yields token texts as generated."""

    def __init__(self) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import torch
        from transformers import AutoProcessor, LlavaForConditionalGeneration

        from soakd.workloads.tiny import TinySpec, ensure_tiny_model

        torch.set_num_threads(1)
        path = ensure_tiny_model(TinySpec(arch="llava"))
        self.processor = AutoProcessor.from_pretrained(path)
        self.model = LlavaForConditionalGeneration.from_pretrained(path).eval()
        self.lock = threading.Lock()  # one generation at a time (one CPU model)
        for _ in range(2):  # warmed before READY, as a server is before it takes traffic
            self.generate(None, "warm up", 6, lambda text: None)

    def generate(self, image: Any, question: str, n: int, put: Any) -> int:
        """Generate ``n`` tokens about ``image``; ``put(text)`` is called per token from this
        (worker) thread. Returns the tokens generated."""
        import torch
        from PIL import Image
        from transformers.generation.streamers import BaseStreamer

        tok = self.processor.tokenizer

        class Each(BaseStreamer):
            def __init__(self) -> None:
                self.prompt_seen, self.n = False, 0

            def put(self, value: Any) -> None:
                if not self.prompt_seen:  # the first call is the prompt
                    self.prompt_seen = True
                    return
                for t in value.reshape(-1).tolist():
                    self.n += 1
                    put(tok.decode([t]) or "\u2581")

            def end(self) -> None:
                return None

        img = image if image is not None else Image.new("RGB", (56, 56))
        text = f"<image>{question}"
        inputs = self.processor(text=[text], images=[img], return_tensors="pt")
        streamer = Each()
        with self.lock, torch.inference_mode():
            self.model.generate(
                **inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False, streamer=streamer
            )
        return streamer.n


def _image(jpeg: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(jpeg)).convert("RGB")


def _tone(seconds: float) -> bytes:
    t = np.arange(int(AUDIO_RATE * seconds)) / AUDIO_RATE
    return (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2").tobytes()


class Session:
    """One connection's state and its planted faults."""

    def __init__(self, ws: Any, model: TinyModel, dialect: str, query: dict[str, str]) -> None:
        self.ws, self.model, self.dialect = ws, model, dialect
        self.frames: list[bytes] = []
        self.audio = bytearray()
        self.question = "What is happening?"
        self.turns = 0
        self.audio_out = False
        self.t0 = time.monotonic()
        faults = ("leak_kb", "slow_ms", "drop_after", "malformed_after", "expire_s", "max_tokens",
                  "audio_gap_ms")  # fmt: skip
        q = {k: float(v) for k, v in query.items() if v and k in faults}
        self.leak_kb = int(q.get("leak_kb", 0))
        self.slow_ms = q.get("slow_ms", 0.0)
        self.drop_after = int(q.get("drop_after", 0))
        self.malformed_after = int(q.get("malformed_after", 0))
        self.expire_s = q.get("expire_s", 0.0)
        self.max_tokens = int(q.get("max_tokens", 6))
        self.audio_gap_ms = q.get("audio_gap_ms", 0.0)
        self.vad_silence_ms: float | None = None  # server VAD on: the silence that ends speech
        self.speaking, self.silent_ms = False, 0.0

    async def send(self, ev: dict[str, Any]) -> None:
        ev.setdefault("event_id", "event_" + uuid.uuid4().hex[:12])
        await self.ws.send(json.dumps(ev))

    def keep_frame(self, jpeg: bytes) -> None:
        if self.leak_kb:
            LEAKED.append(jpeg + bytes(self.leak_kb * 1024))
        self.frames.append(jpeg)
        del self.frames[:-KEEP_FRAMES]

    async def answer(self) -> None:
        """One turn: the tiny model over the newest frame, each token a delta."""
        self.turns += 1
        n = self.turns
        if self.slow_ms:
            await asyncio.sleep(n * self.slow_ms / 1000)
        loop = asyncio.get_running_loop()
        out: asyncio.Queue[str | None] = asyncio.Queue()
        image = _image(self.frames[-1]) if self.frames else None

        def put(text: str) -> None:
            loop.call_soon_threadsafe(out.put_nowait, text)

        async def run() -> int:
            try:
                return await asyncio.to_thread(
                    self.model.generate, image, self.question, self.max_tokens, put
                )
            finally:
                out.put_nowait(None)

        rid, iid = "resp_" + uuid.uuid4().hex[:12], "item_" + uuid.uuid4().hex[:12]
        task = asyncio.ensure_future(run())
        await self.send(self._start(rid))
        text, k = [], 0
        while (delta := await out.get()) is not None:
            k += 1
            if self.drop_after and n >= self.drop_after and k == 2:
                self.ws.transport.abort()  # the socket cut mid-answer, no close frame
                await task
                return
            if self.malformed_after and n >= self.malformed_after and k == 2:
                await self.ws.send("{not json")
            text.append(delta)
            await self.send(self._delta(rid, iid, delta))
            if self.audio_out:
                if self.audio_gap_ms and k > 1:  # each 40 ms chunk X ms after the one before
                    await asyncio.sleep(self.audio_gap_ms / 1000)
                await self.send(self._audio(rid, iid, _tone(AUDIO_PER_TOKEN_S)))
        tokens = await task
        await self._done(rid, iid, "".join(text), tokens)

    def _start(self, rid: str) -> dict[str, Any]:
        if self.dialect == "omni":
            return {"type": "response.start"}
        return {
            "type": "response.created",
            "response": {
                "id": rid,
                "object": "realtime.response",
                "status": "in_progress",
                "output": [],
            },
        }

    def _delta(self, rid: str, iid: str, delta: str) -> dict[str, Any]:
        if self.dialect == "omni":
            return {"type": "response.text.delta", "delta": delta}
        return {
            "type": "response.output_text.delta",
            "response_id": rid,
            "item_id": iid,
            "output_index": 0,
            "content_index": 0,
            "delta": delta,
        }

    def _audio(self, rid: str, iid: str, pcm: bytes) -> dict[str, Any]:
        b64 = base64.b64encode(pcm).decode()
        if self.dialect == "omni":
            return {"type": "response.audio.delta", "delta": b64}
        return {
            "type": "response.output_audio.delta",
            "response_id": rid,
            "item_id": iid,
            "output_index": 0,
            "content_index": 0,
            "delta": b64,
        }

    async def _done(self, rid: str, iid: str, text: str, tokens: int) -> None:
        usage = {"input_tokens": 0, "output_tokens": tokens, "total_tokens": tokens}
        if self.dialect == "omni":
            await self.send({"type": "response.text.done", "text": text, "usage": usage})
            return
        await self.send(
            {
                "type": "response.output_text.done",
                "response_id": rid,
                "item_id": iid,
                "output_index": 0,
                "content_index": 0,
                "text": text,
            }
        )
        await self.send(
            {
                "type": "response.done",
                "response": {
                    "id": rid,
                    "object": "realtime.response",
                    "status": "completed",
                    "usage": usage,
                    "output": [
                        {
                            "id": iid,
                            "type": "message",
                            "role": "assistant",
                            "status": "completed",
                            "content": [{"type": "output_text", "text": text}],
                        }
                    ],
                },
            }
        )

    async def expired(self) -> bool:
        if not self.expire_s or time.monotonic() - self.t0 < self.expire_s:
            return False
        await self.send(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "code": "session_expired",
                    "message": "Your session hit the maximum "
                    f"duration of {self.expire_s:g} seconds.",
                },
            }
        )
        await self.ws.close(1000, "session expired")
        return True

    async def vad(self, pcm: bytes) -> None:
        """Server VAD (energy over VAD_RMS, 16 kHz PCM16): speech started, then stopped after
        ``silence_duration_ms`` of quiet: the buffer committed and answered unasked."""
        x = np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype="<i2").astype(np.float64) / 32768
        loud = x.size > 0 and float(np.sqrt(np.mean(x * x))) > VAD_RMS
        if loud:
            self.silent_ms = 0.0
            if not self.speaking:
                self.speaking = True
                await self.send({"type": "input_audio_buffer.speech_started", "item_id": "i"})
            return
        if not self.speaking:
            return
        self.silent_ms += x.size / 16000 * 1000
        if self.silent_ms >= (self.vad_silence_ms or 0.0):
            self.speaking = False
            await self.send({"type": "input_audio_buffer.speech_stopped", "item_id": "i"})
            await self.send({"type": "input_audio_buffer.committed", "item_id": "i"})
            await self.answer()

    # --- client events
    async def on_realtime(self, ev: dict[str, Any]) -> None:
        t = ev.get("type")
        if t == "session.update":
            sess = ev.get("session") or {}
            self.audio_out = "audio" in (
                sess.get("output_modalities") or sess.get("modalities") or ()
            )
            td = sess.get("turn_detection") or (sess.get("audio") or {}).get("input", {}).get(
                "turn_detection"
            )
            if isinstance(td, dict) and td.get("type") == "server_vad":
                self.vad_silence_ms = float(td.get("silence_duration_ms", 300))
            await self.send({"type": "session.updated", "session": {"type": "realtime", **sess}})
        elif t == "input_audio_buffer.append":
            pcm = base64.b64decode(ev["audio"])
            self.audio += pcm
            del self.audio[: max(0, len(self.audio) - 16000 * 2 * 30)]
            if self.vad_silence_ms is not None:
                await self.vad(pcm)
        elif t == "input_audio_buffer.commit":
            await self.send(
                {
                    "type": "input_audio_buffer.committed",
                    "item_id": "item_a",
                    "previous_item_id": None,
                }
            )
        elif t == "conversation.item.create":
            item = ev.get("item") or {}
            for part in item.get("content") or ():
                if part.get("type") == "input_image":
                    self.keep_frame(base64.b64decode(part["image_url"].split(",", 1)[1]))
                elif part.get("type") == "input_text":
                    self.question = part.get("text") or self.question
                elif part.get("type") == "input_audio":
                    self.audio += base64.b64decode(part.get("audio") or "")
            iid = item.get("id") or "item_" + uuid.uuid4().hex[:12]
            await self.send(
                {
                    "type": "conversation.item.created",
                    "previous_item_id": None,
                    "item": {
                        "id": iid,
                        "object": "realtime.item",
                        "type": "message",
                        "role": "user",
                        "status": "completed",
                        "content": item.get("content") or [],
                    },
                }
            )
        elif t == "response.create":
            await self.answer()
        else:
            await self.send(
                {
                    "type": "error",
                    "error": {
                        "type": "invalid_request_error",
                        "code": "unknown_event",
                        "message": f"unknown event {t!r}",
                    },
                }
            )

    async def on_omni(self, ev: dict[str, Any]) -> bool:
        t = ev.get("type")
        if t == "session.config":
            self.audio_out = "audio" in (ev.get("modalities") or ())
        elif t == "video.frame":
            self.keep_frame(base64.b64decode(ev["data"]))
        elif t == "audio.chunk":
            self.audio += base64.b64decode(ev["data"])
            del self.audio[: max(0, len(self.audio) - 16000 * 2 * 30)]
        elif t == "video.query":
            self.question = ev.get("text") or self.question
            await self.answer()
        elif t == "video.done":  # the published example client waits for session.done
            await self.send({"type": "session.done"})
            return False
        else:
            await self.send({"type": "error", "message": f"unknown event {t!r}"})
        return True


async def _serve(opts: argparse.Namespace) -> None:
    from websockets.asyncio.server import serve
    from websockets.datastructures import Headers
    from websockets.http11 import Response

    model = TinyModel()

    def check(conn: Any, request: Any) -> Any:
        path = urlsplit(request.path).path
        if path not in ("/v1/realtime", "/v1/video/chat/stream"):
            return Response(404, "Not Found", Headers(), b"no such endpoint\n")
        if opts.api_key and request.headers.get("Authorization") != f"Bearer {opts.api_key}":
            return Response(401, "Unauthorized", Headers(), b"invalid api key\n")
        return None

    async def handler(ws: Any) -> None:
        parts = urlsplit(ws.request.path)
        dialect = "omni" if parts.path.endswith("/stream") else "realtime"
        sess = Session(ws, model, dialect, dict(parse_qsl(parts.query)))
        if dialect == "realtime":
            await sess.send(
                {
                    "type": "session.created",
                    "session": {
                        "type": "realtime",
                        "id": "sess_" + uuid.uuid4().hex[:12],
                        "object": "realtime.session",
                        "model": dict(parse_qsl(parts.query)).get("model", "tiny"),
                        "output_modalities": ["text"],
                    },
                }
            )
        async for raw in ws:
            if await sess.expired():
                return
            ev = json.loads(raw)
            if dialect == "realtime":
                await sess.on_realtime(ev)
            elif not await sess.on_omni(ev):
                await ws.close()
                return

    async with serve(handler, opts.host, opts.port, process_request=check, max_size=None) as srv:
        port = srv.sockets[0].getsockname()[1]
        print(f"READY {port}", flush=True)
        await asyncio.Future()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="TEST SERVER, not a product: realtime sessions")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--api-key", default=None, help="refuse handshakes without this key")
    opts = p.parse_args(argv)
    try:
        asyncio.run(_serve(opts))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()


def start(*args: str, timeout: float = 60) -> Any:
    """Launch this file as a subprocess (``--port 0`` unless given), wait for ``READY <port>``
    and return an ``openai_test_server.ServerProcess`` for it (stop() ends it)."""
    import os
    import subprocess
    import tempfile

    from tests.openai_test_server import ServerProcess

    argv = [sys.executable, str(Path(__file__).resolve()), *args]
    if "--port" not in args:
        argv += ["--port", "0"]
    fd, name = tempfile.mkstemp(prefix="realtime-test-server-", suffix=".stderr")
    with os.fdopen(fd, "wb") as err:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    server = ServerProcess(proc, 0, Path(name))
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()  # the server prints one line, then nothing
            if line.startswith(b"READY "):
                server.port = int(line.split()[1])
                return server
            if not line and proc.poll() is not None:
                break
        raise RuntimeError(f"realtime test server not READY: {server.stderr_text()[-2000:]}")
    except BaseException:
        server.stop()
        raise
