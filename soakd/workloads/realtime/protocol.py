"""The wire dialects of ``kind = "realtime"``: the client events soakd sends, and what each
server event means for the measurement (``Parsed``).

* ``openai-realtime``: OpenAI's Realtime event vocabulary (``/v1/realtime``). A frame is a
  ``conversation.item.create`` with one ``input_image`` part (the protocol has no video
  event: that is how its clients send camera frames), audio ``input_audio_buffer.append``
  (base64 PCM16), a question ``conversation.item.create`` (``input_text``) then
  ``response.create``. The server answers ``response.created``, text deltas
  (``response.output_text.delta``, the older ``response.text.delta``, the audio's
  transcript deltas, vLLM's ``transcription.delta``), ``response.output_audio.delta``
  (base64 PCM16) and ``response.done`` with ``usage.output_tokens``. With the server's
  voice activity detection (``turn_detection`` in the session), the server opens a turn
  itself: ``input_audio_buffer.speech_stopped`` is its question, the answer follows.
* ``vllm-omni-video``: vLLM-Omni's Streaming Video Input API (``/v1/video/chat/stream``):
  ``session.config`` first, ``video.frame`` / ``audio.chunk`` (``data``: base64),
  ``video.query {text}``, ``video.done``; the server answers ``response.start``,
  ``response.text.delta {delta}``, ``response.audio.delta``, ``response.text.done {text}``.

Pure functions of dicts: no socket here (client.py owns it), so every rule is testable alone.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Literal

ParsedKind = Literal[
    "ready", "start", "text", "audio", "done", "error", "ack", "speech_stopped", "other"
]

#: error codes (or close reasons) that say the server ended the session for its age
EXPIRY_WORDS: tuple[str, ...] = ("expired", "expiry", "session_expired", "max_duration")


@dataclass(slots=True)
class Parsed:
    """One server event, as the measurement reads it."""

    kind: ParsedKind
    text: str = ""
    audio: bytes = b""  # decoded PCM16
    tokens: int | None = None  # output tokens from the done event's usage
    code: str | None = None  # an error's code (or type)
    message: str = ""
    failed: bool = False  # a done event whose status says the response failed

    @property
    def expired(self) -> bool:
        """An error saying the server ended the session because it lasted too long."""
        words = f"{self.code or ''} {self.message}".lower()
        return self.kind == "error" and any(w in words for w in EXPIRY_WORDS)


class MalformedEvent(ValueError):
    """A server event that is not a JSON object with a string ``type``, or whose fields do
    not have the contract's types; the message is one line."""


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise MalformedEvent(f"{what}: base64 string expected, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedEvent(f"{what}: not base64") from None


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise MalformedEvent(f"{what}: string expected, got {type(value).__name__}")
    return value


def _error(ev: dict[str, Any]) -> Parsed:
    err = ev.get("error")
    if isinstance(err, dict):
        code = err.get("code") or err.get("type")
        msg = err.get("message")
    else:  # vllm-omni: {"type": "error", "message": ..., "code"?: ...}
        code, msg = ev.get("code"), ev.get("message", err)
    return Parsed(
        "error", code=None if code is None else str(code)[:100], message=str(msg or "")[:300]
    )


class OpenAIRealtime:
    """OpenAI's Realtime event vocabulary."""

    name = "openai-realtime"
    waits_for_ready = True  # the server speaks first: session.created

    @staticmethod
    def hello(
        session: dict[str, Any], instructions: str | None, model: str | None
    ) -> list[dict[str, Any]]:
        body: dict[str, Any] = dict(session)
        if instructions is not None:
            body["instructions"] = instructions
        if model is not None:
            body.setdefault("model", model)
        return [{"type": "session.update", "session": body}] if body else []

    @staticmethod
    def frame(jpeg_b64: str) -> dict[str, Any]:
        url = "data:image/jpeg;base64," + jpeg_b64
        part = {"type": "input_image", "image_url": url}
        item = {"type": "message", "role": "user", "content": [part]}
        return {"type": "conversation.item.create", "item": item}

    @staticmethod
    def audio(pcm_b64: str) -> dict[str, Any]:
        return {"type": "input_audio_buffer.append", "audio": pcm_b64}

    @staticmethod
    def ask(text: str) -> list[dict[str, Any]]:
        part = {"type": "input_text", "text": text}
        item = {"type": "message", "role": "user", "content": [part]}
        return [{"type": "conversation.item.create", "item": item}, {"type": "response.create"}]

    @staticmethod
    def bye() -> dict[str, Any] | None:
        return None

    @staticmethod
    def parse(ev: dict[str, Any]) -> Parsed:
        t = ev["type"]
        if t == "session.created":
            return Parsed("ready")
        if t == "response.created":
            return Parsed("start")
        if t in TEXT_DELTAS:
            return Parsed("text", text=_text(ev.get("delta"), t + ".delta"))
        if t in ("response.output_audio.delta", "response.audio.delta"):
            return Parsed("audio", audio=_b64(ev.get("delta"), t + ".delta"))
        if t == "response.done":
            return _done(ev.get("response"))
        if t == "transcription.done":
            usage = ev.get("usage")
            tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
            return Parsed("done", tokens=tokens if isinstance(tokens, int) else None)
        if t == "error":
            return _error(ev)
        if t in ("conversation.item.created", "conversation.item.added"):
            return Parsed("ack")
        if t == "input_audio_buffer.speech_stopped":  # server VAD: the speaker stopped
            return Parsed("speech_stopped")
        return Parsed("other")


TEXT_DELTAS: frozenset[str] = frozenset(
    {
        "response.output_text.delta",
        "response.text.delta",
        "response.output_audio_transcript.delta",
        "response.audio_transcript.delta",
        "transcription.delta",
    }
)


def _done(resp: Any) -> Parsed:
    if not isinstance(resp, dict):
        raise MalformedEvent("response.done: 'response' object expected")
    usage = resp.get("usage")
    tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
    status = resp.get("status")
    failed = status in ("failed", "incomplete", "cancelled")
    msg = ""
    if failed:
        details = resp.get("status_details")
        msg = f"response {status}: {str(details)[:200]}" if details else f"response {status}"
    return Parsed(
        "done", tokens=tokens if isinstance(tokens, int) else None, failed=failed, message=msg
    )


class VllmOmniVideo:
    """vLLM-Omni's Streaming Video Input API."""

    name = "vllm-omni-video"
    waits_for_ready = False  # the client speaks first: session.config

    @staticmethod
    def hello(
        session: dict[str, Any], instructions: str | None, model: str | None
    ) -> list[dict[str, Any]]:
        # the contract has no instructions field: prompts go in workload.session
        body: dict[str, Any] = {"type": "session.config", **session}
        if model is not None:
            body.setdefault("model", model)
        return [body]

    @staticmethod
    def frame(jpeg_b64: str) -> dict[str, Any]:
        return {"type": "video.frame", "data": jpeg_b64}

    @staticmethod
    def audio(pcm_b64: str) -> dict[str, Any]:
        return {"type": "audio.chunk", "data": pcm_b64}

    @staticmethod
    def ask(text: str) -> list[dict[str, Any]]:
        return [{"type": "video.query", "text": text}]

    @staticmethod
    def bye() -> dict[str, Any] | None:
        return {"type": "video.done"}

    @staticmethod
    def parse(ev: dict[str, Any]) -> Parsed:
        t = ev["type"]
        if t == "response.start":
            return Parsed("start")
        if t == "response.text.delta":
            return Parsed("text", text=_text(ev.get("delta"), t))
        if t == "response.audio.delta":
            return Parsed("audio", audio=_b64(ev.get("delta", ev.get("data")), t))
        if t == "response.text.done":
            usage = ev.get("usage")
            tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
            return Parsed("done", tokens=tokens if isinstance(tokens, int) else None)
        if t == "error":
            return _error(ev)
        if t.startswith("session."):
            return Parsed("ready")
        return Parsed("other")


Dialect = type[OpenAIRealtime] | type[VllmOmniVideo]
DIALECTS: dict[str, Dialect] = {"openai-realtime": OpenAIRealtime, "vllm-omni-video": VllmOmniVideo}


def parse_event(dialect: Dialect, raw: str | bytes) -> Parsed:
    """A server frame, parsed; anything but a JSON object with a string ``type`` (or a field
    of the wrong type) raises ``MalformedEvent``."""
    import json

    if isinstance(raw, bytes):
        raise MalformedEvent("a binary frame where JSON text was expected")
    try:
        ev = json.loads(raw)
    except ValueError:
        raise MalformedEvent(f"not JSON: {raw[:80]!r}") from None
    if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
        raise MalformedEvent(f"not an event object with a 'type': {raw[:80]!r}")
    return dialect.parse(ev)
