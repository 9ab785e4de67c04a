"""A model served behind an OpenAI-compatible endpoint, driven over HTTP (``kind = "openai"``).

vLLM, SGLang, TGI, llama.cpp's server, ``transformers serve`` and Ollama all answer
``POST <base_url>/chat/completions``. One staged workload drives any of them at the run's
fixed rate, exactly as an in-process model, with its stages named for what they time:

* ``preprocess(frame)`` (``pre``): resize (``short_side``), JPEG-encode, base64 into an
  ``image_url`` data URL, and the request body (the last ``frames_per_request`` frames of the
  frame's stream as that many images: a short clip);
* ``infer(request)`` (``infer``): request sent -> first content token (time to first token),
  or the whole answer when ``stream = false``;
* ``decode(pending)`` (``decode``): first token -> end of the stream; the output tokens
  (``usage.completion_tokens`` when the server sends it, else the content chunks counted)
  and the request's inter-token intervals (p50 / p95 / max, in the frame's ``extra``).

One ``httpx.Client`` (one connection pool, thread-safe) serves every stream: with
``run.streams = N`` (or ``concurrency = N``) the concurrent driver keeps one request in
flight per stream. Faults are data: a refused or reset connection, a timeout, an HTTP error
status, a malformed event stream and an empty completion each raise ``RequestFailed``
(``kind``, ``status``), which the driver records on the frame as an error. A server that
stays unreachable for ``unreachable_timeout_s`` raises ``RunAbort``: the run ends aborted
(INVALID) with an event saying so. ``setup`` waits for the server (``ready_timeout_s``) and
records the served model id and the server's version where it reports one; a bad URL, a
server that never becomes ready and a refused API key are one-line ``WorkloadError``s (exit 2).
"""

from __future__ import annotations

import base64
import json
import math
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import cv2
from httpx_sse import EventSource

from soakd import redact
from soakd.records import Frame, StageOutput
from soakd.workloads.base import RunAbort, WorkloadContext, WorkloadError
from soakd.workloads.hf import resize_short_side
from soakd.workloads.openai_settings import OpenAIWorkloadSettings

#: how often setup asks a server that is not ready yet
READY_POLL_S = 0.25

#: the error kinds a request can end with (``RequestFailed.kind``)
ErrorKind = Literal[
    "refused", "reset", "timeout", "http", "malformed", "empty", "truncated", "protocol"
]
#: the most tokens one answer may claim (``usage.completion_tokens``): more is not a count
MAX_TOKENS = 1 << 31


class RequestFailed(Exception):
    """One request that did not give an answer: ``kind`` (refused, reset, timeout, http,
    malformed, empty, truncated, protocol) and the HTTP ``status`` when there was one.
    ``str()`` is ``"http 503: <body>"``, the text the frame's ``error`` column keeps, its
    secrets masked (soakd.redact) before it is cut to length."""

    def __init__(self, kind: ErrorKind, message: str, status: int | None = None) -> None:
        self.kind, self.status = kind, status
        head = f"{kind} {status}" if status is not None else kind
        super().__init__(redact.text(f"{head}: {message}")[:500])

    @property
    def unreachable(self) -> bool:
        """The server could not be reached at all (nothing answered)."""
        return self.kind in ("refused", "reset", "timeout")


@dataclass(slots=True)
class Pending:
    """A streamed answer between ``infer`` (its first token is in) and ``decode``."""

    response: Any  # httpx.Response, still open
    events: Iterator[Any]  # the rest of its server-sent events
    t_first: float  # perf_counter() at the first content token
    chunks: int = 1  # content chunks so far
    text: list[str] = field(default_factory=list)
    usage_tokens: int | None = None
    finished: bool = False  # a finish_reason, the usage chunk or [DONE] was seen


@dataclass(slots=True)
class Answer:
    """A non-streamed answer (``stream = false``), parsed in ``decode``."""

    body: bytes


def _origin(base_url: str) -> str:
    p = urlsplit(base_url)
    return f"{p.scheme}://{p.netloc}"


def _percentiles(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {}
    a = sorted(ms)
    return {
        "itl_p50_ms": _percentile(a, 50),
        "itl_p95_ms": _percentile(a, 95),
        "itl_max_ms": a[-1],
    }


def _percentile(ordered: list[float], q: float) -> float:
    """numpy's default (linear) percentile ``q`` of ``ordered`` (sorted, not empty), the
    same float, without an array for a request's handful of intervals (issue 34)."""
    h = (len(ordered) - 1) * (q / 100)
    lo = math.floor(h)
    if lo >= len(ordered) - 1:
        return ordered[-1]
    a, b, t = ordered[lo], ordered[lo + 1], h - lo
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t  # numpy's _lerp


class OpenAIStaged:
    """An OpenAI-compatible chat-completions endpoint as a staged workload."""

    shape: Literal["staged"] = "staged"
    concurrent = True  # requests in flight at once: one per stream (drivers/concurrent.py)

    def __init__(self, settings: OpenAIWorkloadSettings, ctx: WorkloadContext) -> None:
        import httpx

        self.s = settings
        self.ctx = ctx
        self.url = f"{settings.base_url}/chat/completions"
        self._httpx = httpx
        self._client: httpx.Client | None = None
        self._clips: dict[int, deque[str]] = {}  # stream -> its last frames as data URLs
        self._lock = threading.Lock()  # the unreachable clock, shared by the streams
        self._unreachable_since: float | None = None
        self._info: dict[str, Any] = {}
        self.model = settings.model
        key = os.environ.get(settings.api_key_env) if settings.api_key_env else None
        if settings.api_key_env and not key:
            raise WorkloadError(
                f"workload.api_key_env: the environment variable {settings.api_key_env} is not set"
            )
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        # the key and the URL's password: masked from now on in every text that leaves soakd
        redact.add_secret(key)
        redact.add_url(settings.base_url)
        self.where = redact.url(settings.base_url)  # the API root as messages name it
        self._deadline = _Deadline()  # this thread's request's deadline (request_timeout_s)

    # --- setup: the client, the server ready, the model id
    def setup(self) -> None:
        httpx = self._httpx
        s = self.s
        timeout = httpx.Timeout(s.request_timeout_s, connect=min(10.0, s.request_timeout_s))
        pool = max(1, s.concurrency or 1) + 1
        self._client = httpx.Client(
            timeout=timeout,
            headers=self._headers,
            limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
        )
        self.ctx.phase("waiting for the server")
        models = self._wait_ready()
        self._pick_model(models)
        self._info.update(self._server_version())

    def _wait_ready(self) -> list[str]:
        """The model ids ``<base_url>/models`` lists, once the server answers it; a refused
        key or a server not ready within ``ready_timeout_s`` is a WorkloadError."""
        assert self._client is not None
        url, deadline = f"{self.s.base_url}/models", time.monotonic() + self.s.ready_timeout_s
        shown = f"{self.where}/models"
        last = "no answer"
        while True:
            try:
                r = self._client.get(url, timeout=min(5.0, self.s.ready_timeout_s))
            except self._httpx.InvalidURL as exc:
                raise WorkloadError(f"workload.base_url {self.where!r}: {exc}") from None
            except self._httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}".rstrip(": ")
            else:
                if r.status_code in (401, 403):
                    raise WorkloadError(
                        f"{shown}: the server refused the API key (HTTP {r.status_code}); set "
                        "workload.api_key_env to the variable that holds it"
                    )
                if r.status_code == 200:
                    return self._model_ids(r)
                last = f"HTTP {r.status_code}"
                if r.status_code == 404:
                    raise WorkloadError(
                        f"{shown}: HTTP 404, not an OpenAI-compatible API root (workload.base_url "
                        "should end in /v1)"
                    )
            if time.monotonic() >= deadline:
                raise WorkloadError(
                    f"the server at {self.where} was not ready within "
                    f"{self.s.ready_timeout_s:g} s (workload.ready_timeout_s): {last}"
                )
            time.sleep(READY_POLL_S)

    @staticmethod
    def _model_ids(r: Any) -> list[str]:
        try:
            data = r.json().get("data", [])
            return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]
        except (ValueError, AttributeError, TypeError):
            return []

    def _pick_model(self, models: list[str]) -> None:
        if self.model is None:
            if not models:
                raise WorkloadError(
                    f"{self.where}/models lists no model: set workload.model to the id "
                    "the server serves"
                )
            self.model = models[0]
        self._info["served_models"] = models[:20]
        self._info["model_listed"] = self.model in models

    def _server_version(self) -> dict[str, Any]:
        """What the server says it is, where it says so (vLLM ``/version``, TGI ``/info``,
        llama.cpp ``/props``) and its ``server`` header; nothing when it does not."""
        assert self._client is not None
        out: dict[str, Any] = {}
        for path in ("/version", "/info", "/props"):
            try:
                r = self._client.get(_origin(self.s.base_url) + path, timeout=2.0)
                data = r.json() if r.status_code == 200 else None
            except (self._httpx.HTTPError, ValueError):
                continue
            if isinstance(data, dict):
                version = data.get("version") or data.get("build_info")
                if version is not None:
                    out["server_version"] = str(version)[:200]
                    out["server_version_from"] = path
                    break
        return out

    # --- the stages
    def preprocess(self, frame: Frame) -> tuple[int, bytes]:
        """The frame as a JPEG data URL in its stream's clip, and the request body."""
        img = frame.image
        if self.s.short_side is not None:
            img = resize_short_side(img, self.s.short_side)
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, self.s.jpeg_quality])
        if not ok:
            raise RuntimeError(f"JPEG encoding failed for a {img.shape} frame")
        url = "data:image/jpeg;base64," + base64.b64encode(buf.tobytes()).decode("ascii")
        clip = self._clips.get(frame.stream)
        if clip is None:
            clip = self._clips[frame.stream] = deque(maxlen=self.s.frames_per_request)
        clip.append(url)
        return frame.stream, json.dumps(self._body(list(clip))).encode()

    def _body(self, images: list[str]) -> dict[str, Any]:
        s = self.s
        content: list[dict[str, Any]] = [{"type": "text", "text": s.prompt}]
        content += [{"type": "image_url", "image_url": {"url": u}} for u in images]
        messages: list[dict[str, Any]] = [{"role": "user", "content": content}]
        if s.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": s.system_prompt})
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "stream": s.stream,
            **s.extra_body,
        }
        if s.stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def infer(self, inputs: tuple[int, bytes]) -> Pending | Answer:
        """Send the request; return at its first content token (streaming) or its whole
        answer. A refused, reset or timed-out request, or an HTTP error, raises."""
        self._deadline.at = time.monotonic() + self.s.request_timeout_s
        try:
            out = self._send(inputs[1])
        except RequestFailed as exc:
            self._deadline.at = None
            self._unreachable(exc)
            raise
        self._reachable()
        return out

    def _send(self, body: bytes) -> Pending | Answer:
        assert self._client is not None
        httpx = self._httpx
        req = self._client.build_request(
            "POST", self.url, content=body, headers={"Content-Type": "application/json"}
        )
        req.extensions["trace"] = self._trace  # a new connection: bounded from its first read
        try:
            r = self._client.send(req, stream=True)
        except httpx.HTTPError as exc:
            raise _transport_error(httpx, exc) from None
        try:
            # a connection setup opened (GET /models) is bounded from its first request here
            self._bound(r.extensions.get("network_stream"))
            if r.status_code >= 400:
                raise RequestFailed("http", _error_text(r), r.status_code)
            if not self.s.stream:
                return Answer(r.read())
            return self._first_token(r)
        except httpx.HTTPError as exc:
            r.close()
            raise _transport_error(httpx, exc) from None
        except BaseException:
            r.close()
            raise

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: a connection opened for a request reads under the request
        deadline from its first byte (the reply's headers too)."""
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            self._bound(info.get("return_value"))

    def _bound(self, stream: Any) -> None:
        _bound_reads(stream, self._deadline, self.s.request_timeout_s)

    def _first_token(self, r: Any) -> Pending:
        # a reply that is not an event stream raises httpx_sse.SSEError, an httpx error:
        # _send records it as a "protocol" failure
        events = EventSource(r).iter_sse()
        pending = Pending(r, events, 0.0, chunks=0)
        for text, _usage in _deltas(events, pending):
            if text:
                pending.t_first, pending.chunks = time.perf_counter(), 1
                pending.text.append(text)
                return pending
        r.close()
        _check_finished(pending)
        if not pending.usage_tokens:
            raise RequestFailed("empty", "the stream ended without a content token")
        # tokens that decode to no text (the usage chunk counts them): the answer is whole
        # now, so its first token is not seen apart and decode has nothing left to read
        pending.t_first, pending.events = time.perf_counter(), iter(())
        return pending

    def decode(self, outputs: Pending | Answer) -> StageOutput:
        """The rest of the stream: tokens and the request's inter-token intervals."""
        try:
            if isinstance(outputs, Answer):
                return _parse_answer(outputs.body)
            return self._rest(outputs)
        finally:
            self._deadline.at = None

    def _rest(self, p: Pending) -> StageOutput:
        httpx = self._httpx
        itl: list[float] = []
        last = p.t_first
        try:
            for text, _usage in _deltas(p.events, p):
                if text:
                    now = time.perf_counter()
                    itl.append((now - last) * 1e3)
                    last = now
                    p.chunks += 1
                    p.text.append(text)
        except httpx.HTTPError as exc:
            raise _transport_error(httpx, exc) from None
        finally:
            p.response.close()
        _check_finished(p)
        tokens = p.usage_tokens if p.usage_tokens is not None else p.chunks
        extra: dict[str, Any] = {"chunks": p.chunks, **_percentiles(itl)}
        if p.usage_tokens is not None:
            extra["usage_tokens"] = p.usage_tokens
        return StageOutput("".join(p.text), tokens, extra=extra)

    # --- the unreachable clock
    def _unreachable(self, exc: RequestFailed) -> None:
        if not exc.unreachable:
            self._reachable()  # it answered, with an error
            return
        now = time.monotonic()
        with self._lock:
            if self._unreachable_since is None:
                self._unreachable_since = now
            since = self._unreachable_since
        if now - since >= self.s.unreachable_timeout_s:
            raise RunAbort(
                "server_unreachable",
                f"server unreachable for {now - since:.0f} s (workload.unreachable_timeout_s ="
                f" {self.s.unreachable_timeout_s:g}): {exc}",
            ) from exc

    def _reachable(self) -> None:
        if self._unreachable_since is not None:
            with self._lock:
                self._unreachable_since = None

    # --- the rest of the protocol
    def sync(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        s = self.s.model_dump()
        s.pop("api_key_env", None)  # the variable's name may say whose key: not stored
        return {**s, "model": self.model, "api_key": bool(self._headers), **self._info}

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class _Deadline(threading.local):
    """The monotonic time by which this thread's request must have its last byte (None
    between requests): ``workload.request_timeout_s`` from the request's start."""

    at: float | None = None


def _bound_reads(stream: Any, deadline: _Deadline, timeout_s: float) -> None:
    """Make every read on a connection's network ``stream`` wait at most until the reading
    thread's request deadline, and fail once it has passed: ``request_timeout_s`` is a
    deadline for the whole answer, not a wait per read (a server sending an SSE comment
    every second would otherwise hold a request for ever). The connection keeps the bound
    for its later requests, each read under its own thread's deadline."""
    import httpcore

    if stream is None or getattr(stream, "_soakd_deadline", False):
        return
    read = stream.read

    def late() -> Exception:
        why = f"no whole answer within workload.request_timeout_s = {timeout_s:g} s"
        return httpcore.ReadTimeout(why)

    def bounded(max_bytes: int, timeout: float | None = None) -> bytes:
        at = deadline.at
        if at is None:
            return bytes(read(max_bytes, timeout))
        left = at - time.monotonic()
        if left <= 0:
            raise late()
        try:
            return bytes(read(max_bytes, left if timeout is None else min(timeout, left)))
        except httpcore.ReadTimeout:
            if time.monotonic() >= at:
                raise late() from None
            raise

    stream.read = bounded
    stream._soakd_deadline = True


def _token_count(value: Any, what: str) -> int | None:
    """A server's token count: None when absent, else an int in 0 .. MAX_TOKENS; anything
    else (10**23, -1, "5", true) is a malformed answer, never a number soakd stores."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS:
        return value
    raise RequestFailed("malformed", f"{what} = {str(value)[:40]} is not a token count")


def _check_finished(p: Pending) -> None:
    """A stream that ended before its end (no finish_reason, no usage chunk, no [DONE]: a
    connection closed cleanly mid-answer) is truncated, not a short answer."""
    if not p.finished:
        raise RequestFailed(
            "truncated",
            f"the stream ended after {p.chunks} content chunk(s) without a finish_reason or [DONE]",
        )


def _deltas(events: Iterator[Any], p: Pending) -> Iterator[tuple[str, Any]]:
    """(content text, usage) of each chat.completion.chunk event until ``[DONE]``; the usage
    chunk's ``completion_tokens`` goes to ``p.usage_tokens``. Malformed JSON or a chunk of
    the wrong shape raises ``malformed``."""
    for ev in events:
        data = ev.data
        if data.strip() == "[DONE]":
            p.finished = True
            return
        if not data.strip():
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            raise RequestFailed(
                "malformed", f"not JSON in the event stream: {data[:80]!r}"
            ) from None
        if not isinstance(chunk, dict):
            raise RequestFailed("malformed", f"an event that is not an object: {data[:80]!r}")
        if "error" in chunk:
            raise RequestFailed("http", f"error in the stream: {json.dumps(chunk['error'])[:200]}")
        usage = chunk.get("usage")
        if usage is not None:
            if not isinstance(usage, dict):
                raise RequestFailed("malformed", f"a usage that is not an object: {data[:80]!r}")
            count = _token_count(usage.get("completion_tokens"), "usage.completion_tokens")
            if count is not None:
                p.usage_tokens, p.finished = count, True
        yield _chunk_text(chunk, data, p), usage


def _chunk_text(chunk: dict[str, Any], data: str, p: Pending) -> str:
    """The content text of one chunk's choices; a finish_reason marks the stream whole."""
    choices = chunk.get("choices")
    if choices is None:
        return ""
    if not isinstance(choices, list):
        raise RequestFailed("malformed", f"choices is not a list: {data[:80]!r}")
    text = ""
    for choice in choices:
        if not isinstance(choice, dict):
            raise RequestFailed("malformed", f"a choice that is not an object: {data[:80]!r}")
        delta = choice.get("delta")
        if not isinstance(delta, dict | None):
            raise RequestFailed("malformed", f"a delta that is not an object: {data[:80]!r}")
        content = (delta or {}).get("content")
        if not isinstance(content, str | None):
            raise RequestFailed("malformed", f"delta.content is not text: {data[:80]!r}")
        text += content or ""
        if choice.get("finish_reason") is not None:
            p.finished = True
    return text


def _parse_answer(body: bytes) -> StageOutput:
    try:
        data = json.loads(body)
        text = data["choices"][0]["message"].get("content")
        usage = data.get("usage")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise RequestFailed("malformed", f"not a chat completion: {body[:80]!r}") from None
    if not isinstance(text, str | None) or not isinstance(usage, dict | None):
        raise RequestFailed("malformed", f"not a chat completion: {body[:80]!r}")
    tokens = _token_count((usage or {}).get("completion_tokens"), "usage.completion_tokens")
    if not text and not tokens:
        raise RequestFailed("empty", "the completion has no content")
    return StageOutput(text or "", tokens)


def _error_text(r: Any) -> str:
    try:
        body = r.read()
    except Exception:
        return r.reason_phrase or "error"
    return body.decode("utf-8", "replace").strip()[:300] or (r.reason_phrase or "error")


def _transport_error(httpx: Any, exc: Exception) -> RequestFailed:
    """httpx's exception -> the error kind soakd records."""
    msg = f"{type(exc).__name__}: {exc}".rstrip(": ")
    if isinstance(exc, httpx.TimeoutException):
        return RequestFailed("timeout", msg)
    if isinstance(exc, httpx.ConnectError):
        return RequestFailed("refused", msg)
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return RequestFailed("reset", msg)
    return RequestFailed("protocol", msg)


def build(settings: OpenAIWorkloadSettings, ctx: WorkloadContext) -> OpenAIStaged:
    return OpenAIStaged(settings, ctx)
